"""The optimizer wrapper's ``add_param_group`` and ``state``: what torchft's ``OptimizerWrapper``
offers, in replicaft's wrapper first, then under the shim's name."""

from __future__ import annotations

from pathlib import Path

import torch

import replicaft
from replicaft.compat.torchft.optim import OptimizerWrapper


def _unstarted_manager(tmp_path: Path) -> replicaft.Manager:
    return replicaft.Manager(
        replicaft.ManagerOptions(lighthouse="127.0.0.1:1", replica_id="u", events_dir=str(tmp_path))
    )


def test_an_added_param_group_is_what_a_replay_steps_and_state_is_the_optimizers(tmp_path: Path) -> None:
    manager = _unstarted_manager(tmp_path)
    first, second = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    inner = torch.optim.Adam([first], lr=0.1)
    optimizer = replicaft.Optimizer(manager, inner)
    optimizer.add_param_group({"params": [second], "lr": 0.01})
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.01]
    assert manager.optimizer_parameters() == [first, second]
    second.grad = torch.ones(3)
    inner.step()
    assert optimizer.state is inner.state and set(optimizer.state) == {second}
    assert len(manager.state_dict()["optimizer"]["param_groups"]) == 2


def test_the_torchft_wrapper_offers_them_under_torchfts_names() -> None:
    assert OptimizerWrapper.add_param_group is replicaft.Optimizer.add_param_group
    assert OptimizerWrapper.state is replicaft.Optimizer.state
