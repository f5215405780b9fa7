"""``dying_with_parent``: a program started through it is SIGKILLed by the kernel when the
process that started it dies, and the program itself (not a wrapper) holds the child's pid.
Real processes: a parent with busy threads starts ``sleep``, prints its pid, and is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT

from replicaft.process.process_tree import dying_with_parent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

WAIT_S = 10.0

PARENT = """\
import subprocess, sys, threading
from replicaft.process.process_tree import dying_with_parent
# Threads busy allocating at every fork: what made preexec_fn unsafe (issue 37).
for _ in range(4):
    threading.Thread(target=lambda: [bytearray(4096) for _ in iter(int, 1)], daemon=True).start()
child = subprocess.Popen(dying_with_parent(["sleep", "600"]))
print(child.pid, flush=True)
threading.Event().wait()
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent's reap counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_child_is_the_program_and_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + WAIT_S
        while not os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "sleep":
            assert time.monotonic() < deadline, "the child never became sleep itself"
            time.sleep(0.01)
        parent.send_signal(signal.SIGKILL)
        parent.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while _alive(pid):
            assert time.monotonic() < deadline, f"sleep (pid {pid}) outlived its SIGKILLed parent"
            time.sleep(0.01)
    finally:
        parent.kill()
        parent.wait(WAIT_S)


def test_without_setpriv_it_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match=r"setpriv \(util-linux\) is not on PATH"):
        dying_with_parent(["sleep", "1"])
