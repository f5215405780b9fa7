"""The launcher's loop: it keeps every replica group running, restarting the ones that die,
until all have finished or it is told to stop; the groups' supervision (shared with the chaos
harness), the lighthouse, the standbys and stopping processes are each in their own module
(see the package's docstring)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from replicaft.compat import TORCHFT_ALIAS_DIR
from replicaft.config.env_names import NUM_GROUPS_ENV
from replicaft.errors import OptionsError
from replicaft.launch.children import Child, free_port
from replicaft.launch.console import (
    TORCHRUN_ROLE,
    Console,
    ConsoleLogHandler,
    label_single_rank_line,
    label_torchrun_line,
)
from replicaft.launch.groups import Group, GroupSupervisor
from replicaft.launch.job_status import EventProgress, GroupStatus, render_status
from replicaft.launch.lighthouse_keeper import LighthouseKeeper
from replicaft.launch.options import PROG, LaunchOptions, job_secret, parse_args
from replicaft.launch.reaper import Reaper
from replicaft.launch.restart_policy import RestartDecision, decide_restart
from replicaft.process.process_tree import become_subreaper
from replicaft.telemetry.events import EventTail

logger = logging.getLogger(__name__)

TICK_S = 0.1
"""How often the supervisor polls its children: restart latency is a tick plus the delay."""
_GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Removed from the groups' environment: torchrun sets them per rank, and a W = 1 group has none."""


class Launcher:
    """Starts the lighthouse (unless given one) and the groups, then supervises them.

    The groups are kept by a :class:`GroupSupervisor` (shared with the chaos harness), to which
    the launcher is the :class:`~replicaft.launch.groups.GroupHooks`: command lines, labelled
    output, and ``decide_restart`` with ``--max-restarts``."""

    def __init__(self, options: LaunchOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self._job_secret = job_secret(options, os.environ)
        self._stop_signal: int | None = None
        self._kill_now = False
        self._work_dir: Path | None = None
        self._events_dir: Path | None = options.events_dir
        self._reaper = Reaper(self._children, lambda: self._kill_now)
        self._lighthouse = LighthouseKeeper(
            options,
            {**os.environ, **self._job_secret},
            console.write_line,
            stopping=lambda: self._stop_signal is not None,
        )
        self._groups = GroupSupervisor(
            options.replica_ids(), self, reaper=self._reaper, base_env=self._base_env,
            standby_script=[str(options.script), *options.script_args], num_standbys=options.num_standbys(),
            standby_reserve=options.standby_reserve, write_line=console.write_line,
        )  # fmt: skip

    def request_stop(self, signum: int) -> None:
        """Ask ``run()`` to stop everything; a second request skips the grace period. Signal-safe."""
        if self._stop_signal is None:
            self._stop_signal = signum
        else:
            self._kill_now = True

    def run(self) -> int:
        if not become_subreaper():
            logger.warning(
                "prctl(PR_SET_CHILD_SUBREAPER) failed: ranks orphaned by a dead torchrun will not be stopped"
            )
        self._work_dir = Path(tempfile.mkdtemp(prefix="replicaft-launch-"))
        if self._events_dir is None:
            self._events_dir = self._work_dir / "events"
        self._events_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.options.lighthouse is None and not self._lighthouse.start():
                return self._signal_exit_code() or 1
            logger.info(
                "lighthouse at %s; %d groups of %d ranks; events in %s",
                self._lighthouse_address(),
                len(self._groups.groups),
                self.options.ranks_per_group,
                self._events_dir,
            )
            return self._supervise()
        finally:
            self._stop_all()
            self.console.close()
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def _signal_exit_code(self) -> int | None:
        return None if self._stop_signal is None else 128 + self._stop_signal

    def _lighthouse_address(self) -> str:
        address = self.options.lighthouse or self._lighthouse.address
        assert address is not None
        return address

    # -- the groups' hooks (replicaft.launch.groups.GroupHooks)

    def _base_env(self) -> dict[str, str]:
        """The environment of every group process, and of a standby, before the group's own variables."""
        env = {k: v for k, v in os.environ.items() if k not in _GROUP_VARIABLES}
        env.update(self._job_secret)
        env["PYTHONUNBUFFERED"] = "1"
        # gRPC's fork handlers crash a child forked while the manager's gRPC threads run: a
        # DataLoader with workers (fork, torch's default on Linux, as in torchft's train_ddp.py)
        # segfaulted in every worker here (grpcio 1.85). The children never use gRPC, so the
        # handlers have nothing to keep; the caller's own setting wins.
        env.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
        if self.options.torchft:
            # On the path at interpreter start, so a warm standby (started before any group dies) has it too.
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TORCHFT_ALIAS_DIR), env.get("PYTHONPATH")]))
        return env

    def group_variables(self, group: Group) -> dict[str, str]:
        assert self._events_dir is not None
        variables = {
            "REPLICAFT_LIGHTHOUSE": self._lighthouse_address(),
            "REPLICAFT_REPLICA_ID": group.replica_id,
            "REPLICAFT_EVENTS_DIR": str(self._events_dir),
            # The job's size, for a script that sizes a global batch by it (replicaft.lightning).
            NUM_GROUPS_ENV: str(self.options.num_groups),
        }
        if self.options.min_replicas is not None:
            variables["REPLICAFT_MIN_REPLICAS"] = str(self.options.min_replicas)
        if self.options.torchft:
            # What torchft's examples read to name and shard their group (train_ddp.py, train_diloco.py).
            variables["REPLICA_GROUP_ID"] = str(self.options.replica_ids().index(group.replica_id))
            variables["NUM_REPLICA_GROUPS"] = str(self.options.num_groups)
        return variables

    def cold_argv(self, group: Group) -> list[str]:
        o = self.options
        assert self._work_dir is not None
        if o.ranks_per_group == 1:
            return [sys.executable, str(o.script), *o.script_args]
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(o.ranks_per_group), "--max-restarts", "0",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "--monitor-interval", "0.1", "--shutdown-timeout", f"{o.stop_grace_s:g}",
            "--role", TORCHRUN_ROLE, "--tee", "3", "--log-dir", str(self._work_dir / "torchrun" / group.replica_id),
            str(o.script), *o.script_args,
        ]  # fmt: skip

    def on_line(self, group: Group) -> Callable[[str], None]:
        label = label_torchrun_line if self.options.ranks_per_group > 1 else label_single_rank_line
        return lambda line: self.console.write_line(label(group.replica_id, line))

    def started(self, group: Group) -> None:
        assert group.child is not None
        restart = f", restart {group.num_restarts}" if group.num_restarts else ""
        if group.in_standby:
            logger.info("started %s in warm standby pid %d%s", group.replica_id, group.child.pid, restart)
        else:
            logger.info("started %s (pid %d)%s", group.replica_id, group.child.pid, restart)

    def exited(self, group: Group, exit_code: int, now: float) -> RestartDecision:
        decision = decide_restart(
            exit_code,
            group.num_restarts,
            max_restarts=self.options.max_restarts,
            restart_delay_s=self.options.restart_delay_s,
        )
        level = logging.INFO if decision.action == "done" else logging.WARNING
        logger.log(level, "%s %s", group.replica_id, decision.reason)
        return decision

    # -- the loop

    def _supervise(self) -> int:
        assert self._events_dir is not None
        started = next_status = time.monotonic()
        tail, progress = EventTail(self._events_dir), EventProgress()
        groups = self._groups.groups.values()
        while self._stop_signal is None:
            now = time.monotonic()
            self._groups.tick(now)
            if not self._lighthouse.watch(now):
                logger.error("the lighthouse cannot be restarted; stopping the job")
                return 1
            if all(g.state in ("done", "down") for g in groups):
                failed = [g.replica_id for g in groups if g.state == "down"]
                if failed:
                    logger.error("groups %s are down for good; nothing left to run", ", ".join(failed))
                    return 1
                logger.info("all %d groups finished", len(groups))
                return 0
            for event in tail.poll():
                progress.apply(event)
                self._groups.note_event(event)
            if self.console.live or now >= next_status:
                statuses = [
                    GroupStatus(g.replica_id, g.state, g.num_restarts, progress.steps.get(g.replica_id)) for g in groups
                ]
                self.console.show_status(
                    render_status(statuses, num_replicas=progress.num_replicas, elapsed_s=now - started)
                )
                next_status = now + self.options.status_interval_s
            time.sleep(TICK_S)
        logger.warning("stopping on %s", signal.Signals(self._stop_signal).name)
        return 128 + self._stop_signal

    def _children(self) -> list[Child]:
        lighthouse = [self._lighthouse.child] if self._lighthouse.child is not None else []
        return self._groups.children() + lighthouse

    def _stop_all(self) -> None:
        """Groups first, so they do not spend their grace period looking for the lighthouse."""
        self._reaper.terminate(self._groups.children(), grace_s=self.options.stop_grace_s)
        lighthouse = [self._lighthouse.child] if self._lighthouse.child is not None else []
        self._reaper.terminate(lighthouse, grace_s=self.options.stop_grace_s)


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
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: launcher.request_stop(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        return launcher.run()
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)
