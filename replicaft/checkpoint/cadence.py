"""How often to checkpoint: the interval from the cost of a save and the time between total failures.

A persistent checkpoint is insurance. Saving too often wastes the cost of each save; saving too
rarely loses, on average, half an interval of work at every failure it has to cover. The
classic answer (Young 1974, refined by Daly 2006) balances the two: with a save costing ``C``
seconds and failures arriving on average every ``M`` seconds, the interval that minimises the
expected waste is ``sqrt(2 C M)`` (Daly's higher-order form, used here, corrects it for
``C`` not much smaller than ``M``, and is ``M`` once ``C >= 2 M``).

**The cost ``C``** is what a save takes from the job, measured on the last saves: the time the
training thread was blocked (the host copy, the wait for a background copy) plus the time
the writer spent writing it. Counting the whole write is conservative (the writer runs at the
lowest CPU priority, behind training, so much of it overlaps useful work): it errs towards
longer intervals, never towards saves that overlap. The interval is also never shorter than
one write, since a save due while the previous one is still being written is skipped
(policy.py). Until a save has been measured the interval is the configured lower bound, so
the first save comes early and measures the cost.

**The failures that count are total failures.** In a peer-protected job a lost replica group
heals from its peers and reads nothing from disk; a persistent checkpoint is used only when
every group is gone at once. So ``M`` is the mean time between *total* failures, estimated
in two ways from what a group observes (:class:`FailureHistory`, which travels with heals and
checkpoints so that it survives the failures it counts):

* **Observed total failures**: each resume from disk is one. Once ``min_total_failures`` of
  them have been seen, ``M`` is the training time observed divided by their number. That
  estimate includes correlated failures (a job-wide preemption, a bug that kills every group
  at the same step, a lost switch), which are the common cause of total failures in practice.
* **Member losses** (each ``member_lost`` notice from the lighthouse): with ``G`` groups, each
  failing at rate ``λ = losses / group-seconds`` and down for ``R = degraded seconds / losses``
  (the time the quorum stayed short of its full size, i.e. restart plus heal), a group is
  unavailable a fraction ``u = λR / (1 + λR)`` of the time. Failing independently, all ``G``
  are down at once when one fails while the other ``G-1`` are down, at rate
  ``G λ (1-u) u^(G-1)``; ``M`` is its inverse. With one group (no peer protection) that is
  the group's own cycle time, ``1/λ + R``: every loss is a total failure. With several groups
  and short repairs it is very long: peers protect the job, and checkpoints become rare.
  ``G`` is the number of groups taking part *now*: while lost groups are away, fewer peers
  protect the job, the estimate falls (towards ``1/λ + R`` with one group left) and saves come
  more often, until the groups are back.

Until enough total failures are observed, ``M`` is the configured prior, or the member-loss
estimate when that is shorter: independence gives a floor on how often total failures occur,
never a ceiling (it cannot see correlated failures, which is what the prior stands for). The
result is clamped to the configured bounds. A graceful leave (``member_left``) is not a loss;
a deliberate stop of the whole job followed by a resume counts as a total failure (it is
indistinguishable from one here, and counting it errs towards saving more often).

Pure: numbers in, a decision with its reason and inputs out (policy.py's style).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from replicaft.errors import OptionsError

MtbfSource = Literal["prior", "member_losses", "observed"]


@dataclass(frozen=True, slots=True)
class CadenceLimits:
    min_s: float
    """Never save more often than this (also the interval before any save is measured)."""
    max_s: float
    """Never save less often than this: bounds the work a total failure can lose."""
    prior_mtbf_s: float
    """Mean time between total failures assumed until ``min_total_failures`` are observed."""
    min_total_failures: int = 2
    """Observed total failures needed before their rate replaces the prior."""

    def __post_init__(self) -> None:
        check_cadence_limits(self.min_s, self.max_s, self.prior_mtbf_s, self.min_total_failures)


def check_cadence_limits(min_s: float, max_s: float, prior_mtbf_s: float, min_total_failures: int = 2) -> None:
    """Raise OptionsError naming the option, its value and the fix."""
    if not min_s > 0:
        raise OptionsError(
            f"checkpoint_interval_min_s={min_s}; it must be positive (seconds between saves at most often)"
        )
    if max_s < min_s:
        raise OptionsError(
            f"checkpoint_interval_max_s={max_s} is below checkpoint_interval_min_s={min_s}; set it to at least {min_s}"
        )
    if not prior_mtbf_s > 0:
        raise OptionsError(
            f"checkpoint_mtbf_prior_s={prior_mtbf_s}; it must be positive (the assumed mean "
            "time between failures of every group at once, in seconds)"
        )
    if min_total_failures < 1:
        raise OptionsError(f"min_total_failures={min_total_failures}; it must be at least 1")


def check_cadence_options(
    interval: str,
    interval_steps: int,
    interval_s: float,
    group_world_size: int,
    min_s: float,
    max_s: float,
    prior_mtbf_s: float,
) -> None:
    """The manager's ``checkpoint_interval`` and the options it combines with (OptionsError)."""
    if interval not in ("fixed", "auto"):
        raise OptionsError(f"checkpoint_interval={interval!r}; use 'fixed' (checkpoint_interval_steps/_s) or 'auto'")
    if interval == "fixed":
        return
    if interval_steps or interval_s:
        raise OptionsError(
            f"checkpoint_interval='auto' with checkpoint_interval_steps={interval_steps} and "
            f"checkpoint_interval_s={interval_s}: 'auto' chooses the interval itself; unset those "
            "(bound it with checkpoint_interval_min_s/_max_s instead)"
        )
    if group_world_size > 1:
        raise OptionsError(
            f"checkpoint_interval='auto' with group_world_size={group_world_size}: the ranks of a "
            "group must save the same steps, and an interval in seconds can differ between them; "
            "use checkpoint_interval_steps"
        )
    check_cadence_limits(min_s, max_s, prior_mtbf_s)


@dataclass(frozen=True, slots=True)
class FailureHistory:
    """What a group has observed of the job's failures; plain numbers, carried as state."""

    observed_s: float = 0.0
    """Seconds of training observed (between committed steps)."""
    group_s: float = 0.0
    """Sum over those seconds of the groups taking part: each group's exposure to failure."""
    degraded_s: float = 0.0
    """Seconds during which fewer groups took part than ``max_groups``."""
    member_losses: int = 0
    total_failures: int = 0
    """Resumes from disk: every group was gone."""
    max_groups: int = 0
    """The most groups seen in one quorum: the job's size."""
    groups_now: int = 0
    """The groups of the latest quorum observed, ``G`` of the member-loss estimate."""


def observe(history: FailureHistory, *, seconds: float, num_groups: int) -> FailureHistory:
    """``seconds`` more of training with ``num_groups`` groups taking part."""
    if seconds <= 0 or num_groups <= 0:
        return replace(history, max_groups=max(history.max_groups, num_groups), groups_now=max(num_groups, 0))
    max_groups = max(history.max_groups, num_groups)
    return replace(
        history,
        groups_now=num_groups,
        observed_s=history.observed_s + seconds,
        group_s=history.group_s + seconds * num_groups,
        degraded_s=history.degraded_s + (seconds if num_groups < max_groups else 0.0),
        max_groups=max_groups,
    )


@dataclass(frozen=True, slots=True)
class MtbfEstimate:
    seconds: float
    source: MtbfSource
    reason: str


def member_loss_mtbf_s(history: FailureHistory) -> float | None:
    """Mean time between total failures if groups fail independently (module docstring);
    None before any loss has been seen over some observed time."""
    if history.member_losses == 0 or history.group_s <= 0 or history.max_groups == 0:
        return None
    rate = history.member_losses / history.group_s
    repair_s = history.degraded_s / history.member_losses
    unavailable = rate * repair_s / (1.0 + rate * repair_s)
    g = history.groups_now if history.groups_now > 0 else history.max_groups
    total_rate = g * rate * (1.0 - unavailable) * unavailable ** (g - 1)
    return math.inf if total_rate == 0 else 1.0 / total_rate


def estimate_total_mtbf(history: FailureHistory, limits: CadenceLimits) -> MtbfEstimate:
    """The mean time between total failures to plan for (module docstring)."""
    n = history.total_failures
    if n >= limits.min_total_failures and history.observed_s > 0:
        return MtbfEstimate(
            history.observed_s / n, "observed", f"{n} total failures in {history.observed_s:.0f}s observed"
        )
    independent = member_loss_mtbf_s(history)
    waiting = f"{n} of {limits.min_total_failures} total failures observed"
    if independent is not None and independent < limits.prior_mtbf_s:
        return MtbfEstimate(
            independent,
            "member_losses",
            f"{history.member_losses} member losses, {history.groups_now} of {history.max_groups} "
            f"groups taking part, in "
            f"{history.observed_s:.0f}s (down {history.degraded_s:.0f}s) give {independent:.0f}s, "
            f"below the prior {limits.prior_mtbf_s:g}s; {waiting}",
        )
    return MtbfEstimate(limits.prior_mtbf_s, "prior", f"the prior {limits.prior_mtbf_s:g}s; {waiting}")


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum compute time between saves; ``sqrt(2 C M)`` for ``C << M``."""
    if cost_s <= 0:
        return 0.0
    if math.isinf(mtbf_s):
        return math.inf
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    x = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - cost_s


@dataclass(frozen=True, slots=True)
class CadenceDecision:
    interval_s: float
    """Seconds between saves, within the limits."""
    rule_s: float | None
    """What the Young/Daly rule asked for before the limits (None: no save measured yet)."""
    cost_s: float | None
    mtbf: MtbfEstimate
    reason: str


def decide_interval(
    *, blocked_s: float | None, write_s: float | None, history: FailureHistory, limits: CadenceLimits
) -> CadenceDecision:
    """The interval between saves, from the last saves' measured ``blocked_s`` and ``write_s``
    (None before any save finished) and the failures observed."""
    mtbf = estimate_total_mtbf(history, limits)
    if blocked_s is None or write_s is None:
        return CadenceDecision(
            limits.min_s,
            None,
            None,
            mtbf,
            f"no save measured yet: the lower bound {limits.min_s:g}s, so the first save "
            f"measures the cost; MTBF {mtbf.reason}",
        )
    cost_s = blocked_s + write_s
    rule_s = daly_interval_s(cost_s, mtbf.seconds)
    floor_s = max(limits.min_s, write_s)
    ceiling_s = max(limits.max_s, floor_s)
    interval_s = min(max(rule_s, floor_s), ceiling_s)
    why = f"Young/Daly sqrt(2 x cost {cost_s:.3g}s x MTBF {mtbf.seconds:.4g}s) ~ {rule_s:.4g}s"
    if rule_s > ceiling_s:
        why += f", capped at the upper bound {ceiling_s:g}s"
    elif rule_s < floor_s:
        bound = f"one write ({write_s:.3g}s)" if write_s > limits.min_s else f"the lower bound {limits.min_s:g}s"
        why += f", raised to {bound}"
    return CadenceDecision(interval_s, rule_s, cost_s, mtbf, f"{why}; MTBF {mtbf.reason}")
