"""Training state as data (replicaft/state/flat.py): flatten, the msgpack wire, unflatten, digest."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replicaft.errors import StateError
from replicaft.state.flat import digest, flatten, tensor_bytes, unflatten


def over_the_wire(state: Mapping[str, Any]) -> Any:
    """What a healer rebuilds: the skeleton through msgpack (as the manifest carries it), tensor copies."""
    flat = flatten(state)
    skeleton = msgpack.unpackb(msgpack.packb(flat.skeleton, use_bin_type=True), raw=False, strict_map_key=False)
    return unflatten(skeleton, [t.clone() for t in flat.tensors])


def assert_identical(got: Any, want: Any, path: str = "state") -> None:
    """Equal values of exactly the same types (True is not 1, a tuple is not a list), tensors bitwise."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
        assert torch.equal(tensor_bytes(got), tensor_bytes(want)), path
        return
    if isinstance(want, Mapping):
        assert isinstance(got, Mapping), path
        assert list(got) == list(want), path
        for (gk, gv), (wk, wv) in zip(got.items(), want.items(), strict=True):
            assert type(gk) is type(wk), f"{path} key {wk!r}"
            assert_identical(gv, wv, f"{path}[{wk!r}]")
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_identical(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), path
    else:
        assert got == want, path


def build_training(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=20)
    return model, optimizer, scheduler


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=generator)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": 3,
        "extras": {
            "cursor": 96,
            "run": "exp-1",
            "blob": b"\x00\xff",
            "nothing": None,
            "pairs": [(1, 2.5), ("a", [True])],
        },
    }


def test_real_training_state_round_trips_identically() -> None:
    model, optimizer, scheduler = build_training(seed=0)
    train(model, optimizer, scheduler, steps=3, seed=1)
    state = training_state(model, optimizer, scheduler)
    # What makes this state awkward: int-keyed optimizer state, tuple betas, an int64 buffer.
    assert set(state["optimizer"]["state"]) == set(range(6))
    assert isinstance(state["optimizer"]["param_groups"][0]["betas"], tuple)
    assert state["model"]["1.num_batches_tracked"].dtype == torch.int64

    restored = over_the_wire(state)

    assert_identical(restored, state)


def test_restored_state_trains_on_bitwise_like_the_original() -> None:
    model, optimizer, scheduler = build_training(seed=0)
    train(model, optimizer, scheduler, steps=3, seed=1)
    restored = over_the_wire(training_state(model, optimizer, scheduler))

    model2, optimizer2, scheduler2 = build_training(seed=99)
    model2.load_state_dict(restored["model"])
    optimizer2.load_state_dict(restored["optimizer"])
    scheduler2.load_state_dict(restored["scheduler"])
    train(model, optimizer, scheduler, steps=2, seed=2)
    train(model2, optimizer2, scheduler2, steps=2, seed=2)

    assert_identical(training_state(model2, optimizer2, scheduler2), training_state(model, optimizer, scheduler))


def test_tensors_listed_in_order_with_their_paths() -> None:
    a, b, c = torch.zeros(1), torch.ones(2), torch.arange(3)
    flat = flatten({"x": a, "opt": {"state": {0: {"m": b}}}, "list": [1, (c,)]})
    assert flat.names == ["state.x", "state.opt.state[0].m", "state.list[1][0]"]
    assert [t is u for t, u in zip(flat.tensors, (a, b, c), strict=True)] == [True, True, True]


def test_user_keys_that_look_like_markers_round_trip() -> None:
    state = {"__tensor__": 0, "inner": {"__tuple__": [1, 2], "__dict__": {"a": 1}}, "t": torch.ones(2)}
    assert_identical(over_the_wire(state), state)


@pytest.mark.parametrize(
    "tensor",
    [
        pytest.param(torch.tensor(2.5), id="zero_dim"),
        pytest.param(torch.empty(0, 3), id="empty"),
        pytest.param(torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), id="non_contiguous"),
        pytest.param(torch.tensor([True, False, True]), id="bool"),
        pytest.param(torch.tensor([1.5, -2.0], dtype=torch.bfloat16), id="bfloat16"),
        pytest.param(torch.tensor([1 + 2j], dtype=torch.complex64), id="complex64"),
        pytest.param(torch.tensor([-(2**62)], dtype=torch.int64), id="int64"),
        pytest.param(torch.ones(3, requires_grad=True), id="requires_grad"),
    ],
)
def test_unusual_tensor_round_trips_bitwise(tensor: torch.Tensor) -> None:
    restored = over_the_wire({"t": tensor})
    assert_identical(restored, {"t": tensor.detach()})


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.dictionaries(st.integers(-(2**63), 2**63 - 1), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=8), plain_values, max_size=4))
def test_any_plain_state_round_trips_identically(state: dict[str, Any]) -> None:
    assert_identical(over_the_wire(state), state)


def test_equal_states_have_equal_digests() -> None:
    model, optimizer, scheduler = build_training(seed=0)
    train(model, optimizer, scheduler, steps=2, seed=1)
    state = training_state(model, optimizer, scheduler)
    assert digest(flatten(state)) == digest(flatten(copy.deepcopy(state)))
    assert digest(flatten(state)) == digest(flatten(over_the_wire(state)))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s["model"]["0.weight"].view(-1)[7].add_(1e-6), id="one_weight_element"),
        pytest.param(lambda s: s["optimizer"]["state"][3]["exp_avg_sq"].view(-1)[0].mul_(2), id="one_moment_element"),
        pytest.param(lambda s: s["model"]["1.num_batches_tracked"].add_(1), id="int_buffer"),
        pytest.param(lambda s: s["optimizer"]["param_groups"][0].update(lr=0.5), id="learning_rate"),
        pytest.param(lambda s: s["extras"].update(cursor=97), id="data_cursor"),
        pytest.param(lambda s: s["extras"]["pairs"].append(None), id="structure"),
    ],
)
def test_digest_changes_when_one_element_changes(change: Any) -> None:
    model, optimizer, scheduler = build_training(seed=0)
    train(model, optimizer, scheduler, steps=2, seed=1)
    state = training_state(model, optimizer, scheduler)
    before = digest(flatten(state))
    changed = copy.deepcopy(state)
    change(changed)
    assert digest(flatten(changed)) != before
    assert digest(flatten(state)) == before


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(
            torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.float32), id="same_bytes_other_dtype"
        ),
        pytest.param(torch.zeros(2, 3), torch.zeros(3, 2), id="same_bytes_other_shape"),
    ],
)
def test_digest_tells_same_bytes_of_different_tensors_apart(a: torch.Tensor, b: torch.Tensor) -> None:
    assert digest(flatten({"t": a})) != digest(flatten({"t": b}))


class Opaque:
    pass


@pytest.mark.parametrize(
    ("state", "where", "what"),
    [
        pytest.param({"model": {"layer": Opaque()}}, "state.model.layer", "type Opaque", id="object"),
        pytest.param({"extras": {"seen": {1, 2}}}, "state.extras.seen", "type set", id="set"),
        pytest.param({"extras": [1, bytearray(b"x")]}, "state.extras[1]", "type bytearray", id="in_a_list"),
        pytest.param({"fn": len}, "state.fn", "type builtin_function_or_method", id="function"),
        pytest.param(
            {"optimizer": {"state": {0: {"bad": Opaque()}}}},
            "state.optimizer.state[0].bad",
            "type Opaque",
            id="under_an_int_key",
        ),
        pytest.param({"extras": {(1, 2): "x"}}, "state.extras", "key (1, 2) of type tuple", id="tuple_key"),
        pytest.param(
            {"w": torch.zeros(2, dtype=torch.float8_e4m3fn)}, "state.w", "dtype torch.float8_e4m3fn", id="dtype"
        ),
        pytest.param({"w": torch.zeros(2, dtype=torch.uint16)}, "state.w", "dtype torch.uint16", id="uint16"),
        pytest.param({"count": 2**64}, "state.count", "does not fit in 64 bits", id="huge_int"),
        pytest.param({"count": -(2**63) - 1}, "state.count", "does not fit in 64 bits", id="huge_negative_int"),
    ],
)
def test_unsupported_value_raises_state_error_naming_the_path(state: dict[str, Any], where: str, what: str) -> None:
    with pytest.raises(StateError) as raised:
        flatten(state)
    message = str(raised.value)
    assert message.startswith(f"state {where}:")
    assert what in message


def test_unsupported_value_message_says_what_to_do() -> None:
    with pytest.raises(StateError, match="return plain types and tensors from your state_dict function"):
        flatten({"x": Opaque()})


@pytest.mark.parametrize("index", [5, -1, "0", None])
def test_skeleton_referring_to_a_missing_tensor_raises_state_error(index: Any) -> None:
    with pytest.raises(StateError, match=r"state.w: tensor reference .* is not one of the 2 tensors"):
        unflatten({"w": {"__tensor__": index}}, [torch.zeros(1), torch.zeros(1)])
