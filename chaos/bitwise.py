"""Invariant ``bitwise_equal_to_reference``: a deterministic run ends bit for bit where its fault-free run ends. Pure.

A scenario with ``deterministic = true`` runs replicaft's deterministic mode
(replicaft/deterministic/rules.py), in which a step's committed update depends only on the step's
global batch, never on which groups took part. Faults then change when steps commit and who
computes them, but not what any step commits: after every step the job's state digest must be
the digest the fault-free reference run (``--reference``) reported after that step.

The digests compared are the ``committed`` events' (``digest``, one per (step, group rank),
DESIGN's invariant 1 checks that the groups agree on each); where groups disagree the majority
stands for the step (invariant 1 reports the offence). After every group was killed at once the
job resumes from disk and redoes steps: the later epoch's digest is the one that stands. A
missing final step in either run is a violation: "ends where it ends" needs both ends.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from chaos.invariants import Verdict, Violation, verdict
from chaos.timeline import Event, epoch_of, stream_key

BITWISE_EQUAL = "bitwise_equal_to_reference"
SHOWN = 5
"""Differing steps reported one by one; the rest are counted in the note."""

Digests = Mapping[tuple[int, int], str]
"""(step, group rank) -> the state digest after that step."""


def step_digests(events: Sequence[Event], epoch_starts: Sequence[float] = ()) -> dict[tuple[int, int], str]:
    """The digest that stands for each (step, group rank): the majority of the groups' in the
    latest epoch that reported the step."""
    reported: dict[tuple[int, int], dict[int, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for e in events:
        if e["event"] != "committed" or "digest" not in e:
            continue
        _, rank = stream_key(e)
        reported[(int(e["step"]), rank)][epoch_of(float(e["ts"]), epoch_starts)][str(e["digest"])] += 1
    return {key: by_epoch[max(by_epoch)].most_common(1)[0][0] for key, by_epoch in reported.items()}


def check_bitwise_equal(
    events: Sequence[Event],
    reference: Digests | None,
    *,
    deterministic: bool,
    target_steps: int,
    epoch_starts: Sequence[float] = (),
) -> Verdict:
    """Every step both runs committed left the same state, and both reached ``target_steps``."""
    if not deterministic:
        return Verdict(
            BITWISE_EQUAL,
            "not_checked",
            "the scenario does not run the deterministic mode "
            "(deterministic = true): its updates depend on membership by design",
        )
    if not reference:
        return Verdict(
            BITWISE_EQUAL, "not_checked", "no fault-free reference run with digests to compare with (pass --reference)"
        )
    ours = step_digests(events, epoch_starts)
    violations = []
    for name, digests in (("this run", ours), ("the fault-free reference", reference)):
        if not any(step == target_steps for step, _ in digests):
            reached = max((step for step, _ in digests), default=0)
            violations.append(
                Violation(
                    BITWISE_EQUAL,
                    reached,
                    None,
                    f"{name} reported no digest for the final step {target_steps} (last: {reached})",
                )
            )
    common = sorted(set(ours) & set(reference))
    differing = [(step, rank) for step, rank in common if ours[(step, rank)] != reference[(step, rank)]]
    for step, rank in differing[:SHOWN]:
        violations.append(
            Violation(
                BITWISE_EQUAL,
                step,
                None,
                f"state after step {step} (rank {rank}) is {ours[(step, rank)][:12]}, the fault-free "
                f"run's is {reference[(step, rank)][:12]}",
            )
        )
    note = f"{len(common)} (step, rank) digests compared with the fault-free run"
    if len(differing) > SHOWN:
        note += f"; {len(differing)} differ, the first {SHOWN} reported"
    elif not differing and any(step == target_steps for step, _ in common):
        note += f", the final step {target_steps} included: equal bit for bit"
    return verdict(BITWISE_EQUAL, violations, note)
