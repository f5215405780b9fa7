"""A replica group's own coordination: its ranks' calls of a step made into one request to the
lighthouse and one decision (rounds.py), held by group rank 0 (coordinator.py), reached
in-process by rank 0 and over gRPC by the others (client.py, server.py, protocol.py)."""
