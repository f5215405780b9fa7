"""etcd for the replicated lighthouse: a small client of etcd's v3 gRPC API (wire.py, client.py).

Torch-free and dependency-free beyond grpcio, which the lighthouse already uses: see
client.py for why the client is our own.
"""
