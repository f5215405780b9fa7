"""The replicated lighthouse: several lighthouses, one leading while it holds an etcd lease.

``server.py`` (``ReplicatedLighthouse``), ``leadership.py`` (the lease rule) and ``etcd/`` (the
etcd v3 client it speaks through).
"""
