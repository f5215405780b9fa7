"""When a supervised process exits: restart it, leave it done, or give up. Pure.

Used by ``replicaft-launch`` (replicaft/launch/) for replica groups and the lighthouse, the
way Slurm's requeue or a Kubernetes restart policy treats a job's processes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class RestartDecision:
    action: Literal["done", "restart", "give_up"]
    delay_s: float
    reason: str


def decide_restart(
    exit_code: int, num_restarts: int, *, max_restarts: int, restart_delay_s: float, may_finish: bool = True
) -> RestartDecision:
    """What to do about a process that exited with ``exit_code`` after ``num_restarts`` restarts.

    Exit 0 is "done" when ``may_finish`` (a group that finished training); the lighthouse
    passes False, since a lighthouse exiting on its own is a failure while groups train.
    Anything else restarts after the delay until ``max_restarts`` is used up, as Slurm's
    requeue or a Kubernetes restart policy would; a crash loop then stops instead of spinning.
    """
    how = describe_exit(exit_code)
    if exit_code == 0 and may_finish:
        return RestartDecision("done", 0.0, how)
    if num_restarts >= max_restarts:
        return RestartDecision(
            "give_up",
            0.0,
            f"{how}; restarted {num_restarts} times already (--max-restarts {max_restarts}), leaving it down",
        )
    return RestartDecision(
        "restart", restart_delay_s, f"{how}; restart {num_restarts + 1} of {max_restarts} in {restart_delay_s:g}s"
    )


def describe_exit(exit_code: int) -> str:
    """``Popen.returncode`` in words: negative codes are the signal that killed the process."""
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exited with code {exit_code}"
