"""The GPT example trained with DiLoCo: groups train alone for H inner steps, then sync.

Run several copies (one per group) against one lighthouse, as with the other examples::

    replicaft-launch --groups 3 examples/train_diloco.py --syncs 30 --sync-every 20 --threads 1

Each group runs AdamW (linear LR warm-up over its first ``--warmup-steps`` inner steps) on its
own leased samples (exactly once across failures) for ``--sync-every`` inner steps; at a sync the pseudo-gradient
(weights at the last sync minus
now) is averaged across the quorum and an outer SGD with Nesterov momentum applies it
(``replicaft.local_sgd.DiLoCo``). ``--fragments F`` syncs the model in F pieces at staggered
steps (streaming DiLoCo), ``--delay`` overlaps each piece's all-reduce with that many inner
steps, ``--wire bf16|int8`` sends reduced-precision pseudo-gradients, ``--local-sgd`` averages
the weights instead (LocalSGD). A SIGKILLed group restarts, waits for the others' next sync,
heals the whole DiLoCo state from them and trains on.

Every committed sync prints a JSON line (``{"event": "sync", ...}``) with the mean inner loss
of the round and the tokens this group trained; the last line, ``{"event": "final", ...}``,
carries the digest of the replicated state (equal across groups) and the held-out loss.
The model, corpus and options are the GPT example's (``examples/train_gpt.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_gpt import (
    GPT,
    HOLDOUT_FRACTION,
    GPTConfig,
    Windows,
    check_corpus,
    evaluate,
    lm_loss,
    load_stdlib_corpus,
    param_groups,
)
from train_hsdp import init_group_process_group

import replicaft
from replicaft.local_sgd import WIRES, DiLoCo, LocalSGD
from replicaft.wrappers.fsdp import shard_optimizer_state

OUTER_LR = 0.5
OUTER_MOMENTUM = 0.7
"""The outer SGD's defaults, from a sweep of this example (three groups, H = 20 and 100): the
DiLoCo paper's 0.7 and 0.9 (tuned for H = 500 and eight replicas) overshoot here; held-out
loss after 61k tokens at H = 20, 2.45 with those against 2.32 with these (2.32 with plain
averaging, 1.0 and 0; 2.35 with 0.4 and 0.9; 2.36 with 0.7 and 0.5), after 215k tokens 2.29
against 2.16; at H = 100 after 230k tokens 2.31 against 2.25 (benchmarks/diloco.py, README)."""


def fragments_of(model: GPT, count: int) -> list[nn.Module]:
    """``count`` consecutive slices of the model, each a module; the embeddings (tied to the
    output head) go with the first, the final LayerNorm with the last."""
    blocks = list(model.blocks)
    if not 1 <= count <= len(blocks):
        raise replicaft.OptionsError(
            f"--fragments {count}: use 1 to {len(blocks)} (the model has {len(blocks)} blocks)"
        )
    per = -(-len(blocks) // count)
    pieces: list[list[nn.Module]] = [blocks[i : i + per] for i in range(0, len(blocks), per)]
    pieces[0] = [model.tok, model.pos, *pieces[0]]
    pieces[-1] = [*pieces[-1], model.ln_f]
    return [nn.ModuleList(p) for p in pieces]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lighthouse", help="host:port of the lighthouse (default: $REPLICAFT_LIGHTHOUSE)")
    p.add_argument("--replica-id", help="this group's name (default: $REPLICAFT_REPLICA_ID)")
    p.add_argument("--syncs", type=int, default=30, help="committed syncs to train for (manager steps)")
    p.add_argument(
        "--seconds", type=float, default=0.0, help="also stop after this many seconds of training (0: no limit)"
    )
    p.add_argument("--sync-every", type=int, default=20, help="inner steps between two syncs of a fragment (H)")
    p.add_argument("--fragments", type=int, default=1, help="streaming DiLoCo: sync the model in this many pieces")
    p.add_argument("--delay", type=int, default=0, help="inner steps each fragment's all-reduce overlaps (tau)")
    p.add_argument("--alpha", type=float, default=0.0, help="fragment_update_alpha: mix of local into synced weights")
    p.add_argument("--wire", choices=WIRES, default="fp32", help="pseudo-gradient format on the wire")
    p.add_argument("--local-sgd", action="store_true", help="average the weights (LocalSGD) instead of DiLoCo")
    p.add_argument("--outer-lr", type=float, default=OUTER_LR, help="outer SGD learning rate")
    p.add_argument("--outer-momentum", type=float, default=OUTER_MOMENTUM, help="outer SGD Nesterov momentum (0: none)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=160)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="windows per inner step")
    p.add_argument("--lr", type=float, default=2e-3, help="inner AdamW learning rate")
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=20,
        help="inner steps of linear LR warm-up, as train_gpt.py's; a restarted group, whose AdamW "
        "starts afresh, warms up again",
    )
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=0, help="held-out loss in the sync line every N syncs (0: never)")
    p.add_argument("--corpus-bytes", type=int, default=0, help="use only the first N bytes of the corpus (0: all)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard the model with FSDP2 over the group's ranks (one here): its parameters become DTensors, "
        "as torchtitan's always are",
    )
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work per inner step (test pacing)")
    args = p.parse_args(argv)
    if args.syncs < 1 or args.batch_size < 1 or args.warmup_steps < 1:
        p.error("--syncs, --batch-size and --warmup-steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = replicaft.ManagerOptions.from_env(lighthouse=args.lighthouse, replica_id=args.replica_id)
    except replicaft.OptionsError as e:
        print(f"train_diloco: error: {e}", file=sys.stderr)
        return 2
    # DiLoCo's sync digests (on each commit event) cover the state the groups share; the
    # manager's per-step digest would also cover each group's own inner optimizer.
    options = dataclasses.replace(options, digest_every_steps=0)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = load_stdlib_corpus(max_bytes=args.corpus_bytes)
    split = int(len(corpus.tokens) * (1 - HOLDOUT_FRACTION))
    train, held_out = Windows(corpus.tokens[:split], args.context), Windows(corpus.tokens[split:], args.context)
    torch.manual_seed(0)
    model = GPT(GPTConfig(args.layers, args.heads, args.d_model, args.context))
    if args.fsdp:
        init_group_process_group(options)
        mesh = init_device_mesh("cpu", (options.group_world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    inner = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    if args.fsdp:
        shard_optimizer_state(inner)  # a checkpoint's plain moments become DTensors again
    data = {"dataset_len": train.count, "batch_size": args.batch_size}
    # No heal at step 0: DiLoCo's join sync hands every group the first one's weights itself,
    # so no group spends the first round waiting for a heal (replicaft/local_sgd/diloco.py).
    with replicaft.Manager(options, init_sync=False) as manager:
        manager.register_state("corpus", lambda: {"digest": corpus.digest}, lambda s: check_corpus(s, corpus))
        if args.local_sgd:
            algo: DiLoCo = LocalSGD(manager, model, inner, args.sync_every, wire=args.wire, **data)
        else:
            outer = torch.optim.SGD(
                model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum, nesterov=args.outer_momentum > 0
            )
            algo = DiLoCo(
                manager,
                fragments_of(model, args.fragments),
                inner,
                outer,
                args.sync_every,
                fragment_sync_delay=args.delay,
                fragment_update_alpha=args.alpha,
                wire=args.wire,
                **data,
            )
        with algo:
            started = time.monotonic()
            tokens = inner_steps = 0
            while manager.current_step() < args.syncs and not (
                args.seconds and time.monotonic() - started > args.seconds
            ):
                x, y = train.batch(algo.batch_indices())
                loss = lm_loss(model(x), y)
                loss.backward()
                if args.clip_norm:
                    nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
                algo.observe_loss(loss.item())
                if args.step_delay:
                    time.sleep(args.step_delay)
                step = manager.current_step()
                for group in inner.param_groups:
                    group["lr"] = args.lr * min(1.0, (inner_steps + 1) / args.warmup_steps)
                inner.step()  # counts the inner step; the step that completes a round syncs
                inner.zero_grad()
                tokens += x.numel()
                inner_steps += 1
                if manager.current_step() != step:
                    line = {
                        "event": "sync",
                        "replica_id": options.replica_id,
                        "step": manager.current_step(),
                        "loss": round(loss.item(), 4),
                        "tokens": tokens,
                        "seconds": round(time.monotonic() - started, 3),
                        "retried": algo.syncs_retried,
                    }
                    if args.eval_every and manager.current_step() % args.eval_every == 0:
                        line["held_out_loss"] = round(evaluate(model, held_out, args.eval_windows), 4)
                    print(json.dumps(line), flush=True)
        print(
            json.dumps(
                {
                    "event": "final",
                    "replica_id": options.replica_id,
                    "step": manager.current_step(),
                    "digest": algo.state_digest(),
                    "held_out_loss": round(evaluate(model, held_out, args.eval_windows), 4),
                    "tokens": tokens,
                    "seconds": round(time.monotonic() - started, 3),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except replicaft.GroupBroken as e:
        print(f"train_diloco: {e}", file=sys.stderr)
        sys.exit(1)
