"""The local launcher: its pure parts as tables, then the real thing with real processes.

Integration tests run ``python -m replicaft.launch`` as a child and observe it from outside:
its labelled output, the groups' event logs and ``/proc``. They wait for events with deadlines
and never sleep to synchronise. The stop tests use a tiny sleeper script instead of real
training: what they check (every process gone, exit code) does not depend on what the ranks do,
and the sleeper ignores SIGTERM so the launcher has to escalate to SIGKILL.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, ManagedProcess, spawn_python
from support.training_events import read_events, wait_for_event

from replicaft.errors import OptionsError
from replicaft.launch import NUMBER_FLAGS, LaunchOptions, job_secret, main, parse_args
from replicaft.launch.console import Console, label_torchrun_line
from replicaft.launch.job_status import EventProgress, GroupStatus, render_status
from replicaft.launch.restart_policy import decide_restart
from replicaft.process.process_tree import ProcessInfo, descendants, running_below

EXAMPLE = str(REPO_ROOT / "examples" / "train_ddp.py")
UNUSED_LIGHTHOUSE = "127.0.0.1:1"
"""For scripts that never contact a lighthouse: the launcher then starts none, which saves time."""

SLEEPER = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""


# -- restart policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "num_restarts", "may_finish", "action", "reason_part"),
    [
        (0, 0, True, "done", "exited with code 0"),
        (0, 10, True, "done", "exited with code 0"),
        (1, 0, True, "restart", "restart 1 of 3 in 0.5s"),
        (-signal.SIGKILL, 2, True, "restart", "killed by SIGKILL; restart 3 of 3"),
        (-signal.SIGKILL, 3, True, "give_up", "restarted 3 times already (--max-restarts 3)"),
        (0, 0, False, "restart", "exited with code 0; restart 1 of 3"),
        (0, 3, False, "give_up", "leaving it down"),
    ],
)
def test_decide_restart_table(
    exit_code: int, num_restarts: int, may_finish: bool, action: str, reason_part: str
) -> None:
    decision = decide_restart(exit_code, num_restarts, max_restarts=3, restart_delay_s=0.5, may_finish=may_finish)
    assert decision.action == action
    assert reason_part in decision.reason
    assert decision.delay_s == (0.5 if action == "restart" else 0.0)


def test_decide_restart_with_zero_max_restarts_never_restarts() -> None:
    assert decide_restart(1, 0, max_restarts=0, restart_delay_s=1.0).action == "give_up"


# -- arguments --------------------------------------------------------------------------------


def test_parse_args_maps_flags_and_passes_script_args_through(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    options = parse_args(
        ["--groups", "3", "--ranks-per-group", "2", "--restart-delay", "0", "--min-replicas", "2",
         str(script), "--steps", "40", "--groups", "9"]
    )  # fmt: skip
    assert options == LaunchOptions(
        script=script, script_args=("--steps", "40", "--groups", "9"), num_groups=3, ranks_per_group=2,
        restart_delay_s=0.0, min_replicas=2,
    )  # fmt: skip
    assert options.replica_ids() == ["g0", "g1", "g2"]
    assert options.num_standbys() == 0  # torchrun starts a W > 1 group's ranks


@pytest.mark.parametrize(("args", "num_standbys"), [([], 1), (["--standbys", "0"], 0), (["--standbys", "2"], 2)])
def test_a_single_rank_group_gets_one_warm_standby_unless_told_otherwise(
    tmp_path: Path, args: list[str], num_standbys: int
) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert parse_args([*args, str(script)]).num_standbys() == num_standbys


def test_standbys_reserve_memory_unless_told_not_to(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert parse_args([str(script)]).standby_reserve
    assert not parse_args(["--no-standby-reserve", str(script)]).standby_reserve


@pytest.mark.parametrize(
    ("args", "message_part"),
    [
        ([], "SCRIPT"),
        (["--groups", "0", "{script}"], "--groups=0 is outside [1, 1024]"),
        (["--groups", "two", "{script}"], "invalid int value: 'two'"),
        (["--ranks-per-group", "0", "{script}"], "--ranks-per-group=0 is outside"),
        (["--restart-delay", "-1", "{script}"], "--restart-delay=-1.0 is outside [0, 86400]"),
        (["--restart-delay", "nan", "{script}"], "--restart-delay=nan is outside [0, 86400]"),
        (["--restart-delay", "inf", "{script}"], "--restart-delay=inf is outside"),
        (["--status-interval", "nan", "{script}"], "--status-interval=nan is outside"),
        (["--max-restarts", "-1", "{script}"], "--max-restarts=-1 is outside"),
        (["--stop-grace", "0", "{script}"], "--stop-grace=0.0 is outside"),
        (["--stop-grace", "1e12", "{script}"], "--stop-grace=1000000000000.0 is outside"),
        (["--min-replicas", "0", "{script}"], "--min-replicas=0 is outside"),
        (["--lighthouse", "localhost", "{script}"], "is not host:port"),
        (["--lighthouse", "localhost:99999", "{script}"], "is not host:port"),
        (["--groups", "2", "--min-replicas", "3", "{script}"], "no quorum could ever form"),
        (["--replica-prefix", "a/b", "{script}"], "--replica-prefix 'a/b': the replica id is 'a/b1'; a replica id is"),
        (["--replica-prefix", "g" * 200, "{script}"], "the replica id is 201 characters long"),
        (["--replica-prefix=.g", "{script}"], "starting with a letter, a digit or _"),
        (["--standbys", "-1", "{script}"], "--standbys=-1 is outside [0, 1024]"),
        (["--standbys", "1", "--ranks-per-group", "2", "{script}"], "torchrun starts the ranks of a W > 1 group"),
        (["--bogus", "{script}"], "unrecognized arguments: --bogus"),
        (["{missing}"], "is not a file"),
    ],
)
def test_bad_arguments_raise_options_error_naming_the_flag(tmp_path: Path, args: list[str], message_part: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    argv = [a.format(script=script, missing=tmp_path / "missing.py") for a in args]
    with pytest.raises(OptionsError) as excinfo:
        parse_args(argv)
    assert message_part in str(excinfo.value)


LAUNCH_NUMBERS = [
    (f.name, str(f.type)) for f in dataclasses.fields(LaunchOptions) if str(f.type).split(" |")[0] in ("int", "float")
]
BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, 1e12]


@pytest.mark.parametrize(
    ("name", "value"),
    [(n, v) for n, t in LAUNCH_NUMBERS for v in BAD_NUMBERS + ([0.5, True, 2**64] if t.startswith("int") else [True])],
    ids=repr,
)
def test_every_numeric_launch_option_refuses_nonfinite_negative_huge_and_wrong_types(name: str, value: Any) -> None:
    # Derived from the dataclass, so a new option is covered; the message names its flag.
    with pytest.raises(OptionsError) as raised:
        LaunchOptions(script=Path("train.py"), **{name: value})
    assert str(raised.value).startswith(f"{NUMBER_FLAGS[name][0]}={value!r} "), str(raised.value)


def test_the_launch_number_list_is_the_whole_class() -> None:
    assert {n for n, _ in LAUNCH_NUMBERS} == {
        "num_groups",
        "ranks_per_group",
        "restart_delay_s",
        "max_restarts",
        "min_replicas",
        "status_interval_s",
        "stop_grace_s",
        "standbys",
    }


def test_main_with_bad_arguments_prints_one_line_and_returns_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--groups", "0", str(tmp_path / "missing.py")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1
    assert captured.err.startswith("replicaft-launch: error: ")


@pytest.mark.timeout(60)
def test_missing_script_exits_2_with_one_line_error(tmp_path: Path) -> None:
    launcher = spawn_python("-m", "replicaft.launch", str(tmp_path / "nope.py"), name="launcher")
    assert launcher.wait_exit(50) == 2
    errors = [line.text for line in launcher.lines("stderr")]
    assert len(errors) == 1, errors
    assert "nope.py' is not a file" in errors[0]
    assert launcher.lines("stdout") == []


# -- output and status ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "labelled"),
    [
        ("[default0]:step 10", "[g1/0] step 10"),
        ("[default12]:[g1] x", "[g1/12] [g1] x"),
        ("[default1]:", "[g1/1] "),
        ("*****", "[g1/torchrun] *****"),
        ("[other0]:x", "[g1/torchrun] [other0]:x"),
    ],
)
def test_torchrun_lines_are_labelled_with_group_and_rank(line: str, labelled: str) -> None:
    assert label_torchrun_line("g1", line) == labelled


def test_status_line_shows_furthest_step_quorum_states_and_restarts() -> None:
    groups = [
        GroupStatus("g0", "running", 0, 23),
        GroupStatus("g1", "waiting", 2, 11),
        GroupStatus("g2", "running", 1, None),
    ]
    assert render_status(groups, num_replicas=2, elapsed_s=12.4) == (
        "12s | step 23 | quorum 2 | groups 2 running, 1 waiting | restarts 3 (g1:2 g2:1)"
    )


def test_status_line_before_any_event() -> None:
    status = render_status([GroupStatus("g0", "running", 0, None)], num_replicas=None, elapsed_s=0.0)
    assert status == "0s | step - | quorum - | groups 1 running | restarts 0"


def test_event_progress_keeps_latest_commit_and_newest_quorum() -> None:
    progress = EventProgress()
    for event in [
        {"event": "commit", "replica_id": "g1", "step": 12, "committed": True},
        {"event": "commit", "replica_id": "g1", "step": 13, "committed": False},
        {"event": "quorum", "ts": 2.0, "num_replicas": 2},
        {"event": "quorum", "ts": 1.0, "num_replicas": 3},
        {"event": "commit", "replica_id": "g1", "step": 1, "committed": True},
        {"event": "quorum"},
        {"event": "start", "replica_id": "g2", "pid": 5},
    ]:
        progress.apply(event)
    assert progress.steps == {"g1": 1}
    assert progress.num_replicas == 2


def test_live_status_is_erased_before_any_other_line_and_drawn_again_later() -> None:
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, err, live=True)
    console.show_status("step 1")
    console.write_line("[g0/0] hello")
    console.write_line("[launcher] note", to_err=True)
    console.show_status("step 2")
    console.close()
    assert out.getvalue() == "[g0/0] hello\n"
    assert err.getvalue() == "\r\x1b[Kstep 1\r\x1b[K[launcher] note\n\r\x1b[Kstep 2\r\x1b[K"


def test_plain_status_is_a_log_line() -> None:
    err = io.StringIO()
    Console(io.StringIO(), err, live=False).show_status("step 1")
    assert err.getvalue() == "[launcher] status: step 1\n"


def test_running_below_skips_zombies_and_other_trees() -> None:
    table = {
        pid: ProcessInfo(pid, ppid, zombie)
        for pid, ppid, zombie in [(10, 1, False), (11, 10, True), (12, 10, False), (13, 12, False), (20, 1, False)]
    }
    assert running_below([10], table) == [10, 12, 13]
    assert running_below([99], table) == []


def test_descendants_walks_the_whole_tree_and_nothing_else() -> None:
    table = {
        pid: ProcessInfo(pid, ppid, False) for pid, ppid in [(10, 1), (11, 10), (12, 11), (13, 11), (20, 1), (21, 20)]
    }
    assert sorted(info.pid for info in descendants(10, table)) == [11, 12, 13]
    assert descendants(13, table) == []


# -- real processes ---------------------------------------------------------------------------


def start_launcher(*args: str) -> ManagedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REPLICAFT_TOKEN"}
    return spawn_python("-m", "replicaft.launch", *args, name="launcher", env=env)


@pytest.mark.parametrize(
    ("lighthouse", "environ", "made"),
    [
        (None, {}, True),  # the launcher's own lighthouse, no token set: a secret for the job
        (None, {"REPLICAFT_TOKEN": "mine"}, False),  # the caller's token is inherited
        (None, {"REPLICAFT_TOKEN": ""}, False),  # inherited too: the children refuse it by name
        ("10.0.0.1:29510", {}, False),  # someone else's lighthouse: its token is the caller's to set
    ],
)
def test_the_launcher_makes_a_job_secret_only_for_its_own_lighthouse_and_no_token(
    tmp_path: Path, lighthouse: str | None, environ: dict[str, str], made: bool
) -> None:
    args = ["--lighthouse", lighthouse] if lighthouse else []
    (tmp_path / "train.py").write_text("")
    options = parse_args([*args, str(tmp_path / "train.py")])
    first, second = job_secret(options, environ), job_secret(options, environ)
    if made:
        assert set(first) == {"REPLICAFT_TOKEN"} and len(first["REPLICAFT_TOKEN"]) >= 32
        assert first != second, "a fresh secret per job"
    else:
        assert first == second == {}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_killed_group_is_restarted_in_the_warm_standby_heals_and_the_run_ends_0(tmp_path: Path) -> None:
    events = tmp_path / "events"
    # --min-replicas 3: the survivors wait for g1 instead of finishing without it, so g1 must heal.
    # A data worker process: the script's forkserver must start from the standby as from a script.
    # 80 steps: the standby imports torch and faults in its reserve before the kill, ~10 steps in here.
    launcher = start_launcher(
        "--groups", "3", "--min-replicas", "3", "--restart-delay", "0.5", "--events-dir", str(events),
        "--status-interval", "1", EXAMPLE, "--steps", "80", "--step-delay", "0.05", "--num-workers", "1",
    )  # fmt: skip
    standby = launcher.wait_for_line(
        lambda text: text.startswith("[launcher] starting warm standby pid "),
        90,
        stream="stderr",
        what="a warm standby started once every group committed",
    )
    standby_pid = int(standby.text.rsplit(" ", 1)[1])
    # Asked for once the groups reported their state's size (state_size, after their first commit).
    launcher.wait_for_line(
        lambda text: text.startswith(f"[launcher] warm standby pid {standby_pid} reserved "),
        90,
        stream="stderr",
        what="the standby's memory reserve",
    )
    wait_for_event(
        events, lambda e: e["event"] == "commit" and e["replica_id"] == "g1" and e["committed"] and e["step"] >= 3,
        90, "g1 committed step 3", launcher,
    )  # fmt: skip
    (start,) = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == "g1"]
    # One secret for the job, made by the launcher, in the lighthouse's, every group's and the
    # standby's environment (never on a command line).
    pids = {e["replica_id"]: e["pid"] for e in read_events(events) if e["event"] == "start"}
    lighthouse_pid = next(
        pid
        for pid in _process_tree(launcher.pid)
        if b"lighthouse" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    )
    secrets_seen = {_environ(pid).get("REPLICAFT_TOKEN") for pid in [*pids.values(), standby_pid, lighthouse_pid]}
    assert len(secrets_seen) == 1 and len(secrets_seen.pop() or "") >= 32
    assert not any(
        b"REPLICAFT_TOKEN" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in _process_tree(launcher.pid)
    )
    os.kill(start["pid"], signal.SIGKILL)
    killed_at = time.time()
    heal = wait_for_event(
        events, lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e["ts"] > killed_at,
        90, "g1 healed after the kill", launcher,
    )  # fmt: skip
    assert heal["ok"], heal
    # The restarted group's buckets and heal took the standby's reserve.
    size = wait_for_event(
        events,
        lambda e: e["event"] == "state_size" and e["replica_id"] == "g1" and e["ts"] > killed_at,
        90,
        "g1's state size after the restart",
        launcher,
    )
    assert size["reserve_bytes"] > size["cpu_bytes"] == size["num_bytes"] > 0, size
    assert size["reserve_bytes"] >= size["reserve_used_bytes"] >= size["cpu_bytes"], size
    # The next standby starts only once the restarted group has committed, so never beside its heal.
    replacement = launcher.wait_for_line(
        lambda text: text.startswith("[launcher] starting warm standby pid "),
        90,
        stream="stderr",
        after=standby.index + 1,
        what="a replacement standby",
    )
    replacement_started = _started_at(int(replacement.text.rsplit(" ", 1)[1]))
    assert launcher.wait_exit(90) == 0, launcher.output_tail()
    log = [line.text for line in launcher.lines("stderr")]
    assert "[launcher] g1 killed by SIGKILL; restart 1 of 10 in 0.5s" in log
    assert f"[launcher] started g1 in warm standby pid {standby_pid}, restart 1" in log
    assert "[launcher] all 3 groups finished" in log
    assert not any("no REPLICAFT_TOKEN" in line.text for line in launcher.lines()), "a launched job runs authenticated"
    assert any(text.startswith("[launcher] status: ") and "| quorum 3 |" in text for text in log), log
    out = [line.text for line in launcher.lines()]
    assert {"[g0/0] [g0] step 80", "[g1/0] [g1] step 80", "[g2/0] [g2] step 80"} <= {
        t.rsplit(" loss", 1)[0] for t in out
    }
    assert any(text.startswith("[lighthouse] lighthouse serving gRPC at ") for text in out)
    starts = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == "g1"]
    assert [s["pid"] for s in starts] == [start["pid"], standby_pid]
    first_commit_after = min(
        e["ts"]
        for e in read_events(events)
        if e["event"] == "commit" and e["replica_id"] == "g1" and e["committed"] and e["ts"] > killed_at
    )
    assert replacement_started >= first_commit_after - 0.011  # /proc counts in 10 ms ticks


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_standby_that_dies_unused_turns_standbys_off_and_the_restart_goes_cold(tmp_path: Path) -> None:
    events = tmp_path / "events"
    launcher = start_launcher(
        "--groups", "2", "--restart-delay", "0", "--events-dir", str(events), "--stop-grace", "2",
        EXAMPLE, "--steps", "100000", "--step-delay", "0.05",
    )  # fmt: skip
    ready = launcher.wait_for_line(
        lambda text: text.startswith("[launcher] warm standby pid ") and text.endswith(" ready"),
        90,
        stream="stderr",
        what="a warm standby ready",
    )
    standby_pid = int(ready.text.split()[4])
    os.kill(standby_pid, signal.SIGKILL)
    launcher.wait_for_line(
        lambda text: (
            text == f"[launcher] warm standby pid {standby_pid} killed by SIGKILL before it was used; "
            "restarts start cold from now on"
        ),
        30,
        stream="stderr",
        after=ready.index,
        what="the standby's death reported",
    )
    (start,) = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == "g0"]
    os.kill(start["pid"], signal.SIGKILL)
    restarted = launcher.wait_for_line(
        lambda text: text.startswith("[launcher] started g0 "),
        30,
        stream="stderr",
        after=ready.index,
        what="g0 restarted",
    )
    assert restarted.text.startswith("[launcher] started g0 (pid ") and restarted.text.endswith(", restart 1")
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait_exit(60) == 128 + signal.SIGINT, launcher.output_tail()
    log = [line.text for line in launcher.lines("stderr")]
    assert sum(text.startswith("[launcher] starting warm standby") for text in log) == 1, log


def _process_tree(root_pid: int) -> dict[int, int]:
    """pid -> start time (ticks since boot) of every process below ``root_pid``, from /proc."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            parents[int(entry.name)] = (int(fields[1]), int(fields[19]))
    tree, frontier = {}, [root_pid]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start_ticks) in parents.items():
            if ppid == parent:
                tree[pid] = start_ticks
                frontier.append(pid)
    return tree


def _environ(pid: int) -> dict[str, str]:
    """Process ``pid``'s environment as it started, from /proc."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: state, ppid, ... (start time is index 19)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def _started_at(pid: int) -> float:
    """When process ``pid`` started, in wall time (``time.time()``), from /proc to a clock tick."""
    since_boot = int(_stat_fields(pid)[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + since_boot


def _still_running(pid: int, start_ticks: int) -> bool:
    """Whether that very process runs: a zombie waiting for init, or a reused pid, does not count."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return False
    return int(fields[19]) == start_ticks and fields[0] not in ("Z", "X")


def _wait_all_gone(tree: dict[int, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (alive := [pid for pid, ticks in tree.items() if _still_running(pid, ticks)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes {alive} outlived the launcher"


def _wait_ready(launcher: ManagedProcess, labels: list[str], after: int = 0) -> dict[str, int]:
    """Rank label -> pid, from the sleeper's "ready <pid>" lines as the launcher labels them."""
    pids = {}
    for label in labels:
        line = launcher.wait_for_line(
            lambda text, label=label: text.startswith(f"{label} ready "), 60, after=after, what=label
        )
        pids[label] = int(line.text.rsplit(" ", 1)[1])
    return pids


@pytest.mark.slow
@pytest.mark.timeout(100)
def test_orphaned_ranks_die_with_their_group_and_sigint_stops_everything_exit_130(tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    launcher = start_launcher(
        "--groups", "2", "--ranks-per-group", "2", "--stop-grace", "1", "--restart-delay", "0", str(sleeper)
    )  # fmt: skip
    ranks = _wait_ready(launcher, ["[g0/0]", "[g0/1]", "[g1/0]", "[g1/1]"])
    (started,) = [line.text for line in launcher.lines("stderr") if line.text.startswith("[launcher] started g1 ")]
    torchrun_g1 = int(started.rsplit("pid ", 1)[1].rstrip(")"))
    tree = _process_tree(launcher.pid)
    assert {torchrun_g1, *ranks.values()} <= set(tree), (ranks, tree)

    # torchrun dies without stopping its ranks: the launcher must find and kill them itself.
    mark = launcher.mark()
    os.kill(torchrun_g1, signal.SIGKILL)
    _wait_all_gone({pid: tree[pid] for pid in (ranks["[g1/0]"], ranks["[g1/1]"])}, 10.0)
    _wait_ready(launcher, ["[g1/0]", "[g1/1]"], after=mark)

    tree = _process_tree(launcher.pid)
    assert len(tree) >= 7, tree  # the lighthouse, two torchruns, four ranks
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait_exit(30) == 128 + signal.SIGINT, launcher.output_tail()
    _wait_all_gone(tree, 5.0)
    assert "[launcher] stopping on SIGINT" in [line.text for line in launcher.lines("stderr")]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sigterm_stops_a_group_that_ignores_it_and_exits_143(tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    launcher = start_launcher("--lighthouse", UNUSED_LIGHTHOUSE, "--groups", "1", "--stop-grace", "0.5", str(sleeper))
    launcher.wait_for_line(lambda text: text.startswith("[g0/0] ready"), 50, what="g0 ready")
    tree = _process_tree(launcher.pid)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait_exit(30) == 128 + signal.SIGTERM, launcher.output_tail()
    _wait_all_gone(tree, 5.0)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_group_failing_beyond_max_restarts_is_left_down_and_launcher_exits_1(tmp_path: Path) -> None:
    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nprint('failing', flush=True)\nsys.exit(3)\n")
    launcher = start_launcher(
        "--lighthouse", UNUSED_LIGHTHOUSE, "--groups", "1", "--max-restarts", "1", "--restart-delay", "0", str(failing)
    )  # fmt: skip
    assert launcher.wait_exit(50) == 1, launcher.output_tail()
    log = [line.text for line in launcher.lines("stderr")]
    assert "[launcher] g0 exited with code 3; restart 1 of 1 in 0s" in log
    assert any("g0 exited with code 3; restarted 1 times already" in text for text in log), log
    assert [line.text for line in launcher.lines()].count("[g0/0] failing") == 2


def test_the_launcher_and_the_error_types_do_not_import_torch() -> None:
    # The supervisor only starts, watches and restarts processes: it must not pay torch's
    # import (about two seconds here) nor hold its memory; ``replicaft`` imports it lazily.
    process = spawn_python(
        "-c",
        "import sys, replicaft, replicaft.launch, replicaft.errors; from replicaft import GroupBroken, ManagerOptions;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))",
        name="import-launch",
    )
    assert process.wait_exit(60) == 0, process.output_tail()
    assert process.lines()[-1].text == "[]"
