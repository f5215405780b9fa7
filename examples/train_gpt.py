"""A GPT-style language model trained fault-tolerantly: one replica group of a data-parallel job.

Run several copies (one per group) against one lighthouse; the launcher does that for you::

    replicaft-launch --groups 3 examples/train_gpt.py --steps 300 --threads 1

Measured that way (3 groups on a shared, loaded 2-core machine, ``--steps 200``, one group
SIGKILLed at step 81 and restarted by the launcher): the held-out loss fell from 2.61 at step
25 to 2.41, 2.28, 2.18, 2.13, 2.04, 2.00 and 1.99 at step 200 (uniform over bytes is 5.55),
at 2,000-5,000 tokens/s for the whole job, in a little over 3 minutes; the restarted group
healed 15.7 MB from both survivors in 0.1 s and every committed step had identical digests.

**Corpus.** The Python standard library's own source: every ``*.py`` file under
``sysconfig.get_paths()["stdlib"]`` (site-packages and the test suites left out), read in
sorted order and concatenated, about 12 MB on CPython 3.11. It is on every machine that has
Python, so the example needs no download, and it is real text with long-range structure
(indentation, names defined far above their use). Tokens are bytes (a vocabulary of 256):
a deterministic tokenizer with nothing to build, ship or download. Every group must read the
same bytes, so the corpus digest is printed at start and travels with a heal as registered
state; a group whose Python has a different standard library refuses to load a peer's state
(run every group with the same Python version).

**Data, exactly once.** The training set is the corpus cut into fixed, non-overlapping
windows of ``context + 1`` tokens (input and the target shifted by one); the last 1% of the
corpus is held out for evaluation. ``ExactlyOnceSampler`` hands each contributing group its
share of the step's windows from one seeded global order, and its cursor travels with heals,
so across any failures every window trains in exactly one committed step.

**Optimisation.** AdamW (weight decay on matrices only, as GPT-2 and nanoGPT do), a
``LambdaLR`` of linear warm-up then cosine decay to ``--min-lr-ratio`` of the peak, which
advances only on committed steps (``replicaft.Optimizer`` steps the scheduler on commit, and
its position travels with a heal), and gradient clipping by global norm.

**Model size.** The defaults (4 layers, 4 heads, d_model 160, context 128, 8 windows per
group per step: 1.3M parameters, 1,024 tokens per group per step) train visibly within
minutes on a 2-core CPU shared by three groups (pass ``--threads 1`` there: one intra-op
thread per process beats several processes fighting over the same cores). The parameter count
is about ``12 * layers * d_model**2`` plus the embeddings; for larger runs::

    --layers 6  --heads 8  --d-model 384 --context 256   # 10.8M parameters
    --layers 8  --heads 8  --d-model 512 --context 512   # 25.6M
    --layers 12 --heads 12 --d-model 768 --context 1024  # 86.0M (GPT-2 small's shape, byte vocabulary)

The script prints the exact count at start. It runs on the CPU only (no device placement),
so those sizes want many cores; raise ``--batch-size`` with the model, the lighthouse's
``--progress-timeout`` above the time of one forward pass, and ``REPLICAFT_HEAL_TIMEOUT_S``
if a heal of the larger state (parameters and two AdamW moments, 12 bytes per parameter)
takes more than 30 s on your network.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import replicaft
from replicaft.data import ExactlyOnceSampler, Share

VOCAB_SIZE = 256
"""Byte-level tokens."""
HOLDOUT_FRACTION = 0.01
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "__pycache__"})
"""Left out of the corpus: installed packages differ from machine to machine, and the test
suites hold generated and deliberately malformed files that are not representative text."""


# -- corpus ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Corpus:
    tokens: torch.Tensor
    """uint8 bytes of every file, in sorted path order."""
    num_files: int
    digest: str
    """SHA-256 prefix of the bytes: groups must agree on it."""


def load_stdlib_corpus(root: Path | None = None, max_bytes: int = 0) -> Corpus:
    """Concatenate the standard library's ``*.py`` files in sorted order (deterministic).

    ``max_bytes`` > 0 keeps only the first bytes, for quick experiments.
    """
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    paths: list[Path] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in EXCLUDED_DIRS]
        paths += [Path(directory, f) for f in files if f.endswith(".py")]
    paths.sort(key=lambda p: p.relative_to(root).as_posix())
    if not paths:
        raise FileNotFoundError(f"no *.py files under {root}; is this Python's standard library installed?")
    data = b"".join(p.read_bytes() for p in paths)
    if max_bytes > 0:
        data = data[:max_bytes]
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return Corpus(tokens, len(paths), hashlib.sha256(data).hexdigest()[:16])


class Windows:
    """Non-overlapping windows of ``context + 1`` tokens over a slice of the corpus."""

    def __init__(self, tokens: torch.Tensor, context: int) -> None:
        self.context = context
        self.count = (len(tokens) - 1) // context
        if self.count < 1:
            raise ValueError(f"{len(tokens)} tokens do not fill one window of context {context}; lower --context")
        self._tokens = tokens

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, both ``(len(ids), context)`` int64."""
        starts = torch.tensor(ids, dtype=torch.int64) * self.context
        rows = self._tokens[starts[:, None] + torch.arange(self.context + 1)].long()
        return rows[:, :-1], rows[:, 1:]


# -- model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GPTConfig:
    layers: int
    heads: int
    d_model: int
    context: int
    vocab_size: int = VOCAB_SIZE


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each residual."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only language model with learned positions and tied input/output embeddings."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        if c.d_model % c.heads:
            raise ValueError(f"--d-model {c.d_model} is not divisible by --heads {c.heads}")
        self.config = c
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.context, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance
        # from growing with depth.
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- optimisation ---------------------------------------------------------------------------


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices (weights, embeddings), not biases or LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight appears once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier: linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


@torch.no_grad()
def evaluate(model: nn.Module, held_out: Windows, num_windows: int) -> float:
    """Mean loss over the first ``num_windows`` held-out windows (the same ones every time).

    Runs the inner module, not the DDP wrapper, so no gradient hook or collective is involved.
    """
    model.eval()
    x, y = held_out.batch(list(range(min(num_windows, held_out.count))))
    loss = lm_loss(model(x), y).item()
    model.train()
    return loss


class Progress:
    """Mean training loss and tokens/s over the committed steps since the last report.

    Tokens/s counts two ways: this group's own samples (none while it heals), and the whole
    job's (every contributing group's share of each step), so the second shows what the job
    as a whole makes of the machine whichever groups are up.
    """

    def __init__(self, context: int) -> None:
        self.context = context
        self._reset()

    def _reset(self) -> None:
        self.started = time.monotonic()
        self.group_tokens = 0
        self.job_tokens = 0
        self.losses: list[float] = []

    def record(self, share: Share, loss: float) -> None:
        """A committed step: ``share`` is this group's part of it, ``loss`` its local loss."""
        self.group_tokens += share.num_samples * self.context
        self.job_tokens += (share.step_stop - share.step_start) * self.context
        if share.num_samples:
            self.losses.append(loss)

    def report(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        mean = f"{sum(self.losses) / len(self.losses):.4f}" if self.losses else "-"
        line = f"loss {mean} tok/s group {self.group_tokens / elapsed:,.0f} job {self.job_tokens / elapsed:,.0f}"
        self._reset()
        return line


# -- training -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lighthouse", help="host:port of the lighthouse (default: $REPLICAFT_LIGHTHOUSE)")
    p.add_argument("--replica-id", help="this group's name (default: $REPLICAFT_REPLICA_ID)")
    p.add_argument("--steps", type=int, default=300, help="committed steps to train for (the cosine ends here)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=160)
    p.add_argument("--context", type=int, default=128, help="tokens (bytes) per window")
    p.add_argument("--batch-size", type=int, default=8, help="windows per group per step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final LR as a fraction of the peak")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0, help="max global gradient norm (0: no clipping)")
    p.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="every N committed steps, print the mean training loss since the last print and tokens/s",
    )
    p.add_argument("--eval-every", type=int, default=50, help="held-out loss every N committed steps (0: never)")
    p.add_argument("--eval-windows", type=int, default=32)
    p.add_argument("--corpus-bytes", type=int, default=0, help="use only the first N bytes of the corpus (0: all)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default, one per core)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 1 or args.log_every < 1 or args.batch_size < 1:
        p.error("--steps, --warmup-steps, --log-every and --batch-size must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = replicaft.ManagerOptions.from_env(lighthouse=args.lighthouse, replica_id=args.replica_id)
    except replicaft.OptionsError as e:
        print(f"train_gpt: error: {e}", file=sys.stderr)
        return 2
    rid = options.replica_id
    if args.threads:
        torch.set_num_threads(args.threads)

    corpus = load_stdlib_corpus(max_bytes=args.corpus_bytes)
    split = int(len(corpus.tokens) * (1 - HOLDOUT_FRACTION))
    train, held_out = Windows(corpus.tokens[:split], args.context), Windows(corpus.tokens[split:], args.context)
    torch.manual_seed(0)  # every group starts from the same weights (a heal would align them anyway)
    model = GPT(GPTConfig(args.layers, args.heads, args.d_model, args.context))
    print(
        f"[{rid}] corpus {corpus.num_files} files, {len(corpus.tokens):,} bytes (digest {corpus.digest}); "
        f"{train.count:,} training windows of {args.context}; "
        f"model {sum(p.numel() for p in model.parameters()):,} parameters",
        flush=True,
    )

    with replicaft.Manager(options) as manager:
        manager.register_state("corpus", lambda: {"digest": corpus.digest}, lambda s: check_corpus(s, corpus))
        ddp = replicaft.DistributedDataParallel(manager, model)
        inner = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            inner, warmup_cosine(args.warmup_steps, args.steps, args.min_lr_ratio)
        )
        optimizer = replicaft.Optimizer(manager, inner, scheduler)
        sampler = ExactlyOnceSampler(manager, train.count, args.batch_size)
        progress = Progress(args.context)
        while manager.current_step() < args.steps:
            optimizer.zero_grad()
            # A healer's gradient is replaced by zeros, but it still runs the step (any batch)
            # so that its collectives line up with the donors'.
            ids = sampler.step_indices() or list(range(args.batch_size))
            x, y = train.batch(ids)
            loss = lm_loss(ddp(x), y)
            loss.backward()
            # The DDP wrapper all-reduces in the backward hooks and waits for every bucket at
            # the end of backward, so here the gradients are already the average over the
            # contributing groups: the norm is the same in every group (healers included), and
            # so is the clipped update. Clipping each group's local gradient before the
            # average would instead scale groups differently. A healer that later replays
            # this step replays the clipped gradients, captured at commit time.
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm).item() if args.clip_norm else 0.0
            manager.annotate_commit(loss=loss.item(), grad_norm=grad_norm)
            share, lr = sampler.share(), scheduler.get_last_lr()[0]
            if not optimizer.step():
                continue
            progress.record(share, loss.item())
            step = manager.current_step()
            if step % args.log_every == 0:
                print(
                    f"[{rid}] step {step} {progress.report()} lr {lr:.2e} grad_norm {grad_norm:.3f} "
                    f"groups {manager.num_participants()}",
                    flush=True,
                )
            if args.eval_every and step % args.eval_every == 0:
                print(
                    f"[{rid}] step {step} held-out loss {evaluate(model, held_out, args.eval_windows):.4f}", flush=True
                )
    return 0


def check_corpus(state: dict[str, Any], corpus: Corpus) -> None:
    """Refuse a peer's state trained on other bytes (a different Python's standard library)."""
    if state["digest"] != corpus.digest:
        raise replicaft.OptionsError(
            f"the peer's corpus digest is {state['digest']}, this group's is {corpus.digest}: the groups read "
            f"different standard libraries (this one: {sysconfig.get_paths()['stdlib']}, Python "
            f"{sys.version.split()[0]}); run every group with the same Python version"
        )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except replicaft.GroupBroken as e:  # a rank of this group died, or a failed heal left no one to heal from
        print(f"train_gpt: {e}", file=sys.stderr)
        sys.exit(1)
