"""The lighthouse's client, as a replica group's manager holds it.

``async_client.py`` (``AsyncLighthouseClient``, on asyncio) and ``blocking_client.py`` (its
facade for threads), with ``asks.py`` (the one quorum request in flight), ``channels.py`` (which
lighthouse to talk to next), ``connections.py`` (the gRPC channel to each and the calls on them)
and ``stream_writer.py`` (writes and heartbeats on a session).
"""
