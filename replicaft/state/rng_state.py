"""The process-global random generators as training state: captured, carried, validated, restored.

A script that draws from the global generators (``nn.Dropout`` reads torch's, augmentation
often Python's ``random`` or NumPy's) continues bit for bit after a failure only if those
generators continue where they were. So they are registered state (registry.py), carried by a
heal and saved by a checkpoint like the model: Python's ``random``, NumPy's global (legacy
``RandomState``) generator, torch's CPU generator and, where CUDA is available, the default
generator of every visible CUDA device. The manager registers them on its own (``Manager``'s
``rng_state``, on by default with ``init_sync``); nothing is needed from the script.

Encoding, without pickle (replicaft/state/flat.py carries tensors and plain values only): torch's generators
are the ``uint8`` tensors ``get_state()`` returns; Python's ``(version, words, gauss_next)``
becomes an ``int64`` tensor of the 624 Mersenne-Twister words and the position; NumPy's
``("MT19937", key, pos, has_gauss, cached_gaussian)`` an ``int64`` tensor of the key and plain
values. A state to load may come from a peer, so :func:`decode` checks every field (type,
dtype, shape, range) before any generator is touched, and names the field that is wrong.

What "every rank's RNG" means across groups: rank r of a healer takes rank r of its donors'
generators, as it takes their weights. The heal's majority vote covers all served state
(transfer/donors.py), so with several donors they must hold the same generators. They do when
the groups descend from one state (``init_sync``'s step-0 heal, or a resume from one
checkpoint, gives every group the same generators) and draw the same amount each step. A
script whose groups draw differently, or seed per group (``Manager.step_seed`` mixes in the
replica rank), gains nothing from carrying them and must opt out (``rng_state=False``), or its
heals from several donors find no majority. Without ``init_sync`` nothing makes the groups'
generators agree (Python's and NumPy's start from OS entropy), so the manager then carries
them only when asked (``rng_state=True``). The deterministic mode reseeds torch's generators
per virtual shard (shard_gradients.py), so their state at a boundary is a function of which
shards the group computed; the manager leaves them out there.

Not in the commit digest (``in_digest=False``): the digest certifies that groups hold the same
model and optimizer state, which they do even when their generators legitimately differ (per
group seeding, the deterministic mode); a digest that counted them would report divergence
that is not there.

Timing. Between steps (a checkpoint, written at a step boundary) the value carried is the
generators as they are. During a step it is the generators as the step found them: a donor
publishes its snapshot of step ``b`` when the plan is applied, which may be before or after
forward. A healer receives that snapshot and applies it in the commit of the step it took part
in meanwhile, after its own forward drew from its old generators; the donors' have by then
moved on by that step's draws, which the healer cannot redo. So a step whose quorum has
healers ends, in every group, with the generators where it started: the healer holds the
donors' generators of step ``b`` and so do they, and all draw alike again from the next step
(the heal step's draws repeat once). The same holds across a heal that replays missed steps
(heal/catchup.py): each of them had the healer in its quorum. A step that aborts also puts the
generators back where it started, so its retry draws what a fault-free run drew.

Not carried: generators a script creates itself (``torch.Generator()``: register them with
``Manager.register_state``), DataLoader worker processes (seeded when their loader starts),
other device types.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Callable
from typing import Any, Literal

import torch

from replicaft.errors import StateError
from replicaft.state.registry import StepHooks

STATE_NAME = "rng"
"""The registered state's name (``Manager``)."""

Source = Literal["python", "numpy", "torch", "cuda"]
SOURCES: tuple[Source, ...] = ("python", "numpy", "torch", "cuda")

MT_WORDS = 624
"""Words of a Mersenne-Twister state (Python's ``random``, NumPy's MT19937)."""
MAX_TORCH_STATE_BYTES = 1 << 16
"""torch's CPU generator state is 5056 bytes and a CUDA (Philox) one 16; a peer's claim of
more is refused before it reaches torch."""


def available_sources(*, deterministic: bool = False) -> tuple[Source, ...]:
    """The sources this process has: NumPy when installed, CUDA when available; without torch's
    when ``deterministic`` (it reseeds them per virtual shard: see the module docstring)."""
    sources: list[Source] = ["python"]
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    else:
        sources.append("numpy")
    if not deterministic:
        sources.append("torch")
        if torch.cuda.is_available():
            sources.append("cuda")
    return tuple(sources)


# -- one source each: capture (native form), encode (plain + tensors), decode (checked) ------------


def _capture(source: Source) -> Any:
    if source == "python":
        return random.getstate()
    if source == "numpy":
        import numpy as np

        return np.random.get_state()
    if source == "torch":
        return torch.get_rng_state()
    return [g.get_state() for g in torch.cuda.default_generators]


def _restore(source: Source, native: Any) -> None:
    if source == "python":
        random.setstate(native)
    elif source == "numpy":
        import numpy as np

        np.random.set_state(native)
    elif source == "torch":
        torch.set_rng_state(native)
    else:
        for g, state in zip(torch.cuda.default_generators, native, strict=True):
            g.set_state(state)


def _encode(source: Source, native: Any) -> Any:
    if source == "python":
        version, words, gauss_next = native
        return {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss_next": gauss_next}
    if source == "numpy":
        algorithm, key, pos, has_gauss, cached_gaussian = native
        return {
            "algorithm": algorithm,
            "key": torch.from_numpy(key.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    if source == "torch":
        return native
    return list(native)


def _decode(source: Source, value: Any, where: str) -> Any:
    """The native state ``value`` encodes, or StateError naming the field that is wrong."""
    if source == "python":
        _expect_keys(value, {"version", "words", "gauss_next"}, where)
        if value["version"] != 3:
            raise StateError(f"{where}.version is {value['version']!r}; this Python's random uses version 3")
        words = _int64_vector(value["words"], MT_WORDS + 1, f"{where}.words")
        state = words.tolist()
        _check_range(state[:MT_WORDS], 0, 2**32 - 1, f"{where}.words")
        _check_range(state[MT_WORDS:], 0, MT_WORDS, f"{where}.words[{MT_WORDS}] (the position)")
        gauss = value["gauss_next"]
        if gauss is not None and not isinstance(gauss, float):
            raise StateError(f"{where}.gauss_next is a {type(gauss).__name__}; expected a float or None")
        return (3, tuple(state), gauss)
    if source == "numpy":
        import numpy as np

        _expect_keys(value, {"algorithm", "key", "pos", "has_gauss", "cached_gaussian"}, where)
        if value["algorithm"] != "MT19937":
            raise StateError(f"{where}.algorithm is {value['algorithm']!r}; NumPy's global generator is 'MT19937'")
        key = _int64_vector(value["key"], MT_WORDS, f"{where}.key")
        _check_range(key.tolist(), 0, 2**32 - 1, f"{where}.key")
        pos, has_gauss, cached = value["pos"], value["has_gauss"], value["cached_gaussian"]
        _check_int(pos, 0, MT_WORDS, f"{where}.pos")
        _check_int(has_gauss, 0, 1, f"{where}.has_gauss")
        if not isinstance(cached, float):
            raise StateError(f"{where}.cached_gaussian is a {type(cached).__name__}; expected a float")
        return ("MT19937", key.numpy().astype(np.uint32), pos, has_gauss, cached)
    if source == "torch":
        return _byte_state(value, torch.get_rng_state().numel(), where)
    if not isinstance(value, list):
        raise StateError(f"{where} is a {type(value).__name__}; expected a list of CUDA generator states")
    generators = torch.cuda.default_generators
    if len(value) != len(generators):
        raise StateError(
            f"{where} holds {len(value)} CUDA generator states, this process sees {len(generators)} "
            "devices; heal and resume on the same number of visible devices per rank"
        )
    return [
        _byte_state(v, g.get_state().numel(), f"{where}[{i}]")
        for i, (v, g) in enumerate(zip(value, generators, strict=True))
    ]


def _expect_keys(value: Any, keys: set[str], where: str) -> None:
    if not isinstance(value, dict) or set(value) != keys:
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise StateError(f"{where} must be a map with exactly {sorted(keys)}; got {got}")


def _int64_vector(value: Any, length: int, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or tuple(value.shape) != (length,):
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise StateError(f"{where} must be an int64 tensor of shape ({length},); got {got}")
    return value


def _check_range(values: list[int], low: int, high: int, where: str) -> None:
    bad = next((v for v in values if not low <= v <= high), None)
    if bad is not None:
        raise StateError(f"{where} holds {bad}, outside [{low}, {high}]")


def _check_int(value: Any, low: int, high: int, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise StateError(f"{where} is {value!r}; expected an integer in [{low}, {high}]")


def _byte_state(value: Any, num_bytes: int, where: str) -> torch.Tensor:
    if (
        not isinstance(value, torch.Tensor)
        or value.dtype != torch.uint8
        or value.dim() != 1
        or value.numel() > MAX_TORCH_STATE_BYTES
        or value.numel() != num_bytes
    ):
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise StateError(
            f"{where} must be a uint8 tensor of shape ({num_bytes},) (this torch's generator state); got {got}"
        )
    # A copy, never the tensor as it came: a heal's tensors are views into one receive buffer,
    # and on torch 2.13 Generator.set_state on a view with a storage offset segfaults (seen: a
    # healer died in set_rng_state); a copy also keeps no reference into that buffer.
    return value.detach().cpu().clone()


# -- all sources together -----------------------------------------------------------------------


def capture(sources: tuple[Source, ...]) -> dict[Source, Any]:
    """The generators of ``sources`` now, in their native forms (cheap: a few KiB of copies)."""
    return {s: _capture(s) for s in sources}


def encode(native: dict[Source, Any]) -> dict[str, Any]:
    """``capture``'s result as tensors and plain values (replicaft/state/flat.py's ``flatten`` accepts it)."""
    return {s: _encode(s, v) for s, v in native.items()}


def decode(state: Any, sources: tuple[Source, ...], where: str = "state.rng") -> dict[Source, Any]:
    """The native states ``state`` (from :func:`encode`, possibly a peer's) holds for
    ``sources``; StateError naming the field when anything is missing, extra or malformed."""
    _expect_keys(state, set(sources), where)
    return {s: _decode(s, state[s], f"{where}.{s}") for s in sources}


def restore(native: dict[Source, Any], where: str = "state.rng") -> None:
    """Set the generators; a state a generator still refuses (torch checks its Mersenne-Twister
    state) raises StateError. Call with :func:`decode`'s result, so nothing malformed gets here."""
    for source, value in native.items():
        try:
            _restore(source, value)
        except (ValueError, TypeError, RuntimeError) as e:
            raise StateError(f"{where}.{source}: the generator refused this state: {e}") from None


def fingerprint(native: dict[Source, Any]) -> dict[str, str]:
    """A short digest per source of ``capture``'s result: equal fingerprints, equal generators."""
    out: dict[str, str] = {}
    for source, value in native.items():
        h = hashlib.blake2b(digest_size=8)
        if source == "python":
            h.update(array("Q", value[1]).tobytes() + repr(value[2]).encode())
        elif source == "numpy":
            h.update(value[1].tobytes() + repr(value[2:]).encode())
        else:
            for t in value if source == "cuda" else [value]:
                h.update(t.numpy().tobytes())
        out[source] = h.hexdigest()
    return out


class RngState(StepHooks):
    """The global generators of ``sources`` as registered state, with step-boundary hooks.

    Register ``state_dict``/``load_state_dict`` (``in_digest=False``, ``optional=True``: a
    checkpoint written before they were carried leaves them as they are) and the hooks.
    ``heal_in_step()`` says whether the quorum of the step in progress has healers.
    ``annotate`` (``Manager.annotate_commit``) receives, at each commit, ``rng`` = the
    :func:`fingerprint` of each generator after the step: groups that draw alike show equal
    values step by step (a heal or resume that lost them shows at once), which the commit
    digest cannot show, leaving them out. Training thread only.
    """

    def __init__(
        self, sources: tuple[Source, ...], heal_in_step: Callable[[], bool], annotate: Callable[..., None] | None = None
    ) -> None:
        self.sources = sources
        self._heal_in_step = heal_in_step
        self._annotate = annotate
        self._step_start: dict[Source, Any] | None = None
        """The generators when the step in progress started (or when state was loaded since);
        None between steps."""

    def state_dict(self) -> dict[str, Any]:
        """Between steps (a checkpoint) the generators as they are; during a step (a donor's
        snapshot, published whenever the plan is applied, before or after forward) as the
        step found them: the state of the step the snapshot is of."""
        return encode(self._step_start if self._step_start is not None else capture(self.sources))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Validate every field first, then set the generators; a step that aborts after this
        load (a resume from disk does not commit its step) goes back to the loaded state."""
        native = decode(state, self.sources)
        restore(native)
        if self._step_start is not None:
            self._step_start = native

    def on_step_start(self) -> None:
        self._step_start = capture(self.sources)

    def on_commit(self) -> None:
        """A step with a heal ends where it started, in every group: see the module docstring."""
        start, self._step_start = self._step_start, None
        if start is not None and self._heal_in_step():
            restore(start)
        if self._annotate is not None:
            self._annotate(rng=fingerprint(capture(self.sources)))

    def on_abort(self) -> None:
        start, self._step_start = self._step_start, None
        if start is not None:
            restore(start)


def step_seed(seed: int, step: int, replica_rank: int) -> int:
    """A 63-bit seed from (seed, step, replica rank) (``Manager.step_seed``): a pure function of
    the three, so a healed or restarted group draws what it would have drawn."""
    h = hashlib.blake2b(f"{seed}/{step}/{replica_rank}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)
