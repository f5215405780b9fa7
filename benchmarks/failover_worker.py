"""One process of the failover benchmark: a replica group (replicaft or torchft) or torchft's lighthouse.

``--impl replicaft|torchft`` trains a ~1 MB stack of linear layers as one replica group of one
rank, forever (the benchmark kills it), with a fixed pacing sleep after backward so the steady
step time is known. After every ``optimizer.step()`` it prints one JSON line::

    {"event": "commit", "step": <step after>, "ts": time.time(), "participants": n}
    {"event": "abort",  "step": <step>,       "ts": time.time(), "participants": n, "error": "..."}

An exception escaping the training loop is reported as ``{"event": "crash", "error": ...}`` and
the process exits with code 1: the benchmark counts it as a survivor that did not survive.

``--impl torchft-lighthouse`` runs torchft's Rust lighthouse (the same server as the
``torchft_lighthouse`` CLI, with the CLI's defaults unless told otherwise) on a free loopback
port, prints ``{"event": "lighthouse", "address": "http://127.0.0.1:PORT"}`` and serves until
its stdin closes or it is killed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

HIDDEN = 256
LAYERS = 4
BATCH = 32


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def build_model() -> Any:
    """LAYERS x Linear(HIDDEN, HIDDEN): 4 * 65,792 float32 parameters, about 1 MB."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(HIDDEN, HIDDEN), nn.ReLU())])


def run_torchft_lighthouse(args: argparse.Namespace) -> None:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=args.quorum_tick_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    # address() names the host ("http://vm:PORT"); the groups dial loopback explicitly.
    port = server.address().rsplit(":", 1)[1]
    emit("lighthouse", address=f"http://127.0.0.1:{port}")
    sys.stdin.read()  # until the benchmark closes our stdin or kills us
    server.shutdown()


def train_replicaft(args: argparse.Namespace) -> None:
    import torch

    import replicaft

    model = build_model()
    x = torch.randn(BATCH, HIDDEN, generator=torch.Generator().manual_seed(1))
    options = replicaft.ManagerOptions(
        lighthouse=args.lighthouse,
        replica_id=args.replica_id,
        digest_every_steps=args.digest_every_steps,
        events_dir=args.events_dir,
    )
    with replicaft.Manager(options, init_sync=False) as manager:
        ddp = replicaft.DistributedDataParallel(manager, model)
        opt = replicaft.Optimizer(manager, torch.optim.SGD(model.parameters(), lr=1e-3))
        emit("ready")
        while True:
            opt.zero_grad()
            ddp(x).square().mean().backward()
            time.sleep(args.step_sleep)
            committed = opt.step()
            ts = time.time()
            report(committed, manager.current_step(), ts, manager.num_participants(), manager.errored())


def train_torchft(args: argparse.Namespace) -> None:
    import torch
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    model = build_model()
    x = torch.randn(BATCH, HIDDEN, generator=torch.Generator().manual_seed(1))
    inner = torch.optim.SGD(model.parameters(), lr=1e-3)
    # torchft's Manager connects to an existing group store; with W=1 the group hosts its own.
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        replica_id=args.replica_id,
        lighthouse_addr=args.lighthouse,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        hostname="127.0.0.1",
        init_sync=False,
    )
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    emit("ready")
    while True:
        opt.zero_grad()
        ddp(x).square().mean().backward()
        time.sleep(args.step_sleep)
        before = manager.current_step()
        opt.step()
        ts = time.time()
        step = manager.current_step()
        report(step > before, step, ts, manager.num_participants(), manager.errored())


def report(committed: bool, step: int, ts: float, participants: int, error: Exception | None) -> None:
    if committed:
        emit("commit", step=step, ts=ts, participants=participants)
    else:
        first_line = str(error).strip().splitlines()[0][:300] if error is not None else "not committed"
        emit("abort", step=step, ts=ts, participants=participants, error=f"{type(error).__name__}: {first_line}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["replicaft", "torchft", "torchft-lighthouse"], required=True)
    p.add_argument("--lighthouse", help="replicaft: host:port; torchft: http://host:port")
    p.add_argument("--replica-id", help="this group's name, g0, g1, ...")
    p.add_argument("--step-sleep", type=float, default=0.08, help="pacing sleep after backward, seconds")
    p.add_argument("--events-dir", help="replicaft: where the manager writes its event log")
    p.add_argument(
        "--digest-every-steps",
        type=int,
        default=0,
        help="replicaft: a state digest in the events every N steps (0: none, the timing runs)",
    )
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--join-timeout-ms", type=int, default=60000, help="torchft_lighthouse CLI default")
    p.add_argument("--quorum-tick-ms", type=int, default=100, help="torchft_lighthouse CLI default")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=5000, help="torchft_lighthouse CLI default")
    args = p.parse_args()
    if args.impl == "torchft-lighthouse":
        run_torchft_lighthouse(args)
        return 0
    import torch

    torch.set_num_threads(1)
    try:
        (train_replicaft if args.impl == "replicaft" else train_torchft)(args)
    except BaseException as e:  # noqa: BLE001 - a survivor's crash is a measurement, reported then fatal
        traceback.print_exc()
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{'/'.join(frame.filename.split('/')[-2:])}:{frame.lineno} in {frame.name}: {frame.line}"
        emit("crash", error=f"{type(e).__name__}: {str(e).strip()[:500]}", where=where, ts=time.time())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
