"""replicaft.local_sgd: the pure rules (schedule, leases, wire) and DiLoCo through a SIGKILL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, ManagedProcess, spawn_python, start_lighthouse
from hypothesis import given
from hypothesis import strategies as st

from chaos.invariants import check_exactly_once_samples, check_identical_digests
from replicaft.errors import OptionsError
from replicaft.local_sgd import wire
from replicaft.local_sgd.leases import Leases, positions, settle
from replicaft.local_sgd.schedule import SyncSchedule
from replicaft.telemetry.events import read_events_dir

# -- schedule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sync_every, fragments, delay, interval, start_at, fragments_by_step",
    [
        (20, 1, 0, 20, 20, [None, 0, 0, 0]),
        (20, 4, 0, 5, 5, [None, 0, 1, 2, 3, 0]),
        (20, 4, 2, 5, 3, [None, 0, 1, 2, 3, 0]),
        (6, 3, 1, 2, 1, [None, 0, 1, 2, 0]),
    ],
)
def test_schedule_spaces_fragment_syncs_evenly(
    sync_every: int, fragments: int, delay: int, interval: int, start_at: int, fragments_by_step: list[int | None]
) -> None:
    s = SyncSchedule(sync_every, fragments, delay)
    assert (s.interval, s.start_at) == (interval, start_at)
    assert [s.fragment_of(step) for step in range(len(fragments_by_step))] == fragments_by_step


@pytest.mark.parametrize(
    "sync_every, fragments, delay, fragment",
    [
        (0, 1, 0, "sync_every=0"),
        (10, 3, 0, "not a multiple"),
        (20, 4, 5, "fragment_sync_delay=5"),
        (5, 1, -1, "-1"),
        (4, 0, 0, "0 model"),
    ],
)
def test_schedule_rejects_impossible_settings_with_the_value(
    sync_every: int, fragments: int, delay: int, fragment: str
) -> None:
    with pytest.raises(OptionsError, match=fragment):
        SyncSchedule(sync_every, fragments, delay)


# -- leases ------------------------------------------------------------------------------------


def test_first_settle_leases_each_participant_the_next_round_in_order() -> None:
    leases, consumed = settle(Leases(), ["a", "b", "c"], ["a"], 10)
    assert consumed == ()
    assert leases.held == {"a": ((0, 10),), "b": ((10, 20),), "c": ((20, 30),)}
    assert leases.cursor == 30


def test_a_dead_groups_lease_goes_back_to_the_pool_and_is_leased_first() -> None:
    leases, _ = settle(Leases(), ["a", "b", "c"], [], 10)
    leases, consumed = settle(leases, ["a", "c"], ["a", "c"], 10)  # b died mid-round
    assert consumed == ((0, 10), (20, 30))
    assert leases.held == {"a": ((10, 20),), "c": ((30, 40),)}
    assert leases.pool == ()


def test_a_healer_contributes_nothing_and_its_lease_is_returned() -> None:
    leases, _ = settle(Leases(), ["a", "b"], [], 4)
    leases, consumed = settle(leases, ["a", "b"], ["a"], 6)
    assert consumed == ((0, 4),)
    assert leases.held == {"a": ((4, 10),), "b": ((10, 16),)}


def test_positions_count_across_a_leases_ranges() -> None:
    assert positions(((4, 8), (10, 12)), 2, 3) == [6, 7, 10]
    assert positions(((4, 8), (10, 12)), 4, 2) == [10, 11]


def test_leases_round_trip_through_their_state() -> None:
    leases, _ = settle(Leases(), ["a", "b"], [], 5)
    leases, _ = settle(leases, ["a"], ["a"], 5)
    assert Leases.from_state(leases.to_state()) == leases


@given(
    st.lists(
        st.tuples(st.sets(st.sampled_from("abcd"), min_size=1), st.sets(st.sampled_from("abcd"))),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 7),
)
def test_any_history_consumes_every_position_at_most_once_and_loses_none(
    rounds: list[tuple[set[str], set[str]]], per_group: int
) -> None:
    leases, seen = Leases(), []
    for participants, contributors in rounds:
        leases, consumed = settle(leases, sorted(participants), contributors, per_group)
        seen += [p for a, b in consumed for p in range(a, b)]
    open_positions = [p for a, b in leases.open_ranges() for p in range(a, b)]
    assert len(seen) == len(set(seen))
    assert sorted(seen + open_positions) == list(range(leases.cursor))


# -- wire --------------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 2, 3, 8])
def test_int8_words_average_to_within_half_a_step_of_the_mean(groups: int) -> None:
    g = torch.Generator().manual_seed(groups)
    values = [torch.randn(9000, generator=g) * (i + 1) for i in range(groups)]
    bias = wire.lane_bias(groups)
    scales = wire.scales_from_max(torch.stack([wire.chunk_max(v) for v in values]).amax(0), bias)
    words = sum(wire.encode_int8(v, scales, bias) for v in values) / groups
    mean = wire.decode_int8(words, scales, bias, groups, 9000)
    error = (mean - sum(values) / groups).abs().reshape(-1)
    step = torch.repeat_interleave(scales, wire.CHUNK)[:9000]
    assert bool((error <= step / 2 + 1e-6).all())
    assert words.numel() == 3000


def test_int8_zeros_from_a_healer_do_not_shift_the_mean() -> None:
    v = torch.linspace(-1, 1, 100)
    bias = wire.lane_bias(1)
    scales = wire.scales_from_max(wire.chunk_max(v), bias)
    words = (wire.encode_int8(v, scales, bias) + torch.zeros(34)) / 1  # a healer adds zeros; one contributor
    assert torch.allclose(wire.decode_int8(words, scales, bias, 1, 100), v, atol=float(scales.max()) / 2)


def test_int8_refuses_more_groups_than_a_byte_can_sum() -> None:
    with pytest.raises(OptionsError, match="bf16"):
        wire.lane_bias(128)


def test_unknown_wire_is_refused_with_the_choices() -> None:
    with pytest.raises(OptionsError, match="fp32, bf16, int8"):
        wire.check_wire("fp8")


# -- DiLoCo through a SIGKILL ---------------------------------------------------------------------

SCRIPT = str(REPO_ROOT / "examples" / "train_diloco.py")
TINY = [
    "--layers",
    "2",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--context",
    "32",
    "--batch-size",
    "4",
    "--corpus-bytes",
    "400000",
    "--threads",
    "1",
    "--eval-windows",
    "4",
    "--step-delay",
    "0.05",
]


def start_group(lighthouse: str, replica_id: str, events: Path, *args: str, **variables: str) -> ManagedProcess:
    """``variables``: more of the group's environment (``REPLICAFT_CHECKPOINT_DIR=...``)."""
    env = dict(
        os.environ,
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_DIGEST_EVERY_STEPS="0",
        PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        **variables,
    )
    return spawn_python(SCRIPT, *TINY, *args, name=replica_id, env=env)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_streaming_diloco_survives_a_sigkill_mid_round_healing_from_two_donors_issue_21(tmp_path: Path) -> None:
    """Three groups, so the restarted one heals from two donors: their inner optimizers differ
    by design, and while they were served every such heal failed ("donors disagree") and the
    restarted group never rejoined (issue 21)."""
    lh = start_lighthouse(status=False)
    args = ["--syncs", "40", "--sync-every", "6", "--fragments", "2", "--delay", "1", "--wire", "int8"]
    g0 = start_group(lh.grpc_address, "g0", tmp_path, *args)
    g1 = start_group(lh.grpc_address, "g1", tmp_path, *args)
    g2 = start_group(lh.grpc_address, "g2", tmp_path, *args)
    g1.wait_for_json(lambda o: o.get("event") == "sync" and o["step"] >= 6, 120, what="g1 past sync 6")
    g1.wait_for_json(lambda o: o.get("event") == "sync" and o["step"] >= 7, 60, what="g1 mid-round after sync 7")
    g1.kill()
    g1 = start_group(lh.grpc_address, "g1", tmp_path, *args)
    finals = [
        g.wait_for_json(lambda o: o.get("event") == "final", 180, what=f"{name} final state")[1]
        for name, g in (("g0", g0), ("g1", g1), ("g2", g2))
    ]
    assert g0.wait_exit(30) == 0 and g1.wait_exit(30) == 0 and g2.wait_exit(30) == 0
    # The replicated state agrees; the parameters need not (streaming: a fragment not synced
    # at the last step keeps each group's own inner steps).
    assert len({f["digest"] for f in finals}) == 1, finals
    first = next(o for o in g1.json_lines() if o.get("event") == "sync")
    assert first["step"] > 8, "the restarted group should heal at the next sync, not start over"
    events = read_events_dir(tmp_path)
    digests = check_identical_digests(events)
    samples = check_exactly_once_samples(events)
    assert digests.status == "held", digests
    assert samples.status == "held", samples
    starts = [e for e in events if e["event"] == "heal_start" and e["replica_id"] == "g1"]
    assert sorted(starts[-1]["donors"]) == ["g0", "g2"], starts
    heals = [e for e in events if e["event"] == "heal_end" and e["replica_id"] == "g1"]
    assert heals and heals[-1]["ok"], heals


# -- sharded (FSDP2) parameters ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "mode",
    [["--fragments", "2", "--delay", "1"], ["--local-sgd"]],
    ids=["streaming_diloco", "local_sgd"],
)
def test_fsdp2_parameters_sync_heal_and_resume_as_local_shards(tmp_path: Path, mode: list[str]) -> None:
    """Issue 43: with FSDP2, parameters are DTensors even on one rank (torchtitan always shards),
    and the first sync crashed (``aten.sub.out got mixed torch.Tensor and DTensor``; then Gloo,
    handed a DTensor, aborted the process). Two groups sync their local shards; one is SIGKILLed
    mid-run and heals from the other; then both are gone and a new pair resumes from the
    persistent checkpoint, whose synced copy and outer momentum are DTensors again."""
    lh = start_lighthouse("--min-replicas", "2", status=False)
    checkpoints = {"REPLICAFT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "REPLICAFT_CHECKPOINT_INTERVAL_STEPS": "4"}
    args = ["--syncs", "12", "--sync-every", "4", "--fsdp", *mode]

    def group(name: str, syncs: list[str] = args) -> ManagedProcess:
        return start_group(lh.grpc_address, name, tmp_path / "events", *syncs, **checkpoints)

    g0, g1 = group("g0"), group("g1")
    g1.wait_for_json(lambda o: o.get("event") == "sync" and o["step"] >= 4, 120, what="g1 past sync 4")
    g1.kill()
    g1 = group("g1")
    finals = [g.wait_for_json(lambda o: o.get("event") == "final", 180, what="final")[1] for g in (g0, g1)]
    assert g0.wait_exit(30) == 0 and g1.wait_exit(30) == 0, (g0.output_tail(), g1.output_tail())
    assert len({f["digest"] for f in finals}) == 1, finals
    first = next(o for o in g1.json_lines() if o.get("event") == "sync")
    assert first["step"] > 4, "the restarted group healed at its first sync, not from scratch"
    heals = [e for e in read_events_dir(tmp_path / "events") if e["event"] == "heal_end" and e["replica_id"] == "g1"]
    assert heals and heals[-1]["ok"], heals

    more = ["--syncs", "16", *args[2:]]
    r0, r1 = group("g0", more), group("g1", more)
    resumed = [g.wait_for_json(lambda o: o.get("event") == "final", 180, what="final")[1] for g in (r0, r1)]
    assert r0.wait_exit(30) == 0 and r1.wait_exit(30) == 0, (r0.output_tail(), r1.output_tail())
    assert len({f["digest"] for f in resumed}) == 1 and resumed[0]["step"] == 16, resumed
    resumes = [e for e in read_events_dir(tmp_path / "events") if e["event"] == "resume"]
    assert resumes and {e["checkpoint_step"] for e in resumes} == {resumes[0]["checkpoint_step"]}, resumes
    assert resumes[0]["checkpoint_step"] >= 8, resumes
