"""The column: the cross-group collectives of one group rank.

Column ``r`` joins rank ``r`` of every group in the quorum. ``process_group.py`` holds its
torch.distributed group, rebuilt per quorum and abandoned (never aborted in place) when hung;
``flag.py`` exchanges the step's "ok" flag between the column's ranks over sockets of its own.
"""
