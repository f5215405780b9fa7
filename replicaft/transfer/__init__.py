"""Peer-to-peer state transfer: snapshot, manifest, state server, striped heal client."""
