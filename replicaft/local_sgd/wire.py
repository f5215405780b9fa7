"""How a pseudo-gradient travels: fp32, bf16, or 8-bit codes packed three to a float32 word.

Pure tensor arithmetic, no communication (reduce.py drives the all-reduces). The manager's
all-reduce averages in the tensor's own dtype, so:

* ``fp32`` sends 4 bytes per value; ``bf16`` sends 2 (its 8-bit mantissa is the loss).
* ``int8`` sends 4/3 bytes per value. Integer tensors cannot go through an averaging
  all-reduce (the division would need a float result), and a plain int8 sum of N groups
  overflows, so each group quantizes to an integer code in ``[0, 2b]`` with ``b = 127 // N``
  against a scale shared by every group (the largest magnitude in each chunk of
  ``CHUNK`` values, over all groups, exchanged first in a tiny all-reduce), and packs three
  codes into the three low bytes of a float32 word. A float32 holds every integer below
  2**24 exactly, the N codes of a byte sum to at most ``2b*N <= 254`` so no byte carries into
  the next, and the average times N rounds back to the exact integer sum. The price is
  resolution: ``2b + 1`` levels per chunk (85 with three groups) instead of 255, which is what
  the benchmark's loss figure measures. A group contributing zeros (a healer) adds nothing to
  any byte, so the bias is removed per contributor, not per participant.
"""

from __future__ import annotations

from typing import Literal

import torch

from replicaft.errors import OptionsError

Wire = Literal["fp32", "bf16", "int8"]
WIRES: tuple[Wire, ...] = ("fp32", "bf16", "int8")
BYTES_PER_VALUE: dict[Wire, float] = {"fp32": 4.0, "bf16": 2.0, "int8": 4.0 / 3.0}
CHUNK = 4096
"""Values sharing one int8 scale: the scale exchange costs N * 4 / CHUNK bytes per value."""
_LANES = 3
_LANE = 256


def check_wire(wire: str) -> Wire:
    if wire not in WIRES:
        raise OptionsError(f"wire={wire!r}; pseudo-gradients travel as one of {', '.join(WIRES)}")
    return wire  # type: ignore[return-value]


def lane_bias(num_contributors: int) -> int:
    """The code offset ``b``: codes are in [0, 2b] so that N of them sum below 256."""
    if not 1 <= num_contributors <= 127:
        raise OptionsError(
            f"int8 pseudo-gradients need 1 to 127 contributing groups, not {num_contributors}: each byte of "
            "the packed sum holds 2b*N <= 254; use wire='bf16' for more groups"
        )
    return 127 // num_contributors


def chunk_max(values: torch.Tensor) -> torch.Tensor:
    """The largest magnitude in each chunk of ``CHUNK`` values (float32, one per chunk)."""
    padded = _pad(values.float(), CHUNK)
    return padded.abs().reshape(-1, CHUNK).amax(dim=1)


def scales_from_max(global_max: torch.Tensor, bias: int) -> torch.Tensor:
    """Per-chunk step size so the largest value maps to the code ``2b`` (or 0)."""
    return torch.where(global_max > 0, global_max / bias, torch.ones_like(global_max))


def encode_int8(values: torch.Tensor, scales: torch.Tensor, bias: int) -> torch.Tensor:
    """Codes in [0, 2b] for ``values``, packed three per float32 word."""
    n = values.numel()
    x = _pad(values.float(), CHUNK).reshape(-1, CHUNK) / scales[:, None]
    codes = (torch.round(x).clamp_(-bias, bias) + bias).reshape(-1)[:n]
    codes = _pad(codes, _LANES).reshape(-1, _LANES)
    return codes[:, 0] + codes[:, 1] * _LANE + codes[:, 2] * (_LANE * _LANE)


def decode_int8(
    averaged_words: torch.Tensor, scales: torch.Tensor, bias: int, num_contributors: int, numel: int
) -> torch.Tensor:
    """The average of the contributors' values from the averaged packed words."""
    words = torch.round(averaged_words.double() * num_contributors).long()
    lanes = torch.stack([words % _LANE, (words // _LANE) % _LANE, words // (_LANE * _LANE)], dim=1).reshape(-1)
    sums = lanes[:numel].double() - bias * num_contributors
    per_chunk = _pad(sums, CHUNK).reshape(-1, CHUNK) * scales[:, None].double()
    return (per_chunk.reshape(-1)[:numel] / num_contributors).float()


def _pad(t: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = (-t.numel()) % multiple
    return torch.cat([t.reshape(-1), t.new_zeros(extra)]) if extra else t.reshape(-1)
