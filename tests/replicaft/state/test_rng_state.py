"""The global random generators as state (replicaft/state/rng_state.py): round trips, and what a peer
may not send. In-process: a state goes through replicaft/state/flat.py's flatten and msgpack as it does on
the wire, and is loaded back."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from replicaft.config.options import ManagerOptions
from replicaft.errors import StateError
from replicaft.manager import Manager
from replicaft.state.flat import flatten, unflatten
from replicaft.state.registry import StateRegistry
from replicaft.state.rng_state import (
    RngState,
    available_sources,
    capture,
    decode,
    encode,
    fingerprint,
    restore,
)

SOURCES = ("python", "numpy", "torch")


def no_heal() -> bool:
    return False


def draws() -> tuple[float, float, list[float]]:
    """One draw from each CPU source: equal draws mean equal generator states."""
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def over_the_wire(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a healer receives it: skeleton through msgpack, tensors copied."""
    flat = flatten({"rng": state})
    skeleton = msgpack.unpackb(msgpack.packb(flat.skeleton, use_bin_type=True), raw=False, strict_map_key=False)
    return unflatten(skeleton, [t.clone() for t in flat.tensors])["rng"]


def test_every_source_round_trips_through_the_wire_and_draws_the_same() -> None:
    random.gauss(0, 1)  # leaves a cached Gaussian in Python's state (gauss_next is a float)
    np.random.randn()  # and in NumPy's (has_gauss = 1)
    provider = RngState(SOURCES, no_heal)
    state = over_the_wire(provider.state_dict())
    expected = draws(), random.gauss(0, 1), float(np.random.randn())
    provider.load_state_dict(state)
    assert (draws(), random.gauss(0, 1), float(np.random.randn())) == expected


def test_a_state_received_as_views_into_one_buffer_loads() -> None:
    # A heal delivers every tensor as a view into its receive buffer (transfer/snapshot.py);
    # torch's set_state on such a view (a storage offset) crashed the healer.
    provider = RngState(SOURCES, no_heal)
    state = provider.state_dict()
    buffer = torch.zeros(64 + state["torch"].numel() + 64, dtype=torch.uint8)
    buffer[64:-64] = state["torch"]
    state["torch"] = buffer[64:-64]
    expected = draws()
    provider.load_state_dict(state)
    assert draws() == expected


def test_an_aborted_step_gives_its_retry_the_same_draws() -> None:
    provider = RngState(SOURCES, no_heal)
    provider.on_step_start()
    first = draws()
    provider.on_abort()
    assert draws() == first


def test_a_donor_serves_the_generators_its_step_started_with() -> None:
    # A donor publishes its snapshot when the plan is applied, before or after forward.
    provider = RngState(SOURCES, no_heal)
    provider.on_step_start()
    expected = draws()
    served = provider.state_dict()
    provider.on_commit()
    provider.load_state_dict(served)
    assert draws() == expected


def test_a_step_with_a_heal_ends_where_it_started_and_a_step_without_does_not() -> None:
    healing = [True]
    provider = RngState(SOURCES, lambda: healing[0])
    provider.on_step_start()
    expected = draws()
    provider.on_commit()
    assert draws() == expected
    healing[0] = False
    provider.on_step_start()
    draws()
    after = capture(SOURCES)
    provider.on_commit()
    assert fingerprint(capture(SOURCES)) == fingerprint(after)


def test_a_load_during_a_step_that_then_aborts_keeps_the_loaded_generators() -> None:
    # A resume from disk loads in a step that does not commit: the abort must not undo it.
    provider = RngState(SOURCES, no_heal)
    saved = provider.state_dict()
    expected = draws()
    provider.on_step_start()
    draws()
    provider.load_state_dict(saved)
    provider.on_abort()
    assert draws() == expected


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(state: dict[str, Any]) -> None:
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("missing source", lambda s: s.pop("numpy"), "state.rng must be a map with exactly"),
    ("extra source", _set(("mps",), b""), "state.rng must be a map with exactly"),
    ("python version", _set(("python", "version"), 2), "state.rng.python.version is 2"),
    (
        "python words dtype",
        _set(("python", "words"), torch.zeros(625, dtype=torch.int32)),
        "state.rng.python.words must be an int64 tensor of shape (625,)",
    ),
    (
        "python words shape",
        _set(("python", "words"), torch.zeros(10**6, dtype=torch.int64)),
        "state.rng.python.words must be an int64 tensor of shape (625,)",
    ),
    (
        "python word range",
        _set(("python", "words"), torch.full((625,), 2**32, dtype=torch.int64)),
        "state.rng.python.words holds 4294967296",
    ),
    (
        "python position",
        _set(("python", "words"), torch.cat([torch.zeros(624, dtype=torch.int64), torch.tensor([625])])),
        "(the position) holds 625",
    ),
    ("python gauss", _set(("python", "gauss_next"), "0.5"), "state.rng.python.gauss_next is a str"),
    ("python not a map", _set(("python",), [3, 1, 2]), "state.rng.python must be a map"),
    ("numpy algorithm", _set(("numpy", "algorithm"), "PCG64"), "state.rng.numpy.algorithm is 'PCG64'"),
    ("numpy key", _set(("numpy", "key"), torch.zeros(624, dtype=torch.uint8)), "state.rng.numpy.key must be an int64"),
    (
        "numpy key range",
        _set(("numpy", "key"), torch.full((624,), -1, dtype=torch.int64)),
        "state.rng.numpy.key holds -1",
    ),
    ("numpy pos", _set(("numpy", "pos"), 700), "state.rng.numpy.pos is 700"),
    ("numpy has_gauss", _set(("numpy", "has_gauss"), True), "state.rng.numpy.has_gauss is True"),
    ("numpy cached", _set(("numpy", "cached_gaussian"), None), "state.rng.numpy.cached_gaussian is a NoneType"),
    ("torch dtype", _set(("torch",), torch.zeros(5056, dtype=torch.int8)), "state.rng.torch must be a uint8 tensor"),
    ("torch size", _set(("torch",), torch.zeros(5057, dtype=torch.uint8)), "of shape (5056,)"),
    ("torch huge", _set(("torch",), torch.zeros(1 << 20, dtype=torch.uint8)), "of shape (5056,)"),
    ("torch not a tensor", _set(("torch",), b"\0" * 5056), "got bytes"),
]


def test_each_commit_is_annotated_with_the_generators_fingerprint() -> None:
    fields: list[dict[str, Any]] = []
    provider = RngState(SOURCES, no_heal, lambda **f: fields.append(f))
    saved = provider.state_dict()
    provider.on_commit()
    draws()
    provider.on_commit()
    provider.load_state_dict(saved)
    provider.on_commit()
    assert fields[0] == fields[2] != fields[1]
    assert fields[0]["rng"] == fingerprint(capture(SOURCES))
    assert sorted(fields[0]["rng"]) == sorted(SOURCES) and all(len(v) == 16 for v in fields[0]["rng"].values())


@pytest.mark.parametrize(("mutate", "message"), [(m, msg) for _, m, msg in MALFORMED], ids=[c for c, _, _ in MALFORMED])
def test_a_malformed_state_is_refused_by_name_and_no_generator_changes(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    provider = RngState(SOURCES, no_heal)
    state = over_the_wire(provider.state_dict())
    mutate(state)
    draws()  # the generators now differ from the sent ones: a partial load would show
    before = capture(SOURCES)
    expected = draws()
    restore(before)
    with pytest.raises(StateError) as e:
        provider.load_state_dict(state)
    assert message in str(e.value)
    assert draws() == expected


def test_a_torch_state_the_generator_refuses_is_a_state_error() -> None:
    provider = RngState(("torch",), no_heal)
    with pytest.raises(StateError, match="state.rng.torch: the generator refused this state"):
        provider.load_state_dict({"torch": torch.zeros(5056, dtype=torch.uint8)})


def test_cuda_states_must_match_the_visible_devices() -> None:
    with pytest.raises(StateError, match="CUDA generator states, this process sees"):
        decode({"cuda": [torch.zeros(16, dtype=torch.uint8)] * (torch.cuda.device_count() + 1)}, ("cuda",))


def test_encode_decode_is_identity_on_the_native_states() -> None:
    native = capture(SOURCES)
    back = decode(over_the_wire(encode(native)), SOURCES)
    assert back["python"] == native["python"]
    assert back["numpy"][0] == native["numpy"][0] and (back["numpy"][1] == native["numpy"][1]).all()
    assert back["numpy"][1].dtype == np.uint32 and back["numpy"][2:] == native["numpy"][2:]
    assert torch.equal(back["torch"], native["torch"])


def test_deterministic_mode_leaves_torch_generators_out() -> None:
    assert "torch" not in available_sources(deterministic=True)
    assert {"python", "numpy", "torch"} <= set(available_sources())


def test_manager_carries_rng_outside_the_digest_with_init_sync_unless_opted_out() -> None:
    options = ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0")
    registry: StateRegistry = Manager(options)._registry
    assert "rng" in registry.names
    assert not any(n.startswith("state.rng") for n in registry.flat(in_digest_only=True).names)
    assert any(n.startswith("state.rng") for n in registry.flat().names)
    registry.load_state_dict({k: v for k, v in registry.state_dict().items() if k != "rng"})  # an older checkpoint
    assert "rng" not in Manager(options, rng_state=False)._registry.names
    assert "rng" not in Manager(options, init_sync=False)._registry.names  # nothing made the groups' agree
    assert "rng" in Manager(options, init_sync=False, rng_state=True)._registry.names
