"""The lighthouse server process: a thin asyncio shell around ``lighthouse.rules``.

``grpc_server.py`` (``LighthouseServer``), ``rounds.py`` (its state on the event loop and the
moves of each round), ``session.py`` (session streams and waits), ``delivery.py`` (sending what
the membership decided), ``guards.py`` (what a handler checks first), ``binding.py`` (binding
its port), ``status.py`` (the HTTP status page and ``/metrics``), ``metrics.py``,
``collector.py`` (GC thresholds for a long-lived server) and ``announce.py`` (the line that
tells whoever started it where it serves).
"""
