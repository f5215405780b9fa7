"""A stand-in replica group for the lighthouse integration tests, run as its own process.

It does what a manager does with the lighthouse and nothing else: open a session, then loop
"join the quorum for this step, ask the fence, take a short training step". Everything it
observes is printed to stdout as one JSON object per line, stamped with
``time.monotonic()`` (system-wide on Linux, so the test can compare it with its own clock):

* ``{"event": "registered", "incarnation", "session_epoch"}`` once the first session is open;
* ``{"event": "quorum", "quorum_id", "incarnation", "participants", "step", "session_epoch"}``;
* ``{"event": "fence", "quorum_id", "ok", "reason"}`` after each quorum;
* ``{"event": "notice", "kind", "subject", "quorum_id", "reason", "incarnation"}``;
* ``{"event": "error", "error", "detail"}`` for a retried failure;
* ``{"event": "fatal", "error", "detail"}`` before exiting with code 3.

Usage: ``python tests/support/lighthouse_member.py ADDRESS REPLICA_ID [--token T] [--step-s S]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from lighthouse import LighthouseClient, LighthouseError, LighthouseUnavailable, QuorumTimeout
from lighthouse.tls.files import TlsFiles
from lighthouse.wire.protocol import Notice

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.monotonic(), **fields})
    with _print_lock:
        print(line, flush=True)


def on_notice(notice: Notice) -> None:
    emit(
        "notice",
        kind=notice.kind,
        subject=notice.replica_id,
        quorum_id=notice.quorum_id,
        reason=notice.reason,
        incarnation=notice.incarnation,
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("replica_id")
    p.add_argument("--token", default=None)
    p.add_argument("--step-s", type=float, default=0.05, help="duration of one 'training step'")
    p.add_argument("--quorum-timeout-s", type=float, default=10.0)
    p.add_argument("--heartbeat-interval-s", type=float, default=0.1)
    p.add_argument("--duplicate-patience-s", type=float, default=5.0)
    args = p.parse_args()

    client = LighthouseClient(
        args.address,
        args.replica_id,
        token=args.token,
        tls=TlsFiles.from_env(),
        member_address=f"member-{args.replica_id}",
        heartbeat_interval_s=args.heartbeat_interval_s,
        duplicate_patience_s=args.duplicate_patience_s,
        on_notice=on_notice,
    )
    with client:
        try:
            client.wait_registered(args.quorum_timeout_s)
        except LighthouseError as e:
            emit("fatal", error=type(e).__name__, detail=str(e))
            return 3
        emit(
            "registered",
            incarnation=client.client.incarnation,
            session_epoch=client.client.session_epoch,
        )
        step = 0
        while True:
            try:
                quorum = client.quorum(step, args.quorum_timeout_s)
            except (QuorumTimeout, LighthouseUnavailable) as e:
                emit("error", error=type(e).__name__, detail=str(e))
                continue
            except LighthouseError as e:
                emit("fatal", error=type(e).__name__, detail=str(e))
                return 3
            emit(
                "quorum",
                quorum_id=quorum.quorum_id,
                incarnation=quorum.incarnation,
                participants=list(quorum.replica_ids),
                step=step,
                session_epoch=client.client.session_epoch,
            )
            verdict = client.fence(quorum.quorum_id, step, 5.0)
            emit("fence", quorum_id=quorum.quorum_id, ok=verdict.ok, reason=verdict.reason)
            time.sleep(args.step_s)  # the training step
            if verdict.ok:
                step += 1
            client.record_progress(step)


if __name__ == "__main__":
    sys.exit(main())
