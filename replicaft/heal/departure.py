"""A heal whose donors all left: finish it at the step they left at, rather than strand it.

A healer catches up without holding its donors (catchup.py): they keep stepping while it
fetches, and it applies the fetch only at a step it commits with them, when the base plus the
steps it recorded reach their current step. When the donors end their run meanwhile (their
loop reached its last step and they shut down cleanly), no such step ever comes: the healer
asked for a quorum nobody else would join and failed at its deadline, holding everything it
needed. torchft's late-joiner tests (``local_sgd_integ_test.py``'s ``upscale``) ran into this
on every few runs: a group let in at the others' last two steps.

A member that leaves cleanly tells the lighthouse the steps it has committed, and the
lighthouse tells the others (``Notice.step`` of ``member_left``). So when every donor of the
catch-up has left at the same step N, and the base plus the recorded steps is N, the healer
holds exactly the donors' last state: each recorded step is one they committed (the same
count rule as at a commit, ``CatchUp.leads_to``). It applies the heal and stands at step N;
the step it was asking a quorum for does not commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def departed_at(donors: Iterable[str], left: Mapping[str, int], reached: int) -> int | None:
    """The step to finish the heal at: ``reached`` (base + recorded steps) if every one of
    ``donors`` left cleanly having committed exactly ``reached`` steps, else None."""
    donors = list(donors)
    if reached < 0 or not donors or any(left.get(d) != reached for d in donors):
        return None
    return reached
