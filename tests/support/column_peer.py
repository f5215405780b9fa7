"""Rank 1 of a two-rank column group as a real process, for tests/replicaft/column/test_process_group.py.

    python tests/support/column_peer.py --store HOST:PORT --prefix P

Joins the column, prints ``{"event": "joined"}`` and then holds the group open, joining no
operation, until stdin ends: a test SIGKILLs it to show how its peer's wait fails.
"""

from __future__ import annotations

import argparse
import json
import sys

from replicaft.column.process_group import ColumnSpec, FaultTolerantProcessGroup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--prefix", required=True)
    args = p.parse_args()
    column = FaultTolerantProcessGroup("gloo", collective_timeout_s=30.0, connect_timeout_s=30.0)
    column.configure(ColumnSpec(args.store, args.prefix, 1, 2, quorum_id=1))
    print(json.dumps({"event": "joined"}), flush=True)
    sys.stdin.read()
    column.shutdown()


if __name__ == "__main__":
    main()
