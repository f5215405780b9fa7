"""The state registry: what a heal transfers and a checkpoint saves, and who acts at step boundaries.

Three kinds of registrations, each by the wrapper that owns the thing:

* **state**: ``(name, state_dict_fn, load_state_dict_fn)`` pairs. ``state_dict()`` of the
  registry is the whole training state (model, optimizer moments, scheduler, data cursor, the
  manager's step, user extras); a heal and a checkpoint move exactly this, tensors and plain
  values only (replicaft.state.flat checks that; no pickle).
* **hooks** (:class:`StepHooks`): wrappers that must act when a step starts, commits or aborts
  (the DDP wrapper restores BatchNorm statistics on abort, the data sampler advances its cursor
  on commit) and that take part in a healer's replay of the steps it missed.
* **optimizers**: the ``torch.optim`` optimizers (and schedulers) a replay steps. A replay runs
  inside ``should_commit`` while the wrapper that called it is on the stack; stepping the
  registered torch objects directly, rather than calling back into that wrapper, keeps the
  call graph one-way: wrapper -> manager -> torch.

The registry holds no training logic; the step driver (replicaft/step/driver.py) decides when each runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from replicaft.errors import StateError
from replicaft.state.flat import Flat, flatten

StateDictFn = Callable[[], dict[str, Any]]
LoadStateDictFn = Callable[[dict[str, Any]], None]


class StepHooks:
    """Callbacks a wrapper registers to act at step boundaries, and to replay a step.

    ``on_*`` run in the training thread at the start of a step and at its end (``on_commit``
    before the optimizer steps); ``before_vote`` when ``should_commit`` begins, before the
    "ok" flag. The replay methods serve the non-blocking heal
    (heal/catchup.py): ``capture_step`` returns what this step did to the hook's state (e.g.
    the averaged gradients); to redo a captured step on healed state, ``replay_prepare`` sets
    its inputs (for every hook before the optimizers step), then ``replay_apply`` applies the
    rest (buffers, the data cursor); ``end_replay`` puts back the current step's inputs after
    the last replay.
    """

    fetch_beside_collectives: bool = True
    """Whether a healer may run its fetch beside the step's collectives (from the plan on).
    False (DiLoCo): it starts once they have ended (after the "ok" flag, so the donors have
    sealed their snapshots and no send from their live state holds them), and the healer
    replays the step instead. A DiLoCo sync's all-reduce carries the whole model through every
    participant's link, the healer's too, so a fetch beside it made the donors' sync as long
    as both transfers together: 3.8 s instead of 1.6 s over 100 Mbit/s (issue 21). A heal at
    step 0 (a group joining at the start) fetches beside it still: nothing has been trained, and
    the group commits that step with the others, as torchft's programs expect."""

    def on_step_start(self) -> None: ...
    def before_vote(self) -> None: ...
    def on_commit(self) -> None: ...
    def on_abort(self) -> None: ...
    def capture_step(self) -> Any:
        return None

    def replay_prepare(self, record: Any) -> None: ...
    def replay_apply(self, record: Any) -> None: ...
    def end_replay(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Stepper:
    optimizer: torch.optim.Optimizer
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None

    def step(self) -> None:
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()


class StateRegistry:
    """Registered state, hooks and optimizers of one rank. Training thread only."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[StateDictFn, LoadStateDictFn]] = {}
        self._not_digested: set[str] = set()
        self._optional: set[str] = set()
        self._own: set[str] = set()
        """Each group's own: never served to a healer (see :meth:`register_state`)."""
        self._hooks: list[StepHooks] = []
        self._steppers: list[_Stepper] = []

    def register_state(
        self,
        name: str,
        state_dict: StateDictFn,
        load_state_dict: LoadStateDictFn,
        *,
        in_digest: bool = True,
        optional: bool = False,
        healed: bool = True,
    ) -> None:
        """``in_digest=False``: bookkeeping that travels with the state but is not training
        state, so the digest that says two groups hold the same state leaves it out (the
        checkpoint lineage: a resume that forks a new history changes it, not the state).
        ``optional=True``: a state to load may lack it (a checkpoint written before it was
        registered); it is then left as it is. ``healed=False``: each group's own record,
        which legitimately differs between groups (the losses each group computed on its own
        batches): checkpoints carry it, but donors do not serve it, since their vote on the
        state a healer takes could never agree on it; a healer keeps its own. Implies
        ``in_digest=False`` and ``optional=True``."""
        if name in self._states:
            raise StateError(f"state {name!r} is registered twice; pick another name")
        self._states[name] = (state_dict, load_state_dict)
        if not in_digest or not healed:
            self._not_digested.add(name)
        if optional or not healed:
            self._optional.add(name)
        if not healed:
            self._own.add(name)

    def register_hooks(self, hooks: StepHooks) -> None:
        self._hooks.append(hooks)

    def register_optimizer(
        self, optimizer: torch.optim.Optimizer, lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    ) -> None:
        """Register the optimizer's state (and the scheduler's) as ``optimizer`` (and
        ``lr_scheduler``), and step them in a replay."""
        self.register_state("optimizer", optimizer.state_dict, optimizer.load_state_dict)
        if lr_scheduler is not None:
            self.register_state("lr_scheduler", lr_scheduler.state_dict, lr_scheduler.load_state_dict)
        self._steppers.append(_Stepper(optimizer, lr_scheduler))

    def optimizer_parameters(self) -> list[torch.Tensor]:
        """The parameters of every registered optimizer, in registration order: what a replay steps."""
        return [p for s in self._steppers for group in s.optimizer.param_groups for p in group["params"]]

    def fetch_beside_collectives(self, max_step: int) -> bool:
        """Whether a heal to ``max_step`` fetches beside the step's collectives: unless a hook
        asks otherwise, and always at step 0 (see ``StepHooks.fetch_beside_collectives``).
        The healer (when to start) and the donor (whether to wait at its seal) both ask here."""
        return max_step == 0 or all(h.fetch_beside_collectives for h in self._hooks)

    @property
    def names(self) -> list[str]:
        return list(self._states)

    def state_dict(self) -> dict[str, Any]:
        return {name: fn() for name, (fn, _) in self._states.items()}

    def flat(self, *, in_digest_only: bool = False, healed_only: bool = False) -> Flat:
        """``healed_only``: the state a donor serves and a healer compares with what it is sent."""
        state = self.state_dict()
        if in_digest_only:
            state = {name: value for name, value in state.items() if name not in self._not_digested}
        if healed_only:
            state = {name: value for name, value in state.items() if name not in self._own}
        return flatten(state)

    @property
    def required(self) -> frozenset[str]:
        """The states every state to load must hold (a heal's donor included): all but the optional ones."""
        return frozenset(set(self._states) - self._optional)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = self.required - set(state)
        if missing:
            raise StateError(f"state to load lacks {sorted(missing)}; registered: {sorted(self._states)}")
        for name, (_, load) in self._states.items():
            if name in state:
                load(state[name])

    # -- step boundaries ----------------------------------------------------------------------

    def step_started(self) -> None:
        for h in self._hooks:
            h.on_step_start()

    def before_vote(self) -> None:
        for h in self._hooks:
            h.before_vote()

    def committed(self) -> None:
        for h in self._hooks:
            h.on_commit()

    def aborted(self) -> None:
        for h in self._hooks:
            h.on_abort()

    def capture(self) -> list[Any]:
        """What this step did, hook by hook, for a healer to replay later."""
        return [h.capture_step() for h in self._hooks]

    def replay(self, records: Iterable[list[Any]]) -> int:
        """Redo captured steps on the current (healed) state, in order; returns how many.

        Each step: every hook's ``replay_prepare`` (the gradients), every optimizer (and its
        scheduler) steps, every hook's ``replay_apply``. Then every hook's ``end_replay``.
        """
        count = 0
        for record in records:
            for h, r in zip(self._hooks, record, strict=True):
                h.replay_prepare(r)
            for s in self._steppers:
                s.step()
            for h, r in zip(self._hooks, record, strict=True):
                h.replay_apply(r)
            count += 1
        if count:
            for h in self._hooks:
                h.end_replay()
        return count
