"""One replica group of torchft 0.2.0's own DiLoCo on the GPT example: the benchmark's baseline.

The same model, corpus, inner AdamW, outer Nesterov SGD and batch as ``examples/train_diloco.py``,
driven by torchft's ``Manager`` and ``torchft.local_sgd.DiLoCo`` (which syncs from the inner
optimizer's step hook). torchft has no exactly-once data: group ``r`` of ``n`` reads every
``n``-th batch of the same global order, as torchft's ``DistributedSampler`` shards it.
Prints a JSON line per committed sync, as train_diloco.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

# Run as a script, its own folder (benchmarks/, which has a lighthouse.py) would shadow the
# lighthouse package: the examples and the repository root go there instead.
sys.path[0:1] = [str(Path(__file__).resolve().parent.parent / "examples"), str(Path(__file__).resolve().parent.parent)]
from torchft import Manager, ProcessGroupGloo  # noqa: E402
from torchft.checkpointing.pg_transport import PGTransport  # noqa: E402
from torchft.local_sgd import DiLoCo  # noqa: E402
from train_diloco import OUTER_LR, OUTER_MOMENTUM  # noqa: E402
from train_gpt import (  # noqa: E402
    GPT,
    HOLDOUT_FRACTION,
    GPTConfig,
    Windows,
    evaluate,
    lm_loss,
    load_stdlib_corpus,
    param_groups,
)

from replicaft.data import sample_ids  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True, help="this group's address (its network namespace)")
    p.add_argument("--rank", type=int, required=True, help="this group's index, for its data shard")
    p.add_argument("--groups", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--sync-every", type=int, default=20)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=160)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--outer-lr", type=float, default=OUTER_LR, help="as examples/train_diloco.py's")
    p.add_argument("--outer-momentum", type=float, default=OUTER_MOMENTUM)
    p.add_argument("--eval-windows", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    corpus = load_stdlib_corpus()
    split = int(len(corpus.tokens) * (1 - HOLDOUT_FRACTION))
    train, held_out = Windows(corpus.tokens[:split], args.context), Windows(corpus.tokens[split:], args.context)
    torch.manual_seed(0)
    model = GPT(GPTConfig(args.layers, args.heads, args.d_model, args.context))
    inner = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95))
    outer = torch.optim.SGD(
        model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum, nesterov=args.outer_momentum > 0
    )
    store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=60))
    # torchft's default HTTP transport advertises socket.gethostname(), which inside a network
    # namespace resolves to no address of it; its process-group transport uses the Gloo link.
    transport = PGTransport(pg, timeout=timedelta(seconds=60), device=torch.device("cpu"))
    manager = Manager(
        pg=pg,
        checkpoint_transport=transport,
        min_replica_size=1,
        use_async_quorum=False,
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), inner.load_state_dict(s["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        replica_id=os.environ["REPLICA_GROUP_ID"],
        store_addr=args.host,
        store_port=store.port,
        rank=0,
        world_size=1,
        hostname=args.host,
        port=0,
        timeout=timedelta(seconds=60),
        quorum_timeout=timedelta(seconds=120),
        connect_timeout=timedelta(seconds=30),
    )
    started, tokens, batch = time.monotonic(), 0, 0
    with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every, backup_device=torch.device("cpu")):
        while time.monotonic() - started < args.seconds:
            first = ((batch * args.groups + args.rank) * args.batch_size) % (train.count - args.batch_size)
            x, y = train.batch(sample_ids(first, first + args.batch_size, train.count, 0))
            loss = lm_loss(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            step = manager.current_step()
            inner.step()
            inner.zero_grad()
            tokens += x.numel()
            batch += 1
            if manager.current_step() != step:
                print(
                    json.dumps(
                        {
                            "event": "sync",
                            "step": manager.current_step(),
                            "loss": round(loss.item(), 4),
                            "tokens": tokens,
                            "seconds": round(time.monotonic() - started, 3),
                            "held_out_loss": round(evaluate(model, held_out, args.eval_windows), 4),
                        }
                    ),
                    flush=True,
                )
    print(json.dumps({"event": "final", "tokens": tokens, "seconds": round(time.monotonic() - started, 3)}), flush=True)
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
