"""What a healer believes of its donors (replicaft/transfer/donors.py): a manifest it can tell it
could not load is refused, be it one donor's or several donors' agreed one (issue 37).

A single donor's manifest used to be applied as it came: only the tensors the healer also had
were checked (dtype, shape), so a skeleton placing a tensor elsewhere than its name, or lacking
a registered state, was voted on and loaded (or failed to load after the vote).
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import REPO_ROOT, spawn_python
from test_transfer import DEADLINE_S, STEP, donors, sample_snapshot, sample_state

from replicaft.errors import HealError
from replicaft.state.flat import flatten
from replicaft.transfer.client import fetch_state
from replicaft.transfer.donors import Donor, check_against_own
from replicaft.transfer.snapshot import Snapshot

NUM_BYTES = 4 * 1024 * 1024
DONOR_STEP = 11


def spawn_donor(*flags: str) -> Donor:
    """A donor as a real process (tests/support/transfer_donor.py), once it serves."""
    process = spawn_python(
        str(REPO_ROOT / "tests" / "support" / "transfer_donor.py"),
        "--num-bytes",
        str(NUM_BYTES),
        "--step",
        str(DONOR_STEP),
        *flags,
        name="transfer-donor",
    )
    _, serving = process.wait_for_json(lambda o: o.get("event") == "serving", 60.0, what="its address")
    return Donor("subprocess", serving["address"])


def test_a_single_donor_process_serving_a_misplaced_tensor_is_refused_issue_37() -> None:
    donor = spawn_donor("--misplace-tensor")
    with pytest.raises(
        HealError,
        match=r"from subprocess-donor names tensor 0 'state\.model\.w' but its skeleton puts it at 'state\.model\.v'",
    ):
        fetch_state([donor], DONOR_STEP, token=None, timeout_s=DEADLINE_S)


def test_a_single_donor_process_lacking_a_registered_state_is_refused_issue_37() -> None:
    donor = spawn_donor()
    required = {"model", "step", "extras", "optimizer"}
    with pytest.raises(
        HealError, match=r"from subprocess-donor lacks the states \['optimizer'\] that this rank registered"
    ):
        fetch_state([donor], DONOR_STEP, token=None, timeout_s=DEADLINE_S, required=required)
    result = fetch_state([donor], DONOR_STEP, token=None, timeout_s=DEADLINE_S, required=required - {"optimizer"})
    assert result.manifest.total_bytes >= NUM_BYTES


def misplaced(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with the skeleton's model tensors swapped (two same-sized tensors would load
    into each other's parameter; here the names alone disagree)."""
    model = snapshot.manifest.skeleton["model"]
    skeleton = {**snapshot.manifest.skeleton, "model": {"w": model["b"], "b": model["w"]}}
    return dataclasses.replace(snapshot, manifest=dataclasses.replace(snapshot.manifest, skeleton=skeleton))


def test_two_donors_agreeing_on_swapped_tensors_are_refused_too() -> None:
    liar = misplaced(sample_snapshot())
    with donors(("a", liar, None), ("b", liar, None)) as ds:
        with pytest.raises(HealError, match=r"names tensor \d 'state\.model\.[wb]' but its skeleton puts it at"):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)


def test_a_manifest_of_the_healers_own_kind_passes_every_check() -> None:
    own = flatten(sample_state(seed=1))
    expected = {
        n: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in zip(own.names, own.tensors, strict=True)
    }
    check_against_own(sample_snapshot().manifest, expected, 10 * NUM_BYTES, set(own.skeleton))
