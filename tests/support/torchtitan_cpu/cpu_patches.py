"""The changes that let torchtitan 0.3.0 run on CPU; nothing else of torchtitan is touched.

1. The device: ``torchtitan.tools.utils`` sets ``device_type, device_module`` at import to
   ``"cuda", torch.cuda`` on a host without an accelerator; they become ``"cpu"`` and
   :data:`CPU_DEVICE`, ``torch.cpu`` plus the memory queries torchtitan's memory monitor asks
   for (no such numbers on CPU: zeros). Patched before any other torchtitan module imports
   the names, so the default process group is Gloo (torch's backend for ``cpu``).
2. FlexAttention: its compiled kernel has no CPU backward, so ``FlexAttention`` evaluates the
   same block mask (its ``mask_mod``, per token) as a dense boolean mask under
   ``scaled_dot_product_attention``: the same attention, in eager mode. The block mask is built
   eagerly too (``create_block_mask`` uncompiled), sparing a C++ compile of it on each start.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, create_mask

__all__ = ["CPU_DEVICE", "patch_torchtitan_for_cpu"]


def _zero_stats(*_: Any, **__: Any) -> dict[str, int]:
    return {}


def _nothing(*_: Any, **__: Any) -> None:
    return None


CPU_DEVICE = types.SimpleNamespace(
    **{name: getattr(torch.cpu, name) for name in ("set_device", "device_count", "synchronize")},
    # torch.cpu's is the string "cpu"; torchtitan passes it to barrier(device_ids=[...]), which takes ints
    current_device=lambda: 0,
    get_device_name=lambda *_: "cpu",
    # torchtitan divides by total_memory to print percentages
    get_device_properties=lambda *_: types.SimpleNamespace(name="cpu", total_memory=1),
    reset_peak_memory_stats=_nothing,
    empty_cache=_nothing,
    memory_stats=_zero_stats,
)
"""torchtitan's ``device_module`` on CPU: ``torch.cpu`` and the memory queries it lacks."""


def _masked_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score_mod: Any,
    block_mask: Any,
    scale: float | None,
    enable_gqa: bool,
    return_aux: Any,
    kernel_options: dict,
) -> tuple[torch.Tensor, None]:
    """``FlexAttention.compiled_flex_attn``'s contract, for the mask-only attention of the
    llama3 models: no ``score_mod`` and no log-sum-exp asked for (both raise)."""
    if score_mod is not None or getattr(return_aux, "lse", False):
        raise NotImplementedError("the CPU FlexAttention stand-in evaluates masks only (no score_mod, no lse)")
    mask = create_mask(block_mask.mask_mod, q.shape[0], 1, q.shape[-2], k.shape[-2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), None


def patch_torchtitan_for_cpu() -> None:
    """Apply the two changes above; call before importing anything else of torchtitan."""
    from torchtitan.tools import utils

    utils.device_type, utils.device_module = "cpu", CPU_DEVICE
    from torchtitan.models.common import attention

    attention.FlexAttention.compiled_flex_attn = staticmethod(_masked_sdpa)
    attention._compiled_create_block_mask = create_block_mask
