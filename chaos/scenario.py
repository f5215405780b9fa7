"""Chaos scenarios as data: which job to run and which faults to inject when.

A scenario is a frozen :class:`Scenario` loaded from a TOML file (``chaos/scenarios/*.toml``
ship with the package), the way torchtitan declares its integration runs: reading the file
tells you the whole experiment, and the runner has no per-scenario code.

Each fault fires at an *observable* moment, never after a blind sleep:

* ``at_step = N`` — once the job has committed step N (read from the event logs);
* ``at_s = T`` — T seconds after training starts, which is defined as the first committed
  step of the job, so the minutes spent importing torch on a loaded machine do not shift it.

``fault_point`` faults are the exception: the group kills itself at an exact place in its
own step (``replicaft/faults.py``), so they take ``at_step`` only and are armed when the
target group first starts.

Validation happens once, in ``__post_init__``, and every error names the file, the field,
the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

FaultKind = Literal["sigkill", "sigstop", "sigterm", "kill_lighthouse", "fault_point"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
FAULT_POINTS = ("allreduce", "heal", "serve", "commit")
"""Mirrors ``replicaft.faults.POINTS``; kept here so loading a scenario does not import torch."""

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class ScenarioError(ValueError):
    """A scenario file is missing, unreadable or describes an impossible experiment."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultSpec:
    kind: FaultKind
    at_s: float | None = None
    """Seconds after the job's first committed step."""
    at_step: int | None = None
    """Inject once the job has committed this step."""
    target: str | None = None
    """Replica id of the group to hit (``g0`` ... ``g{groups-1}``); none for ``kill_lighthouse``."""
    duration_s: float = 0.0
    """``sigstop`` only: how long the group stays stopped before SIGCONT."""
    point: str | None = None
    """``fault_point`` only: where in the step the group kills itself (allreduce, heal, serve, commit)."""

    def describe(self) -> str:
        what = self.kind if self.point is None else f"{self.kind}:{self.point}"
        where = f" {self.target}" if self.target else ""
        when = f"step {self.at_step}" if self.at_step is not None else f"t+{self.at_s:g}s"
        return f"{what}{where} at {when}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    name: str
    description: str = ""
    groups: int = 3
    steps: int = 50
    step_delay_s: float = 0.0
    """Extra seconds of work per step (``--step-delay`` of the example): paces a demo."""
    width: int = 32
    """Hidden width of the example model."""
    faults: tuple[FaultSpec, ...] = ()
    restart_delay_s: float = 1.0
    """How long the supervisor waits before restarting a dead group or lighthouse, as an
    orchestrator would (Kubernetes' back-off, Slurm's requeue)."""
    heartbeat_timeout_s: float = 2.0
    """Lighthouse ``--heartbeat-timeout``: how fast a SIGSTOPped group is dropped."""
    progress_timeout_s: float = 15.0
    """Lighthouse ``--progress-timeout``."""
    collective_timeout_s: float = 10.0
    """``REPLICAFT_COLLECTIVE_TIMEOUT_S`` for every group."""
    run_timeout_s: float = 120.0
    """Overall deadline: the run is stopped (and reported as hung) when it passes."""
    hang_bound_s: float = 30.0
    """Invariant 4: every fault must be followed by a committed step within this many seconds."""
    loss_tolerance: float = 0.1
    """Invariant 5: allowed relative difference of the final loss from a fault-free run."""

    @property
    def group_ids(self) -> tuple[str, ...]:
        """Replica ids of the groups, ``g0`` ... ``g{groups-1}``."""
        return tuple(f"g{i}" for i in range(self.groups))

    def __post_init__(self) -> None:
        if not self.name:
            raise ScenarioError("scenario name is empty; set name = \"...\"")
        for name in ("groups", "steps", "width"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"scenario {self.name!r}: {name}={getattr(self, name)}; it must be at least 1")
        for name in ("step_delay_s", "restart_delay_s", "loss_tolerance"):
            if getattr(self, name) < 0:
                raise ScenarioError(f"scenario {self.name!r}: {name}={getattr(self, name)}; it must be >= 0")
        for name in ("heartbeat_timeout_s", "progress_timeout_s", "collective_timeout_s", "run_timeout_s", "hang_bound_s"):
            if not getattr(self, name) > 0:
                raise ScenarioError(f"scenario {self.name!r}: {name}={getattr(self, name)}; it must be positive")
        if self.progress_timeout_s <= self.heartbeat_timeout_s:
            raise ScenarioError(
                f"scenario {self.name!r}: progress_timeout_s={self.progress_timeout_s} is not above "
                f"heartbeat_timeout_s={self.heartbeat_timeout_s} (the lighthouse requires it); raise progress_timeout_s"
            )
        for i, fault in enumerate(self.faults):
            self._check_fault(i, fault)

    def _check_fault(self, i: int, f: FaultSpec) -> None:
        where = f"scenario {self.name!r}, faults[{i}] ({f.kind})"
        if f.kind not in FAULT_KINDS:
            raise ScenarioError(f"{where}: kind {f.kind!r} is not one of {list(FAULT_KINDS)}")
        if (f.at_s is None) == (f.at_step is None):
            raise ScenarioError(f"{where}: give exactly one of at_s (seconds after the first commit) or at_step")
        if f.at_step is not None and (isinstance(f.at_step, bool) or not isinstance(f.at_step, int)):
            raise ScenarioError(f"{where}: at_step={f.at_step!r}; it must be a whole step number")
        if f.at_s is not None and f.at_s < 0:
            raise ScenarioError(f"{where}: at_s={f.at_s}; it must be >= 0")
        if f.at_step is not None and not 0 <= f.at_step < self.steps:
            raise ScenarioError(f"{where}: at_step={f.at_step} is outside the run's steps 0..{self.steps - 1}")
        if f.kind == "kill_lighthouse":
            if f.target is not None:
                raise ScenarioError(f"{where}: kill_lighthouse takes no target (got {f.target!r})")
        elif f.target not in self.group_ids:
            raise ScenarioError(f"{where}: target={f.target!r}; expected one of {list(self.group_ids)}")
        if f.kind == "sigstop" and not f.duration_s > 0:
            raise ScenarioError(f"{where}: duration_s={f.duration_s}; a sigstop needs how long to stay stopped")
        if f.kind != "sigstop" and f.duration_s:
            raise ScenarioError(f"{where}: duration_s applies to sigstop only")
        if f.kind == "fault_point":
            if f.point not in FAULT_POINTS:
                raise ScenarioError(f"{where}: point={f.point!r}; expected one of {list(FAULT_POINTS)}")
            if f.at_step is None:
                raise ScenarioError(f"{where}: a fault point fires at a step of the group's own loop; use at_step")
            armed = [g for g in self.faults if g.kind == "fault_point" and g.target == f.target]
            if len(armed) > 1:
                raise ScenarioError(f"{where}: only one fault_point per target group (it is armed when the group starts)")
        elif f.point is not None:
            raise ScenarioError(f"{where}: point applies to fault_point only")

    def fault_points_for(self, group_id: str) -> str | None:
        """``REPLICAFT_FAULT_POINTS`` for the first start of ``group_id`` (restarts are not re-armed)."""
        armed = [f for f in self.faults if f.kind == "fault_point" and f.target == group_id]
        return ",".join(f"{f.point}@{f.at_step}" for f in armed) or None


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomllib arrived in 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ScenarioError(
                f"cannot read {path}: TOML support needs Python 3.11+ (tomllib) or the 'tomli' "
                "package on Python 3.10; run the chaos harness with Python 3.11 or `pip install tomli`"
            ) from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ScenarioError(f"cannot read scenario file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"scenario file {path} is not valid TOML: {e}") from None


def scenario_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> Scenario:
    """Build a scenario from parsed TOML; unknown keys are errors (a typo must not be ignored)."""
    data = dict(data)
    raw_faults = data.pop("faults", [])
    known = set(Scenario.__dataclass_fields__) - {"faults"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{source}: unknown keys {unknown}; known keys are {sorted(known)}")
    fault_keys = set(FaultSpec.__dataclass_fields__)
    faults = []
    for i, raw in enumerate(raw_faults):
        if not isinstance(raw, dict):
            raise ScenarioError(f"{source}: faults[{i}] is {raw!r}; write each fault as a [[faults]] table")
        bad = sorted(set(raw) - fault_keys)
        if bad:
            raise ScenarioError(f"{source}: faults[{i}] has unknown keys {bad}; known keys are {sorted(fault_keys)}")
        faults.append(FaultSpec(**raw))
    try:
        return Scenario(**data, faults=tuple(faults))
    except TypeError as e:
        raise ScenarioError(f"{source}: {e}") from None


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``smoke``, ``demo``) or a TOML file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{name_or_path}.toml"
        if not path.exists():
            shipped = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
            raise ScenarioError(f"no scenario named {name_or_path!r}; shipped scenarios: {shipped}, or pass a .toml path")
    try:
        return scenario_from_dict(_load_toml(path), source=str(path))
    except ScenarioError as e:
        if str(path) in str(e):
            raise
        raise ScenarioError(f"{path}: {e}") from None
