"""torchft's ``HTTPTransport`` and ``PGTransport`` send and receive a state dict over
replicaft's transfer: a sender process serves it, this process fetches it (in place where it
holds the same tensors), and what the sender no longer serves is refused within the deadline."""

from __future__ import annotations

import datetime
import time

import pytest
import torch
from conftest import spawn_python

from replicaft.compat.torchft.checkpointing import CheckpointTransport, HTTPTransport, PGTransport
from replicaft.errors import HealError, StateError

SENDER = """
import datetime, json, sys, threading
import torch
from replicaft.compat.torchft.checkpointing import HTTPTransport, PGTransport

kind = sys.argv[1]
timeout = datetime.timedelta(seconds=30)
transport = HTTPTransport(timeout, num_chunks=0) if kind == "http" else PGTransport(None, timeout, "cpu")
state = {"model": {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.int64)},
         "optim": {"state": {0: {"step": 7}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
         "extra": ("a", None, 2.5)}
transport.send_checkpoint([1], 5, state, timeout)
state["model"]["w"].zero_()  # the copy is made: changing the state now does not change what is served
print(json.dumps({"metadata": transport.metadata()}), flush=True)
threading.Event().wait(120)  # served until the test ends this process
"""


def _expected_model() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.int64)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["http", "pg"])
def test_a_state_sent_by_one_process_is_received_by_another(tmp_path, kind: str) -> None:
    script = tmp_path / "sender.py"
    script.write_text(SENDER)
    sender = spawn_python(str(script), kind, name=f"{kind}-sender")
    _, line = sender.wait_for_json(lambda o: "metadata" in o, 90, what="the sender's metadata")
    timeout = datetime.timedelta(seconds=30)
    if kind == "http":
        received = HTTPTransport(timeout).recv_checkpoint(0, line["metadata"], 5, timeout)
        model = received["model"]
    else:
        own = {"model": {"w": torch.zeros(300_000), "b": torch.zeros(3, dtype=torch.int64)}}
        received = PGTransport(None, timeout, "cpu", state_dict=lambda: own).recv_checkpoint(
            0, line["metadata"], 5, timeout
        )
        model = received["model"]
        assert model["w"] is own["model"]["w"], "a tensor the healer holds is received in place"
    for name, tensor in _expected_model().items():
        assert torch.equal(model[name], tensor), name
    assert received["optim"] == {"state": {0: {"step": 7}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    assert received["extra"] == ("a", None, 2.5)
    sender.kill()


@pytest.mark.timeout(60)
def test_a_step_not_served_is_refused_within_the_deadline() -> None:
    timeout = datetime.timedelta(seconds=2)
    sender = HTTPTransport(timeout)
    try:
        sender.send_checkpoint([1], 3, {"w": torch.ones(4)}, timeout)
        receiver = HTTPTransport(timeout)
        assert torch.equal(receiver.recv_checkpoint(0, sender.metadata(), 3, timeout)["w"], torch.ones(4))
        for step_asked, disallow in ((4, False), (3, True)):
            if disallow:
                sender.disallow_checkpoint()
            started = time.monotonic()
            with pytest.raises(HealError):
                receiver.recv_checkpoint(0, sender.address(), step_asked, timeout)
            assert time.monotonic() - started < timeout.total_seconds() + 5
    finally:
        sender.shutdown()


def test_what_cannot_travel_without_pickle_is_refused_at_send_naming_its_path() -> None:
    transport = PGTransport(None, datetime.timedelta(seconds=5), "cpu")
    try:
        with pytest.raises(StateError, match=r"state\.model\.fn"):
            transport.send_checkpoint([1], 1, {"model": {"fn": object()}}, datetime.timedelta(seconds=5))
    finally:
        transport.shutdown()


def test_bad_metadata_and_a_bare_base_class_say_what_to_do() -> None:
    transport = HTTPTransport(datetime.timedelta(seconds=5))
    with pytest.raises(Exception, match=r"metadata\(\)"):
        transport.recv_checkpoint(0, "<n/a>", 1, datetime.timedelta(seconds=5))
    with pytest.raises(NotImplementedError, match="HTTPTransport or PGTransport"):
        CheckpointTransport().send_checkpoint([1], 1, {}, datetime.timedelta(seconds=1))
