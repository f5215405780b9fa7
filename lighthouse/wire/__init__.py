"""The messages between managers and the lighthouse, and the envelope they travel in.

``envelope.py`` (msgpack, the version check, field checks naming the field), ``protocol.py``
(the messages), ``fence.py`` (the commit fence's request and answer), ``replies.py`` (quorum
replies: whole, or an update on an unchanged roster), ``progress.py`` (what heartbeats report)
and ``replica_id.py`` (the one rule for a replica id).
"""
