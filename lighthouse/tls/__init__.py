"""TLS for every channel of a job: one set of files, checked once, turned into each kind of context.

``files.py`` (``TlsFiles`` and the gRPC channels and ports made from it) and
``throwaway_ca.py`` (a CA and a job certificate for a job on one machine or a test).
"""
