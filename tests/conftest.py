"""Helpers for tests that run real processes: spawn, watch output with deadlines, clean up.

Integration tests never sleep to synchronise. A child's stdout and stderr are read by
background threads into timestamped lines, and a test waits, with a deadline, for the
line that shows the event it needs ("lighthouse serving gRPC at ...", a JSON line from a
member). On a timeout the error carries the tail of the child's output, so a failure says
what the process was doing.

Every process started through :func:`spawn` (and so :func:`start_lighthouse`) is
registered and killed after the test that started it, whatever the outcome; the autouse
fixture :func:`reap_processes` does that, and an ``atexit`` hook covers an interrupted run.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from lighthouse.server.announce import GRPC_LINE

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# One intra-op thread per torch process, this one and every child it starts (children inherit
# the environment). torch's default is one per core, and the tests run several training
# processes at once: on 2 cores, three groups of examples/train_ddp.py each spinning two
# OpenMP threads took 11 s for 60 steps instead of 2 s (the test models are a few KB, so a
# second thread never helped). setdefault: a run that sets it on purpose keeps its value.
os.environ.setdefault("OMP_NUM_THREADS", "1")

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a child's output and when (``time.monotonic()``) the test process read it."""

    index: int
    text: str
    read_at: float


class ManagedProcess:
    """A child process whose output is collected line by line, waited on with deadlines.

    Build it with :func:`spawn`. ``wait_for_line`` / ``wait_for_json`` block until a line
    matching a predicate appears, the process exits, or the deadline passes. ``mark()``
    returns the number of stdout lines seen so far, so a test can wait only for lines
    that arrive after an action (``after=mark``).
    """

    def __init__(self, args: Sequence[str], *, name: str, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.popen = subprocess.Popen(
            self.args,
            cwd=REPO_ROOT,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lines: dict[Stream, list[Line]] = {"stdout": [], "stderr": []}
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), name=f"{name}-{stream}", daemon=True)
            for stream in ("stdout", "stderr")
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self, stream: Stream) -> None:
        pipe = getattr(self.popen, stream)
        for text in pipe:
            with self._changed:
                lines = self._lines[stream]
                lines.append(Line(len(lines), text.rstrip("\n"), time.monotonic()))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def lines(self, stream: Stream = "stdout") -> list[Line]:
        with self._changed:
            return list(self._lines[stream])

    def mark(self, stream: Stream = "stdout") -> int:
        """The index the next line of ``stream`` will get: pass it as ``after=``."""
        with self._changed:
            return len(self._lines[stream])

    def output_tail(self, num_lines: int = 30) -> str:
        """The last lines of stdout and stderr, for failure messages."""
        out = "\n".join(line.text for line in self.lines("stdout")[-num_lines:])
        err = "\n".join(line.text for line in self.lines("stderr")[-num_lines:])
        return f"--- {self.name} (pid {self.pid}, exit {self.popen.poll()}) stdout:\n{out}\n--- stderr:\n{err}"

    def wait_for_line(
        self,
        predicate: Callable[[str], bool],
        timeout_s: float,
        *,
        stream: Stream = "stdout",
        after: int = 0,
        what: str = "a matching line",
    ) -> Line:
        """The first line at index >= ``after`` satisfying ``predicate``.

        Raises AssertionError naming ``what`` and showing the output tail when the deadline
        passes or the process exits (and its pipe drains) without such a line.
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self._lines[stream][after:]:
                    if predicate(line.text):
                        return line
                after = max(after, len(self._lines[stream]))
                remaining = deadline - time.monotonic()
                finished = self.popen.poll() is not None and not self._readers_alive()
                if remaining <= 0 or finished:
                    break
                self._changed.wait(min(remaining, 0.1))
        reason = "exited" if self.popen.poll() is not None else f"printed nothing like it within {timeout_s:g}s"
        raise AssertionError(f"{self.name} {reason} while waiting for {what}\n{self.output_tail()}")

    def wait_for_json(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout_s: float,
        *,
        after: int = 0,
        what: str = "a matching JSON line",
    ) -> tuple[Line, dict[str, Any]]:
        """Like :meth:`wait_for_line` over stdout lines that are JSON objects."""

        def matches(text: str) -> bool:
            obj = parse_json_line(text)
            return obj is not None and predicate(obj)

        line = self.wait_for_line(matches, timeout_s, after=after, what=what)
        obj = parse_json_line(line.text)
        assert obj is not None
        return line, obj

    def json_lines(self, *, after: int = 0) -> list[dict[str, Any]]:
        """Every stdout line from index ``after`` on that parses as a JSON object."""
        return [obj for line in self.lines()[after:] if (obj := parse_json_line(line.text)) is not None]

    def _readers_alive(self) -> bool:
        return any(reader.is_alive() for reader in self._readers)

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code (negative: killed by that signal); raises AssertionError on timeout."""
        try:
            code = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout_s:g}s\n{self.output_tail()}") from None
        for reader in self._readers:
            reader.join(timeout_s)
        return code

    def kill(self) -> None:
        """SIGKILL (a stopped process dies too) and reap it."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        for reader in self._readers:
            reader.join(5.0)


_live: list[ManagedProcess] = []
_live_lock = threading.Lock()


def spawn(args: Sequence[str], *, name: str, env: Mapping[str, str] | None = None) -> ManagedProcess:
    """Start a child process that is killed when the current test ends."""
    process = ManagedProcess(args, name=name, env=env)
    with _live_lock:
        _live.append(process)
    return process


def spawn_python(*args: str, name: str, env: Mapping[str, str] | None = None) -> ManagedProcess:
    """``spawn`` with this interpreter, unbuffered, and the repository on ``sys.path``."""
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
    return spawn([PYTHON, *args], name=name, env=child_env)


def kill_all() -> None:
    """Kill every process :func:`spawn` started that is still registered."""
    with _live_lock:
        processes = list(_live)
        _live.clear()
    for process in processes:
        try:
            process.kill()
        except Exception:  # cleanup must reach every process; one failure must not stop it
            pass


atexit.register(kill_all)


@pytest.fixture(autouse=True)
def reap_processes() -> Iterator[None]:
    """Kill the processes a test started once it ends, passed or failed."""
    yield
    kill_all()


def _replicaft_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("REPLICAFT_", "TORCHFT_"))}


@pytest.fixture(autouse=True)
def environment_kept() -> Iterator[None]:
    """A test leaves this process's replicaft settings as it found them (monkeypatch undoes its
    own). Every job a later test starts inherits them: CI once saw the Ray tests' groups all
    exit 2 at start there, and pass alone; a setting left behind fails here, at the test that left it."""
    before = _replicaft_environment()
    yield
    after = _replicaft_environment()
    assert after == before, f"the test changed os.environ's replicaft settings: {before} -> {after}"


def parse_json_line(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


# -- the lighthouse as a process ------------------------------------------------------------

LIGHTHOUSE_START_TIMEOUT_S = 15.0
_STATUS_LINE = re.compile(r"^lighthouse status page at (\S+)$")


@dataclass(frozen=True, slots=True)
class LighthouseProcess:
    """A running ``python -m lighthouse`` and the addresses it printed."""

    process: ManagedProcess
    grpc_address: str
    """``host:port`` for clients (``LighthouseClient(grpc_address, ...)``)."""
    status_url: str | None
    """``http://host:port/`` of the status page, or None when started without one."""

    @property
    def popen(self) -> subprocess.Popen[str]:
        return self.process.popen

    @property
    def port(self) -> int:
        return int(self.grpc_address.rsplit(":", 1)[1])


def closed_within(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout_s`` (whatever it sent before)."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def start_lighthouse(
    *extra_args: str,
    port: int = 0,
    status: bool = True,
    env: Mapping[str, str] | None = None,
    python_args: Sequence[str] = ("-m", "lighthouse"),
    timeout_s: float = LIGHTHOUSE_START_TIMEOUT_S,
) -> LighthouseProcess:
    """Start a lighthouse process and wait (with a deadline) until it prints its addresses.

    ``extra_args`` go to the CLI as given (``"--heartbeat-timeout", "30"``); ``port=0``
    lets it pick a free port, and ``status=True`` adds ``--status-port 0``. The process is
    killed when the test ends; kill or stop it earlier through ``.process``.
    ``python_args`` replaces ``-m lighthouse`` for wrappers that run the same CLI.
    """
    args = [*python_args, "--port", str(port), *extra_args]
    if status:
        args += ["--status-port", "0"]
    process = spawn_python(*args, name="lighthouse", env=env)
    grpc_line = process.wait_for_line(
        lambda text: GRPC_LINE.match(text) is not None, timeout_s, what="its gRPC address"
    )
    match = GRPC_LINE.match(grpc_line.text)
    assert match is not None
    status_url = None
    if status:
        status_line = process.wait_for_line(
            lambda text: _STATUS_LINE.match(text) is not None, timeout_s, what="its status page URL"
        )
        status_match = _STATUS_LINE.match(status_line.text)
        assert status_match is not None
        status_url = status_match.group(1)
    return LighthouseProcess(process, match.group(1), status_url)


def stop_gracefully(process: ManagedProcess, timeout_s: float = 10.0) -> int:
    """SIGCONT (in case it is stopped), SIGTERM, and wait for the exit code."""
    if process.popen.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
    return process.wait_exit(timeout_s)
