"""A model fragment: its parameters, their synced (global) copy, and its outer optimizer.

The synced copy is what every group agrees on: the parameters as of the fragment's last
committed sync. Between syncs each group's parameters drift (inner steps); the pseudo-
gradient is ``synced - params``. The outer optimizer is built by the user over the model's
parameters (torchft's convention), so an outer step borrows the parameters as scratch: load
the synced copy into them, set the averaged pseudo-gradient as their gradient, step, and copy
the result back as the new synced copy. The copy, not the parameters, is the state that a
heal transfers and that the sync digest covers.

Sharded parameters (FSDP2's DTensors, as torchtitan always has, even on one rank): the synced
copy is a DTensor like its parameter, so checkpoints keep its sharding; the pseudo-gradient,
the flat synced copy and what a heal loads are local shards (replicaft/state/shards.py), since
group rank r of every group holds the same shard; the outer optimizer gets DTensor gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from replicaft.errors import OptionsError
from replicaft.state.shards import like_param, local_shard


class Fragment:
    def __init__(self, index: int, module: nn.Module, outer_optimizer: torch.optim.Optimizer) -> None:
        self.index = index
        self.named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        if not self.named:
            raise OptionsError(f"model fragment {index} ({type(module).__name__}) has no trainable parameters")
        owned = {id(p) for group in outer_optimizer.param_groups for p in group["params"]}
        missing = [name for name, p in self.named if id(p) not in owned]
        if missing:
            raise OptionsError(
                f"the outer optimizer of fragment {index} does not hold its parameters {missing[:3]}; build it "
                "over the model's parameters (e.g. SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True))"
            )
        self.outer = outer_optimizer
        self.numel = sum(local_shard(p).numel() for _, p in self.named)
        with torch.no_grad():
            self.synced = {name: p.detach().clone() for name, p in self.named}

    def pseudo_gradient(self) -> torch.Tensor:
        """``synced - params`` as one flat float32 tensor (the fragment's drift since its sync)."""
        out = torch.empty(self.numel, dtype=torch.float32, device=self.named[0][1].device)
        offset = 0
        with torch.no_grad():
            for name, p in self.named:
                local = local_shard(p)
                n = local.numel()
                torch.sub(local_shard(self.synced[name]).reshape(-1), local.reshape(-1), out=out[offset : offset + n])
                offset += n
        return out

    def synced_flat(self) -> torch.Tensor:
        """The synced copy as one flat float32 tensor (a new one)."""
        return torch.cat([local_shard(self.synced[name]).reshape(-1).float() for name, _ in self.named])

    def load_synced_flat(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for name, _ in self.named:
                synced = local_shard(self.synced[name])
                n = synced.numel()
                synced.copy_(flat[offset : offset + n].view_as(synced))
                offset += n

    def outer_step(self, average: torch.Tensor) -> None:
        """Apply the averaged pseudo-gradient to the synced copy with the outer optimizer.

        Leaves the parameters holding the new synced values; gradients of parameters outside
        this fragment are hidden from the optimizer meanwhile (an optimizer shared by all
        fragments must not step them with leftover inner gradients).
        """
        with torch.no_grad(), self._only_own_gradients():
            offset = 0
            for name, p in self.named:
                local = local_shard(p)
                n = local.numel()
                p.copy_(self.synced[name])
                p.grad = like_param(average[offset : offset + n].view_as(local).to(p.dtype), p)
                offset += n
            self.outer.step()
            for name, p in self.named:
                self.synced[name].copy_(p)
                p.grad = None

    def load_params(self, alpha: float = 0.0, local: list[torch.Tensor] | None = None) -> None:
        """Set the parameters to the synced copy, mixed with ``local`` by ``alpha`` (lerp)."""
        with torch.no_grad():
            for i, (name, p) in enumerate(self.named):
                p.copy_(self.synced[name])
                if local is not None and alpha > 0.0:
                    p.lerp_(local[i], alpha)

    def local_params(self) -> list[torch.Tensor]:
        with torch.no_grad():
            return [p.detach().clone() for _, p in self.named]

    def state_dict(self) -> dict[str, Any]:
        return dict(self.synced)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.synced):
            raise OptionsError(
                f"fragment {self.index}: the healed state has parameters {sorted(state)[:3]}..., this model "
                f"{sorted(self.synced)[:3]}...; every group must build the same model and fragments"
            )
        with torch.no_grad():
            for name, t in state.items():
                local_shard(self.synced[name]).copy_(local_shard(t))

    @contextlib.contextmanager
    def _only_own_gradients(self) -> Iterator[None]:
        own = {id(p) for _, p in self.named}
        hidden = [
            (p, p.grad) for g in self.outer.param_groups for p in g["params"] if id(p) not in own and p.grad is not None
        ]
        for p, _ in hidden:
            p.grad = None
        try:
            yield
        finally:
            for p, grad in hidden:
                p.grad = grad
