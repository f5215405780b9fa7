"""The lighthouse's decisions, as pure code that takes the time as an argument.

``quorum.py`` (the quorum rule), ``membership.py`` (the state machine: sessions, heartbeats,
joins, losses, quorums) with ``members.py`` and ``waits.py``, ``liveness.py`` (when silence
means hung), ``plan.py`` (the step plan every manager derives from a quorum),
``commit_lease.py`` and ``standing.py`` (when a group may commit, and a quorum stand, without
a round). No I/O: the server around them is ``lighthouse.server.grpc_server``.
"""
