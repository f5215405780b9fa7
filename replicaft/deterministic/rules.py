"""The deterministic mode's rules: virtual shards, their seeds, and an exact sum of gradients.

In the normal mode the committed update of a step depends on which groups took part: the
average of per-group gradients is a floating-point sum, whose bits change with how the global
batch was split and in what order the partial sums met. So a run with failures ends at other
weights than the same run without them. The deterministic mode (``ManagerOptions.deterministic``)
makes the update a function of the step's global batch alone:

* **Virtual shards.** The global batch of a step (``batch_size`` under ``policy="global"``) is
  cut into ``S`` fixed shards of ``batch_size / S`` consecutive positions
  (:func:`shard_bounds`). Whole shards are dealt to the groups contributing this step, in
  order of replica id (:func:`owned_shards`); a group computes each of its shards' gradients
  on its own (one forward and backward per shard, its RNG seeded by :func:`shard_seed` from
  (seed, step, shard), never by group). A shard's gradient is then the same bits whichever
  group computes it: same weights (every group holds the same state), same samples, same seed,
  same shapes.
* **An exact sum.** Shard gradients are summed in 64-bit fixed point. Per bucket, the largest
  magnitude over every shard of every group is agreed by a MAX all-reduce (a max is exact and
  order-free); it fixes a power-of-two scale ``2**k`` (:func:`scale_exponent`), so encoding
  ``round(x * 2**k)`` multiplies exactly and rounds once. Integers add associatively, so any
  grouping of shards into groups and any reduction order give the same total, bit for bit;
  decoding divides by ``S``, a constant (:func:`decode_mean`).

Overflow is impossible by construction: with ``c = ceil(log2(S))`` the scale is chosen so that
every encoded value has magnitude at most ``2**(62 - c)``, so a sum of ``S`` of them stays
within ``2**62``, below int64's ``2**63 - 1``. The price is a quantisation error of at most
``2**-(k+1)`` per element (:func:`quantisation_bound`), about ``max|g| * 2**(c-62)``: for
``S = 8`` some 2**-59 of the bucket's largest gradient, far below float32's own rounding
(2**-24 relative); the decoded float64 is rounded once more to the gradient's dtype, as the
normal mode's average is.

Rejected alternatives: reducing in float64 is still order-dependent (only less so);
sorting the partial sums before adding needs every group's partials on every group (an
all-gather, S times the bytes); Kahan or pairwise summation narrows the error but does not
remove the dependence on grouping. A non-finite gradient (inf, NaN) has no fixed-point form:
a group that sees one reports an infinite maximum, every group then agrees the bucket is
non-finite and its average becomes NaN everywhere, as a NaN poisons the normal mode's average.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch

from lighthouse.rules.plan import StepPlan
from replicaft.errors import OptionsError

INT_BITS = 62
"""Every sum of encoded values stays within ``2**INT_BITS``, below int64's ``2**63 - 1``."""


def check_shards(batch_size: int, num_shards: int) -> int:
    """The size of each virtual shard; OptionsError unless ``num_shards`` divides the batch.

    Equal shards make the global average the plain mean of the shard gradients (each the
    gradient of its shard's mean loss), with no per-shard weight to round differently."""
    if num_shards < 1:
        raise OptionsError(
            f"virtual_shards={num_shards}; the deterministic mode needs at least 1 "
            "(at least the most groups the job will have)"
        )
    if batch_size % num_shards:
        raise OptionsError(
            f"batch_size={batch_size} is not a multiple of virtual_shards={num_shards}; the "
            f"deterministic mode cuts the global batch into equal shards: use a batch_size of "
            f"{(batch_size // num_shards + 1) * num_shards} or a virtual_shards that divides {batch_size}"
        )
    return batch_size // num_shards


def shard_bounds(cursor: int, batch_size: int, num_shards: int, shard: int) -> tuple[int, int]:
    """Global positions ``[start, stop)`` of virtual shard ``shard`` of the step at ``cursor``."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard={shard}; there are {num_shards} virtual shards")
    size = check_shards(batch_size, num_shards)
    return cursor + shard * size, cursor + (shard + 1) * size


def owned_shards(num_shards: int, contributors: Sequence[str], replica_id: str) -> range:
    """The virtual shards ``replica_id`` computes this step: a contiguous run, dealt in order of
    replica id over the contributors, as evenly as possible (the first ``S mod n`` take one
    more). A group that does not contribute (a healer) takes none; with more contributors than
    shards, those past the ``S``-th take none and contribute zeros (every shard still counts
    once; the job should set ``virtual_shards`` to at least its most groups)."""
    ordered = sorted(contributors)
    if replica_id not in ordered:
        return range(0)
    rank, n = ordered.index(replica_id), min(len(ordered), num_shards)
    if rank >= n:
        return range(0)
    base, extra = divmod(num_shards, n)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def step_shards(plan: StepPlan | None, num_shards: int) -> range:
    """The virtual shards this group computes in the step of ``plan``: none while healing (its
    gradient is replaced by zeros) or without a plan (the step will not commit)."""
    if plan is None or plan.healing:
        return range(0)
    return owned_shards(num_shards, plan.donors, plan.replica_id)


def shard_seed(seed: int, step: int, shard: int) -> int:
    """A 63-bit seed from (seed, step, shard): a shard's randomness (dropout) is the same on
    whichever group computes it, and on a retry of the step."""
    h = hashlib.blake2b(f"{seed}/{step}/shard/{shard}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


def headroom_bits(num_shards: int) -> int:
    """``ceil(log2(S))``: the bits kept free so that ``S`` encoded values cannot overflow."""
    return max(0, (num_shards - 1).bit_length())


def max_abs(tensors: Sequence[torch.Tensor]) -> float:
    """The largest magnitude over ``tensors`` (0.0 for none or empty), ``inf`` if any value is
    not finite: a MAX all-reduce of NaN would depend on the order it met it, of inf does not."""
    best = 0.0
    for t in tensors:
        if t.numel() == 0:
            continue
        if not bool(torch.isfinite(t).all()):
            return math.inf
        best = max(best, float(t.detach().abs().max()))
    return best


def scale_exponent(agreed_max: float, num_shards: int) -> int:
    """``k`` such that every ``|x| <= agreed_max`` encodes to ``|round(x * 2**k)| <= 2**(62 - c)``.

    ``agreed_max = m * 2**e`` with ``0.5 <= m < 1`` (``math.frexp``), so ``|x| * 2**k < 2**(62 - c)``
    for ``k = 62 - c - e``, and rounding reaches at most ``2**(62 - c)``."""
    if not math.isfinite(agreed_max) or agreed_max < 0:
        raise ValueError(f"agreed_max={agreed_max}; a scale needs a finite magnitude (the caller handles inf)")
    if agreed_max == 0.0:
        return 0
    _, e = math.frexp(agreed_max)
    return INT_BITS - headroom_bits(num_shards) - e


def quantisation_bound(agreed_max: float, num_shards: int) -> float:
    """The largest error the fixed-point sum adds to one element of the decoded mean, before
    the final rounding to the gradient's dtype: each shard's encoding is off by at most half a
    unit, ``2**-(k+1)``; ``S`` of them summed and divided by ``S``, still ``2**-(k+1)``."""
    if agreed_max == 0.0:
        return 0.0
    return math.ldexp(1.0, -(scale_exponent(agreed_max, num_shards) + 1))


def _times_power_of_two(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t * 2**k`` in float64, exactly while the result is normal; split in two factors so
    that neither overflows a float64 (``k`` reaches ~1100 for a float64 buffer near 1e-300)."""
    a = k // 2
    return t.to(torch.float64) * math.ldexp(1.0, a) * math.ldexp(1.0, k - a)


def encode(t: torch.Tensor, k: int) -> torch.Tensor:
    """``round(t * 2**k)`` as int64 (round half to even): one rounding, the same on every group."""
    return torch.round(_times_power_of_two(t, k)).to(torch.int64)


def encode_sum(shards: Sequence[torch.Tensor], k: int, like: torch.Tensor) -> torch.Tensor:
    """The int64 sum of the encodings of ``shards`` (zeros shaped as ``like`` for none)."""
    total = torch.zeros(like.shape, dtype=torch.int64, device=like.device)
    for s in shards:
        total += encode(s, k)
    return total


def decode_mean(total: torch.Tensor, k: int, num_shards: int, dtype: torch.dtype) -> torch.Tensor:
    """The mean of the ``num_shards`` shards whose encodings sum to ``total``, in ``dtype``."""
    return (_times_power_of_two(total, -k) / num_shards).to(dtype)
