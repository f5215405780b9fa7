"""``replicaft-launch``: a whole replicaft job on one machine, a lighthouse plus N replica groups.

The launcher plays the part Slurm or Kubernetes plays on a cluster: it starts every replica
group, and when one dies it starts it again, under the same replica id, after a delay. The
restarted group heals from its peers by itself; the launcher knows nothing about training and
never touches state. A group that exits 0 has finished training and stays down.

Design:

* The decisions are pure functions beside the shell that acts on them: :func:`parse_args`
  (every argument check), ``restart_policy.decide_restart`` (restart, done or give up),
  ``job_status.render_status``, ``console.label_torchrun_line`` and
  ``process_tree.descendants``. The :class:`Launcher` only starts, polls and signals
  processes and prints.
* Every child starts in a session of its own. Ctrl-C in a terminal then reaches only the
  launcher, which stops everything in order (SIGTERM, a grace period, SIGKILL) instead of
  racing torchrun's own signal forwarding.
* torchrun starts each rank in yet another session, so no process group covers a W>1 group.
  The launcher instead signals, one by one, every process below it in ``/proc``; and it is a
  child subreaper (``PR_SET_CHILD_SUBREAPER``), so ranks orphaned by a killed torchrun are
  re-parented to it rather than to init, and are found and killed with their group.
  Rejected: recording descendants periodically (a rank started since the last scan escapes),
  psutil (a dependency for a 20-line ``/proc`` walk), and ``PR_SET_PDEATHSIG`` through
  ``preexec_fn`` (unsafe while output reader threads run). The cost: a launcher killed with
  SIGKILL cannot clean up after itself, and the launcher runs on Linux only.
* The status line reads the structured event logs (STYLE §9), never the children's log text,
  so the launcher always sets ``REPLICAFT_EVENTS_DIR`` (a temporary directory by default).
* A restart runs in a warm standby when one is ready (``replicaft.standby``: an interpreter
  that has already imported torch and replicaft, which takes ~2.5 s here): the launcher writes
  the group's variables to its stdin and it becomes the group. With W = 1 the launcher keeps
  ``--standbys`` of them (default 1). It starts them only while no group is in its start-up
  (every running group has committed since it started, or ``STANDBY_QUIET_S`` have passed),
  so that their imports never compete for the CPU with a group's start or heal. A standby that
  exits before it is used turns standbys off for the run, with a message, and restarts go cold.
  Once the groups have reported the size of their state, each standby is asked to fault in that
  much memory (``--no-standby-reserve`` not to), for the restarted group's buckets and heal
  (``replicaft.reserve``). With W > 1 torchrun starts the ranks, so restarts are always cold.
* Every server of the job is authenticated: when the launcher starts the lighthouse and
  ``REPLICAFT_TOKEN`` is unset, it makes a secret for this job and hands it to the lighthouse,
  every group and every standby (in their environment, never on a command line, which any
  local user can read in ``/proc``). A job against an outside lighthouse (``--lighthouse``)
  uses that lighthouse's token, which the caller sets.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NoReturn

from lighthouse.membership import MAX_MEMBERS
from lighthouse.option_checks import MAX_SECONDS, check_number
from lighthouse.options import TOKEN_ENV
from lighthouse.replica_id import check_replica_id
from replicaft.console import (
    TORCHRUN_ROLE,
    Console,
    ConsoleLogHandler,
    label_single_rank_line,
    label_torchrun_line,
)
from replicaft.errors import OptionsError
from replicaft.events import EventTail
from replicaft.job_status import EventProgress, GroupState, GroupStatus, render_status
from replicaft.process_tree import become_subreaper, read_process_table, running_below, send_signal
from replicaft.restart_policy import decide_restart, describe_exit
from replicaft.standby import (
    READY_LINE,
    RESERVED_LINE,
    encode_activation,
    encode_reserve,
    reserve_bytes_for,
)

logger = logging.getLogger(__name__)

PROG = "replicaft-launch"
LIGHTHOUSE_START_TIMEOUT_S = 60.0
"""Generous: on a loaded two-core machine importing grpc alone has taken several seconds."""
TICK_S = 0.1
"""How often the supervisor polls its children: restart latency is a tick plus the delay."""
KILL_WAIT_S = 5.0
"""After SIGKILL only a process stuck in the kernel survives; we wait this long, then report it."""
STANDBY_QUIET_S = 30.0
"""A standby starts once every running group has committed since its start, or this long after
the latest start (for scripts that write no events, or a group that cannot commit alone)."""
_GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Removed from the groups' environment: torchrun sets them per rank, and a W = 1 group has none."""
_LIGHTHOUSE_ADDRESS_LINE = re.compile(r"^lighthouse serving gRPC at (\S+)$")
_RESERVED = re.compile(rf"{re.escape(RESERVED_LINE)} (\d+) bytes, pid (\d+)")


# -- arguments ------------------------------------------------------------------------------


MAX_LOCAL_PROCESSES = 1024
"""Groups, ranks per group or standbys on one machine: each is a process with its own ports,
and past this the machine's limits decide, not replicaft; a cluster's scheduler starts more."""
MAX_RESTARTS = 1_000_000
"""Restarts per group; at the shortest delay, more than a job restarting for weeks."""

NUMBER_FLAGS: dict[str, tuple[str, float, float]] = {
    # field: (its flag, lowest, highest). Every int and float field of LaunchOptions is here
    # (checked at import): NaN, inf, a negative or a huge value is refused naming the flag
    # (a NaN --restart-delay left dead groups never restarted, issue 19).
    "num_groups": ("--groups", 1, MAX_LOCAL_PROCESSES),
    "ranks_per_group": ("--ranks-per-group", 1, MAX_LOCAL_PROCESSES),
    "restart_delay_s": ("--restart-delay", 0.0, MAX_SECONDS),
    "max_restarts": ("--max-restarts", 0, MAX_RESTARTS),
    "min_replicas": ("--min-replicas", 1, MAX_MEMBERS),
    "status_interval_s": ("--status-interval", 0.001, MAX_SECONDS),
    "stop_grace_s": ("--stop-grace", 0.001, MAX_SECONDS),
    "standbys": ("--standbys", 0, MAX_LOCAL_PROCESSES),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchOptions:
    script: Path
    """The training script every rank of every group runs."""
    script_args: tuple[str, ...] = ()
    lighthouse: str | None = None
    """``host:port`` of a running lighthouse; None starts one on a free loopback port."""
    num_groups: int = 2
    ranks_per_group: int = 1
    """W; above 1 each group runs under torchrun."""
    restart_delay_s: float = 1.0
    max_restarts: int = 10
    """Restarts allowed per group; one more failure leaves the group down."""
    events_dir: Path | None = None
    """Where the groups write their event logs; None uses a temporary directory."""
    min_replicas: int | None = None
    """Passed to the lighthouse and to every manager; None keeps their default."""
    replica_prefix: str = "g"
    status_interval_s: float = 5.0
    """Period of the plain status line when stderr is not a terminal."""
    stop_grace_s: float = 10.0
    """Time between SIGTERM and SIGKILL when stopping a process."""
    standbys: int | None = None
    """Warm standby processes kept for restarts; None: 1 with W = 1, 0 otherwise."""
    standby_reserve: bool = True
    """Have each standby fault in memory for the restarted group's buckets and heal (reserve.py)."""

    def __post_init__(self) -> None:
        for name, (flag, lo, hi) in NUMBER_FLAGS.items():
            value, kind = getattr(self, name), _FIELD_TYPES[name]
            if value is not None or not kind.endswith("| None"):
                check_number(flag, value, lo, hi, integer=kind.startswith("int"), error=OptionsError,
                             fix="in seconds" if kind.startswith("float") else "")
        if not isinstance(self.standby_reserve, bool):
            raise OptionsError(f"standby_reserve={self.standby_reserve!r}; give True or False (--no-standby-reserve)")
        if self.lighthouse is not None:
            host, _, port = self.lighthouse.rpartition(":")
            if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
                raise OptionsError(f"--lighthouse {self.lighthouse!r} is not host:port (e.g. 127.0.0.1:29510)")
        if self.min_replicas is not None and self.lighthouse is None and self.min_replicas > self.num_groups:
            raise OptionsError(
                f"--min-replicas {self.min_replicas} is more than --groups {self.num_groups}, so no "
                f"quorum could ever form; lower --min-replicas or raise --groups"
            )
        if self.standbys and self.ranks_per_group > 1:
            raise OptionsError(
                f"--standbys {self.standbys} with --ranks-per-group {self.ranks_per_group}: torchrun starts the "
                "ranks of a W > 1 group, so they cannot run in a standby; use --standbys 0"
            )
        if not isinstance(self.replica_prefix, str):
            raise OptionsError(f"--replica-prefix {self.replica_prefix!r}; give a string such as 'g'")
        # The one rule for replica ids (lighthouse/replica_id.py); the last id is the longest.
        check_replica_id(f"{self.replica_prefix}{self.num_groups - 1}", error=OptionsError,
                         where=f"--replica-prefix {self.replica_prefix!r}: the replica id")

    def replica_ids(self) -> list[str]:
        return [f"{self.replica_prefix}{i}" for i in range(self.num_groups)]

    def num_standbys(self) -> int:
        if self.standbys is not None:
            return self.standbys
        return 1 if self.ranks_per_group == 1 else 0


_FIELD_TYPES = {f.name: str(f.type) for f in fields(LaunchOptions)}
assert NUMBER_FLAGS.keys() == {n for n, t in _FIELD_TYPES.items() if t.split(" |")[0] in ("int", "float")}, (
    "every numeric LaunchOptions field needs its flag and range in NUMBER_FLAGS"
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so every error is one line."""

    def error(self, message: str) -> NoReturn:
        raise OptionsError(message)


def parse_args(argv: Sequence[str] | None = None) -> LaunchOptions:
    """Map the command line onto :class:`LaunchOptions`; raises OptionsError naming the flag."""
    d = LaunchOptions(script=Path())
    p = _Parser(prog=PROG, description="Run a lighthouse and N replica groups of SCRIPT; restart groups that die.")
    p.add_argument("--lighthouse", metavar="HOST:PORT", help="use this lighthouse instead of starting one")
    p.add_argument("--groups", type=int, default=d.num_groups, metavar="N", help="replica groups (default: %(default)s)")
    p.add_argument("--ranks-per-group", type=int, default=d.ranks_per_group, metavar="W",
                   help="ranks per group; above 1 runs each group under torchrun (default: %(default)s)")
    p.add_argument("--restart-delay", type=float, default=d.restart_delay_s, metavar="S",
                   help="seconds before a dead group is restarted (default: %(default)s)")
    p.add_argument("--max-restarts", type=int, default=d.max_restarts, metavar="K",
                   help="restarts per group before it is left down (default: %(default)s)")
    p.add_argument("--events-dir", type=Path, metavar="DIR", help="keep the groups' event logs here")
    p.add_argument("--min-replicas", type=int, metavar="M", help="fewest groups a quorum may have")
    p.add_argument("--replica-prefix", default=d.replica_prefix, help="replica ids are PREFIX0, PREFIX1, ...")
    p.add_argument("--status-interval", type=float, default=d.status_interval_s, metavar="S",
                   help="period of the status line when stderr is not a terminal (default: %(default)s)")
    p.add_argument("--stop-grace", type=float, default=d.stop_grace_s, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping (default: %(default)s)")
    p.add_argument("--standbys", type=int, metavar="K",
                   help="warm standby processes (torch already imported) that restarted groups run in; "
                   "W = 1 only (default: 1 with W = 1, else 0)")
    p.add_argument("--no-standby-reserve", dest="standby_reserve", action="store_false",
                   help="do not have standbys fault in memory the size of a group's state for its restart "
                   "(each then holds ~300 MB instead of that much more)")
    p.add_argument("script", metavar="SCRIPT", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for SCRIPT")
    args = p.parse_args(argv)
    script = Path(args.script)
    if not script.is_file():
        raise OptionsError(f"SCRIPT {args.script!r} is not a file")
    if args.events_dir is not None and args.events_dir.exists() and not args.events_dir.is_dir():
        raise OptionsError(f"--events-dir {str(args.events_dir)!r} exists and is not a directory")
    return LaunchOptions(
        script=script,
        script_args=tuple(args.script_args),
        lighthouse=args.lighthouse,
        num_groups=args.groups,
        ranks_per_group=args.ranks_per_group,
        restart_delay_s=args.restart_delay,
        max_restarts=args.max_restarts,
        events_dir=args.events_dir,
        min_replicas=args.min_replicas,
        replica_prefix=args.replica_prefix,
        status_interval_s=args.status_interval,
        stop_grace_s=args.stop_grace,
        standbys=args.standbys,
        standby_reserve=args.standby_reserve,
    )


def job_secret(options: LaunchOptions, environ: Mapping[str, str]) -> dict[str, str]:
    """``{REPLICAFT_TOKEN: secret}`` to add to every child's environment, or nothing.

    A fresh secret when the launcher starts the lighthouse itself and the caller set no token;
    nothing when the caller set one (it is inherited, even empty, which the children refuse
    by name) or the lighthouse is someone else's (its token is the caller's to set)."""
    if options.lighthouse is not None or TOKEN_ENV in environ:
        return {}
    return {TOKEN_ENV: secrets.token_urlsafe(32)}


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now; torchrun needs a number before it binds its store."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Child:
    """One process the launcher started, in a session of its own, whose output is labelled.

    A reader thread passes each line of its stdout and stderr (merged) to ``on_line``, which a
    standby's activation replaces; it ends when the last process holding the pipe exits, and
    :meth:`join_output` waits for it. Its stdin is ``/dev/null``, or a pipe with ``stdin_pipe``.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], on_line: Callable[[str], None], *,
                 stdin_pipe: bool = False) -> None:
        self.on_line = on_line
        self.popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"output-{self.pid}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.on_line(line.rstrip("\n"))

    def join_output(self, timeout_s: float) -> None:
        self._reader.join(timeout_s)


# -- the launcher -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Group:
    replica_id: str
    state: GroupState = "waiting"
    child: Child | None = None
    num_restarts: int = 0
    restart_at: float = 0.0
    started_ts: float = 0.0
    """Wall time of the latest start, as in the events' ``ts``."""
    committed_since_start: bool = False


class Launcher:
    """Starts the lighthouse and the groups, restarts dead groups, and stops everything.

    ``run()`` blocks until every group is done or down, or :meth:`request_stop` is called
    (from a signal handler), and returns the exit code. Whatever happens, every process it
    started is gone when ``run()`` returns.
    """

    def __init__(self, options: LaunchOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self._groups = [_Group(rid) for rid in options.replica_ids()]
        self._lighthouse: Child | None = None
        self._lighthouse_address: str | None = options.lighthouse
        self._lighthouse_restarts = 0
        self._lighthouse_restart_at: float | None = None
        self._address_seen = threading.Event()
        self._stop_signal: int | None = None
        self._kill_now = False
        self._work_dir: Path | None = None
        self._events_dir: Path | None = options.events_dir
        self._standbys: list[Child] = []
        self._standbys_off = options.num_standbys() == 0
        self._state_cpu_bytes = 0
        """The most host memory any group's state has reported (``state_size`` events)."""
        self._reserve_asked: dict[int, int] = {}
        """Standby pid -> the reserve it was asked for."""
        self._latest_start = time.monotonic()
        self._job_secret = job_secret(options, os.environ)

    def request_stop(self, signum: int) -> None:
        """Ask ``run()`` to stop everything; a second request skips the grace period. Signal-safe."""
        if self._stop_signal is None:
            self._stop_signal = signum
        else:
            self._kill_now = True

    def run(self) -> int:
        if not become_subreaper():
            logger.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: ranks orphaned by a dead torchrun will not be stopped")
        self._work_dir = Path(tempfile.mkdtemp(prefix="replicaft-launch-"))
        if self._events_dir is None:
            self._events_dir = self._work_dir / "events"
        self._events_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self._lighthouse_address is None and not self._start_lighthouse(port=0):
                return self._signal_exit_code() or 1
            logger.info("lighthouse at %s; %d groups of %d ranks; events in %s", self._lighthouse_address,
                        len(self._groups), self.options.ranks_per_group, self._events_dir)
            return self._supervise()
        finally:
            self._stop_all()
            self.console.close()
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def _signal_exit_code(self) -> int | None:
        return None if self._stop_signal is None else 128 + self._stop_signal

    # -- lighthouse

    def _start_lighthouse(self, port: int) -> bool:
        """Start ``python -m lighthouse``; with port 0, wait (with a deadline) for its address."""
        args = [sys.executable, "-m", "lighthouse", "--port", str(port)]
        if self.options.min_replicas is not None:
            args += ["--min-replicas", str(self.options.min_replicas)]
        env = {**os.environ, **self._job_secret, "PYTHONUNBUFFERED": "1"}
        self._lighthouse = Child(args, env, self._on_lighthouse_line)
        if port:
            return True
        deadline = time.monotonic() + LIGHTHOUSE_START_TIMEOUT_S
        while not self._address_seen.wait(TICK_S):
            if self._stop_signal is not None:
                return False
            if self._lighthouse.popen.poll() is not None:
                logger.error("the lighthouse %s before printing its address", describe_exit(self._lighthouse.popen.returncode))
                return False
            if time.monotonic() >= deadline:
                logger.error("the lighthouse printed no address within %gs", LIGHTHOUSE_START_TIMEOUT_S)
                return False
        return True

    def _on_lighthouse_line(self, line: str) -> None:
        match = _LIGHTHOUSE_ADDRESS_LINE.match(line)
        if match is not None and self._lighthouse_address is None:
            self._lighthouse_address = match.group(1)
            self._address_seen.set()
        self.console.write_line(f"[lighthouse] {line}")

    def _watch_lighthouse(self, now: float) -> bool:
        """Restart a lighthouse that died, on the same port; False once it may not restart."""
        if self._lighthouse is None or self._lighthouse.popen.poll() is None:
            return True
        if self._lighthouse_restart_at is None:
            decision = decide_restart(
                self._lighthouse.popen.returncode, self._lighthouse_restarts, may_finish=False,
                max_restarts=self.options.max_restarts, restart_delay_s=self.options.restart_delay_s,
            )
            logger.warning("lighthouse %s", decision.reason)
            if decision.action == "give_up":
                return False
            self._lighthouse_restart_at = now + decision.delay_s
        elif now >= self._lighthouse_restart_at:
            assert self._lighthouse_address is not None
            self._lighthouse_restarts += 1
            self._lighthouse_restart_at = None
            self._start_lighthouse(port=int(self._lighthouse_address.rpartition(":")[2]))
            logger.info("restarted the lighthouse at %s", self._lighthouse_address)
        return True

    # -- groups

    def _base_env(self) -> dict[str, str]:
        """The environment of every group process, and of a standby, before the group's own variables."""
        env = {k: v for k, v in os.environ.items() if k not in _GROUP_VARIABLES}
        env.update(self._job_secret)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _group_variables(self, group: _Group) -> dict[str, str]:
        """What makes a process ``group``: set at spawn, or by a standby's activation."""
        assert self._lighthouse_address is not None and self._events_dir is not None
        variables = {
            "REPLICAFT_LIGHTHOUSE": self._lighthouse_address,
            "REPLICAFT_REPLICA_ID": group.replica_id,
            "REPLICAFT_EVENTS_DIR": str(self._events_dir),
        }
        if self.options.min_replicas is not None:
            variables["REPLICAFT_MIN_REPLICAS"] = str(self.options.min_replicas)
        return variables

    def _start_group(self, group: _Group) -> None:
        o = self.options
        assert self._work_dir is not None
        rid = group.replica_id
        group.started_ts, group.committed_since_start = time.time(), False
        self._latest_start = time.monotonic()
        group.state = "running"
        restart = f", restart {group.num_restarts}" if group.num_restarts else ""
        label = functools.partial(label_torchrun_line if o.ranks_per_group > 1 else label_single_rank_line, rid)

        def on_line(line: str) -> None:
            self.console.write_line(label(line))

        standby = self._take_standby(group) if group.num_restarts else None
        if standby is not None:
            group.child = standby
            standby.on_line = on_line
            logger.info("started %s in warm standby pid %d%s", rid, standby.pid, restart)
            return
        argv = [sys.executable, str(o.script), *o.script_args]
        if o.ranks_per_group > 1:
            argv = [
                sys.executable, "-m", "torch.distributed.run",
                "--nproc-per-node", str(o.ranks_per_group), "--max-restarts", "0",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                "--monitor-interval", "0.1", "--shutdown-timeout", f"{o.stop_grace_s:g}",
                "--role", TORCHRUN_ROLE, "--tee", "3", "--log-dir", str(self._work_dir / "torchrun" / rid),
                str(o.script), *o.script_args,
            ]  # fmt: skip
        group.child = Child(argv, {**self._base_env(), **self._group_variables(group)}, on_line)
        logger.info("started %s (pid %d)%s", rid, group.child.pid, restart)

    def _note_event(self, event: Mapping[str, object]) -> None:
        """Mark a group that has committed since its latest start (standbys wait for that); note
        the size of the groups' state (standbys' reserves are sized by it)."""
        if event.get("event") == "state_size":
            size = event.get("cpu_bytes")
            if isinstance(size, int) and not isinstance(size, bool):
                self._state_cpu_bytes = max(self._state_cpu_bytes, size)
            return
        if event.get("event") != "commit" or not event.get("committed"):
            return
        ts = event.get("ts")
        for group in self._groups:
            if group.replica_id == event.get("replica_id") and isinstance(ts, (int, float)) and ts >= group.started_ts:
                group.committed_since_start = True

    # -- standbys

    def _take_standby(self, group: _Group) -> Child | None:
        """A live standby, activated as ``group``; None when there is none (the restart goes cold)."""
        while self._standbys:
            standby = self._standbys.pop(0)
            self._reserve_asked.pop(standby.pid, None)
            assert standby.popen.stdin is not None
            try:
                standby.popen.stdin.write(encode_activation(self._group_variables(group)))
                standby.popen.stdin.close()
            except OSError as e:  # it died since the last tick
                logger.warning("warm standby pid %d could not be activated (%s); trying the next", standby.pid, e)
                self._terminate([standby], grace_s=0.0)
                continue
            return standby
        return None

    def _on_standby_line(self, line: str) -> None:
        if line.startswith(READY_LINE):
            logger.info("warm standby pid %s ready", line.rsplit(" ", 1)[1])
        elif match := _RESERVED.fullmatch(line):
            logger.info("warm standby pid %s reserved %.1f MB for a restart", match.group(2), int(match.group(1)) / 1e6)
        else:
            self.console.write_line(f"[standby] {line}")

    def _watch_standbys(self, now: float) -> None:
        """Drop standbys that died unused (and stop starting them); start one when it is quiet."""
        for standby in list(self._standbys):
            code = standby.popen.poll()
            if code is not None:
                self._standbys.remove(standby)
                self._reserve_asked.pop(standby.pid, None)
                self._standbys_off = True
                logger.warning("warm standby pid %d %s before it was used; restarts start cold from now on",
                               standby.pid, describe_exit(code))
        starting_up = any(g.state == "running" and not g.committed_since_start for g in self._groups)
        quiet = not starting_up or now - self._latest_start >= STANDBY_QUIET_S
        if self._standbys_off or not quiet:
            return
        self._ask_reserves()
        if len(self._standbys) >= self.options.num_standbys():
            return
        o = self.options
        argv = [sys.executable, "-m", "replicaft.standby", str(o.script), *o.script_args]
        standby = Child(argv, self._base_env(), self._on_standby_line, stdin_pipe=True)
        self._standbys.append(standby)
        logger.info("starting warm standby pid %d", standby.pid)

    def _ask_reserves(self) -> None:
        """Ask every standby for a reserve the size of the largest state reported, unless it has
        one that large; at quiet times only, as faulting it in takes a core for a second or two."""
        size = reserve_bytes_for(self._state_cpu_bytes) if self.options.standby_reserve else 0
        for standby in self._standbys:
            if size <= self._reserve_asked.get(standby.pid, 0):
                continue
            assert standby.popen.stdin is not None
            try:
                standby.popen.stdin.write(encode_reserve(size))
                standby.popen.stdin.flush()
            except OSError as e:  # it died since the last tick: dropped at the next one
                logger.warning("warm standby pid %d could not be asked for a reserve (%s)", standby.pid, e)
                continue
            self._reserve_asked[standby.pid] = size

    def _watch_group(self, group: _Group, now: float) -> None:
        if group.state == "waiting" and now >= group.restart_at:
            if group.child is not None:
                group.num_restarts += 1
            self._start_group(group)
        elif group.state == "running":
            assert group.child is not None
            code = group.child.popen.poll()
            if code is None:
                return
            # A group is its failure domain: ranks orphaned by a dead torchrun go with it, at once.
            self._terminate([], grace_s=0.0)
            decision = decide_restart(
                code, group.num_restarts, max_restarts=self.options.max_restarts,
                restart_delay_s=self.options.restart_delay_s,
            )
            level = logging.INFO if decision.action == "done" else logging.WARNING
            logger.log(level, "%s %s", group.replica_id, decision.reason)
            group.state = {"done": "done", "restart": "waiting", "give_up": "down"}[decision.action]
            group.restart_at = now + decision.delay_s

    # -- the loop

    def _supervise(self) -> int:
        assert self._events_dir is not None
        started = next_status = time.monotonic()
        tail, progress = EventTail(self._events_dir), EventProgress()
        while self._stop_signal is None:
            now = time.monotonic()
            for group in self._groups:
                self._watch_group(group, now)
            self._watch_standbys(now)
            if not self._watch_lighthouse(now):
                logger.error("the lighthouse cannot be restarted; stopping the job")
                return 1
            if all(g.state in ("done", "down") for g in self._groups):
                failed = [g.replica_id for g in self._groups if g.state == "down"]
                if failed:
                    logger.error("groups %s are down for good; nothing left to run", ", ".join(failed))
                    return 1
                logger.info("all %d groups finished", len(self._groups))
                return 0
            for event in tail.poll():
                progress.apply(event)
                self._note_event(event)
            if self.console.live or now >= next_status:
                statuses = [GroupStatus(g.replica_id, g.state, g.num_restarts, progress.steps.get(g.replica_id))
                            for g in self._groups]
                self.console.show_status(render_status(statuses, num_replicas=progress.num_replicas,
                                                       elapsed_s=now - started))
                next_status = now + self.options.status_interval_s
            time.sleep(TICK_S)
        logger.warning("stopping on %s", signal.Signals(self._stop_signal).name)
        return 128 + self._stop_signal

    def _children(self) -> list[Child]:
        return [g.child for g in self._groups if g.child is not None] + self._standbys + (
            [self._lighthouse] if self._lighthouse is not None else []
        )

    def _stop_all(self) -> None:
        """Groups first, so they do not spend their grace period looking for the lighthouse."""
        groups = [g.child for g in self._groups if g.child is not None] + self._standbys
        self._terminate(groups, grace_s=self.options.stop_grace_s)
        self._terminate([self._lighthouse] if self._lighthouse else [], grace_s=self.options.stop_grace_s)

    def _terminate(self, children: Sequence[Child], *, grace_s: float) -> None:
        """Stop ``children``, everything below them and every leftover (see :meth:`_processes_of`).

        SIGTERM, then SIGKILL after ``grace_s`` or at once on a second Ctrl-C. Blocks for at
        most ``grace_s + KILL_WAIT_S`` plus a tick.
        """
        send_signal(self._processes_of(children), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (pids := self._processes_of(children)) and time.monotonic() < deadline and not self._kill_now:
            time.sleep(TICK_S)
        deadline = time.monotonic() + KILL_WAIT_S
        while pids and time.monotonic() < deadline:
            send_signal(pids, signal.SIGKILL)  # again each tick: it also reaches what they forked
            time.sleep(TICK_S)
            pids = self._processes_of(children)
        if pids:
            logger.error("processes %s survived SIGKILL for %gs (stuck in the kernel?)", pids, KILL_WAIT_S)
        for child in children:
            child.join_output(1.0)

    def _processes_of(self, children: Sequence[Child]) -> list[int]:
        """The running processes of ``children`` and below them, plus every leftover.

        A leftover is a process re-parented to the launcher (see :func:`become_subreaper`):
        it was orphaned by a dead child, so it belongs to a failed group and must go. Reaps
        the children and leftovers that have exited (Popen reaps its own, waitpid the rest).
        """
        for child in children:
            child.popen.poll()
        table = read_process_table()
        started = {child.pid for child in self._children()}
        leftovers = [info for info in table.values() if info.ppid == os.getpid() and info.pid not in started]
        for info in leftovers:
            if info.zombie:
                try:
                    os.waitpid(info.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        return running_below([c.pid for c in children] + [info.pid for info in leftovers], table)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``replicaft-launch``: exit 0 when every group finished, 1 when some could not,
    2 for bad arguments, 128 + signal number when stopped by SIGINT or SIGTERM."""
    try:
        options = parse_args(argv)
    except OptionsError as e:
        print(f"{PROG}: error: {e} (see {PROG} --help)", file=sys.stderr)
        return 2
    console = Console(sys.stdout, sys.stderr, live=sys.stderr.isatty())
    handler = ConsoleLogHandler(console)
    handler.setFormatter(logging.Formatter("[launcher] %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    launcher = Launcher(options, console)
    previous = {sig: signal.signal(sig, lambda signum, _frame: launcher.request_stop(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return launcher.run()
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)


if __name__ == "__main__":
    sys.exit(main())
