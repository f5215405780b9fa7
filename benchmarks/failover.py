"""Failover: survivor time lost when another replica group is SIGKILLed mid-step, replicaft vs torchft 0.2.0.

Each run starts a lighthouse and three replica groups (one process each, W=1) training a
~1 MB stack of linear layers with a fixed pacing sleep after backward, so the steady step
time T is known. Once every group has committed ``WARM_STEPS`` steps in a three-group
quorum, the benchmark SIGKILLs one group at a random offset after one of its commits (the
victim rotates g0, g1, g2 over the repeats, so the group hosting the column's store is
killed too), then reads the two survivors' commit timestamps (``time.time()`` right after a
committed optimizer step, printed by the workers as JSON lines).

Time lost by a survivor = ``(its K-th commit after the kill - its last commit before the
kill) - K * T``, with ``T`` its median commit interval before the kill and ``K =
AFTER_COMMITS``: the wall time the failure cost beyond the steps actually committed. ``K``
is more than one because the two systems fail differently: torchft's commit vote is per
group, so a step whose all-reduce finished before the kill still commits and the stall
(heartbeat expiry) lands on the next step; replicaft aborts the step in flight and loses
it. With ``K = 1`` (the first interval only) torchft would look free whenever the kill
lands in the pacing sleep; that figure is kept per run in the params as ``gap1_lost_s``.

A survivor that raises, exits, or commits fewer than ``K`` steps within
``RECOVERY_TIMEOUT_S`` of the kill counts as crashed: its loss is infinite, it is left out of
the median and counted in ``*_survivor_crashes``.

Three configurations run in the same invocation, interleaved per repeat: replicaft's
lighthouse with defaults; torchft's lighthouse with its CLI defaults (min_replicas 1,
join_timeout 60 s, heartbeat timeout 5 s); torchft with a 1 s heartbeat timeout.

A hung group (``hung_lost_s``): the same measurement with SIGSTOP instead of SIGKILL. The
stopped process's TCP connection stays open, so nothing closes; the survivors, blocked in
the step's all-reduce with it, wait for the lighthouse to declare it lost and tell them. Its
baseline, in the same run, is replicaft's lighthouse with the adaptive silence limit turned
off (``--hung-min`` equal to the 2 s heartbeat timeout: the fixed timeout of before, which
cost the survivors 2.64 s in the demo), and the SIGKILL figure of the same run is repeated
beside it (``hung_lost_s_vs_sigkill``), since a SIGKILL is detected at once and so is the
floor for any failure. The stopped process is SIGKILLed when its run ends. The hung runs
warm up for 40 steps, not 10: the lighthouse's limit for a member is its longest recent gap
between messages plus two heartbeat intervals (lighthouse/rules/liveness.py), and the window of
gaps should hold steady training; right after start-up it still holds start-up's scheduling
delays on this loaded machine, and a SIGSTOP there cost survivors ~0.5 s in trial runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.processes import Child, ChildFailed, ChildProcesses
from benchmarks.results import BenchmarkResult

GROUPS = 3
STEP_SLEEP_S = 0.08
WARM_STEPS = 10
"""Commits every group makes in a full (three-group) quorum before the kill (Config.warm_steps)."""
AFTER_COMMITS = 3
"""K: commits after the kill over which the loss is measured (see the module docstring)."""
START_TIMEOUT_S = 180.0
"""From launch to WARM_STEPS full-quorum commits; torch imports are slow on a loaded machine."""
RECOVERY_TIMEOUT_S = 90.0
"""From the kill to K commits per survivor; beyond torchft's 60 s quorum timeout."""
KILL_OFFSET_CAP_S = 5.0
STARTUP_ATTEMPTS = 2
"""A run whose groups fail before the kill is recorded under ``startup_failures`` and retried once."""
SEED = 20261122


@dataclasses.dataclass(frozen=True)
class Config:
    label: str
    impl: str
    lost: str
    """The name of this configuration's loss figure (replicaft) or baseline (torchft)."""
    crashes: str
    heartbeat_timeout_ms: int | None = None
    fault: str = "SIGKILL"
    lighthouse_args: tuple[str, ...] = ()
    is_figure: bool = False
    """A figure of replicaft's (else a baseline): the fixed-timeout replicaft run is a baseline."""
    warm_steps: int = WARM_STEPS
    """Full-quorum commits before the fault."""


FIXED_TIMEOUT_ARGS = ("--heartbeat-timeout", "2", "--hung-min", "2")
"""The lighthouse as it was: a hung group is lost after the fixed 2 s heartbeat timeout."""
CONFIGS = (
    Config("replicaft", "replicaft", "survivor_lost_s", "survivor_crashes", is_figure=True),
    Config("torchft", "torchft", "torchft_survivor_lost_s", "torchft_survivor_crashes", heartbeat_timeout_ms=5000),
    Config(
        "torchft_hb1",
        "torchft",
        "torchft_survivor_lost_s_hb1",
        "torchft_survivor_crashes_hb1",
        heartbeat_timeout_ms=1000,
    ),
    Config(
        "replicaft_hung",
        "replicaft",
        "hung_lost_s",
        "hung_survivor_crashes",
        fault="SIGSTOP",
        is_figure=True,
        warm_steps=40,
    ),
    Config(
        "replicaft_hung_fixed",
        "replicaft",
        "fixed_timeout_hung_lost_s",
        "fixed_timeout_hung_survivor_crashes",
        fault="SIGSTOP",
        lighthouse_args=FIXED_TIMEOUT_ARGS,
        warm_steps=40,
    ),
)
SECOND_RATIO = "survivor_lost_s_vs_hb1"
"""The replicaft loss again, so it can carry its ratio to the second baseline (one baseline per figure)."""
HUNG_VS_SIGKILL = "hung_lost_s_vs_sigkill"
"""The hung loss again, against the SIGKILL loss of the same run (a baseline there)."""


class Worker:
    """A group's process and every JSON line it printed, read in the background."""

    def __init__(self, name: str, child: Child) -> None:
        self.name = name
        self.child = child
        self.events: list[dict[str, Any]] = []
        self.ended: str | None = None
        """Why the reader stopped: EOF (exit), a crash event, or its deadline."""

    async def read(self, deadline: float, changed: asyncio.Event) -> None:
        try:
            while True:
                line = await self.child.next_line(deadline)
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    continue  # not ours (a library printing to stdout); workers speak JSON
                self.events.append(obj)
                changed.set()
        except ChildFailed as e:
            self.ended = str(e)
            changed.set()

    def commits(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "commit"]

    def crash(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == "crash"), None)

    def full_commits(self) -> int:
        return sum(1 for e in self.commits() if e.get("participants") == GROUPS)


async def until(changed: asyncio.Event, deadline: float, predicate: Any) -> bool:
    """Wait for ``predicate()``, re-checked whenever a worker prints; False at the deadline."""
    while not predicate():
        changed.clear()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(changed.wait(), remaining)
        except asyncio.TimeoutError:
            return predicate()
    return True


async def _start_lighthouse(children: ChildProcesses, config: Config, deadline: float) -> str:
    if config.impl == "replicaft":
        lighthouse = await children.start_python(
            "lighthouse", "-m", "lighthouse", "--port", "0", "--log-level", "WARNING", *config.lighthouse_args
        )
        return (await lighthouse.expect_line("lighthouse serving gRPC at ", deadline)).strip()
    lighthouse = await children.start_python(
        "torchft-lighthouse",
        "-m",
        "benchmarks.failover_worker",
        "--impl",
        "torchft-lighthouse",
        "--heartbeat-timeout-ms",
        str(config.heartbeat_timeout_ms),
    )
    return str((await lighthouse.expect_event("lighthouse", deadline))["address"])


def median_interval(commits: list[dict[str, Any]]) -> float:
    intervals = [
        b["ts"] - a["ts"]
        for a, b in zip(commits, commits[1:], strict=False)
        if b["step"] == a["step"] + 1 and a.get("participants") == GROUPS
    ]
    return statistics.median(intervals)


def _replicaft_events(events_dir: Path, replica_id: str, since: float, until: float) -> list[list[Any]]:
    """The replicaft manager's own events of one survivor in the window, compactly, for the trace."""
    path = events_dir / f"{replica_id}-0.jsonl"
    out: list[list[Any]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if since - 0.001 <= e["ts"] <= until + 0.001 and e["event"] in (
            "quorum",
            "collective_error",
            "commit",
            "fenced",
        ):
            detail = {
                k: e[k]
                for k in (
                    "quorum_id",
                    "latency_s",
                    "num_replicas",
                    "committed",
                    "reason",
                    "error",
                    "step_time_s",
                    "reconfigured",
                )
                if k in e and e[k] not in ("", None)
            }
            out.append([round(e["ts"], 3), e["event"], e["step"], detail])
    return out


async def _one_run(config: Config, victim_index: int, rng: random.Random) -> dict[str, Any]:
    """One kill; returns what the survivors saw (the run's record in the params)."""
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="replicaft-failover-") as events_dir:
        async with ChildProcesses() as children:
            address = await _start_lighthouse(children, config, deadline)
            workers = []
            for i in range(GROUPS):
                extra = ["--events-dir", events_dir] if config.impl == "replicaft" else []
                child = await children.start_python(
                    f"{config.impl}-g{i}",
                    "-m",
                    "benchmarks.failover_worker",
                    "--impl",
                    config.impl,
                    "--lighthouse",
                    address,
                    "--replica-id",
                    f"g{i}",
                    "--step-sleep",
                    str(STEP_SLEEP_S),
                    *extra,
                )
                workers.append(Worker(f"g{i}", child))
            changed = asyncio.Event()
            readers = [
                asyncio.create_task(w.read(started + START_TIMEOUT_S + RECOVERY_TIMEOUT_S + 60, changed))
                for w in workers
            ]
            try:
                return await _kill_and_watch(
                    config, workers, victim_index, rng, changed, deadline, Path(events_dir), started, load_start
                )
            finally:
                for r in readers:
                    r.cancel()
                await asyncio.gather(*readers, return_exceptions=True)


async def _kill_and_watch(
    config: Config,
    workers: list[Worker],
    victim_index: int,
    rng: random.Random,
    changed: asyncio.Event,
    deadline: float,
    events_dir: Path,
    started: float,
    load_start: float,
) -> dict[str, Any]:
    def warmed() -> bool:
        for w in workers:
            if w.ended is not None or w.crash() is not None:
                raise ChildFailed(f"{config.impl} {w.name} stopped before the kill: {w.crash() or w.ended}")
        return all(w.full_commits() >= config.warm_steps for w in workers)

    if not await until(changed, deadline, warmed):
        tails = "".join(f"\n--- {w.name} stderr ends with:\n{w.child.stderr_tail()[-800:]}" for w in workers)
        raise ChildFailed(
            f"{config.impl}: groups did not reach {config.warm_steps} full-quorum commits in "
            f"{START_TIMEOUT_S:g}s (commits: {[len(w.commits()) for w in workers]}, "
            f"full-quorum commits: {[w.full_commits() for w in workers]}){tails}"
        )
    victim = workers[victim_index]
    survivors = [w for i, w in enumerate(workers) if i != victim_index]
    t_victim = median_interval(victim.commits())
    seen = len(victim.commits())
    if not await until(changed, time.monotonic() + 30.0, lambda: len(victim.commits()) > seen):
        raise ChildFailed(f"{config.impl}: victim {victim.name} stopped committing before the kill")
    # The fault's timing, not a synchronisation: a random point of the victim's next step,
    # counted from its commit timestamp (not from when we read the line, which lags under load).
    target = victim.commits()[-1]["ts"] + rng.uniform(0.0, min(t_victim, KILL_OFFSET_CAP_S))
    await asyncio.sleep(max(0.0, target - time.time()))
    if config.fault == "SIGSTOP":
        victim.child.send_signal(signal.SIGSTOP)
    else:
        victim.child.kill()
    t_kill = time.time()
    kill_offset = t_kill - victim.commits()[-1]["ts"]

    def settled(w: Worker) -> bool:
        return (
            w.ended is not None
            or w.crash() is not None
            or sum(1 for c in w.commits() if c["ts"] > t_kill) >= AFTER_COMMITS
        )

    recovered = await until(changed, time.monotonic() + RECOVERY_TIMEOUT_S, lambda: all(settled(w) for w in survivors))
    record: dict[str, Any] = {
        "fault": config.fault,
        "victim": victim.name,
        "kill_offset_s": round(kill_offset, 4),
        "startup_s": round(time.monotonic() - started, 1),
        "load_1min": round(load_start, 2),
        "survivors": {},
    }
    for w in survivors:
        commits = w.commits()
        before = [c for c in commits if c["ts"] <= t_kill]
        after = [c for c in commits if c["ts"] > t_kill]
        t_steady = median_interval(before)
        s: dict[str, Any] = {"t_steady_s": round(t_steady, 4)}
        crash = w.crash()
        if crash is not None or len(after) < AFTER_COMMITS:
            s["crashed"] = True
            s["why"] = (
                crash["error"]
                if crash is not None
                else (w.ended or f"{len(after)} commits in {RECOVERY_TIMEOUT_S:g}s after the kill")
            )[:500]
            if crash is not None:
                s["crash_after_kill_s"] = round(crash["ts"] - t_kill, 3)
                s["crash_where"] = crash.get("where")
        else:
            last = before[-1]["ts"]
            s["lost_s"] = round(after[AFTER_COMMITS - 1]["ts"] - last - AFTER_COMMITS * t_steady, 4)
            s["gap1_lost_s"] = round(after[0]["ts"] - last - t_steady, 4)
        trace_end = after[min(len(after), AFTER_COMMITS) - 1]["ts"] if after else time.time()
        since = before[-1]["ts"] if before else t_kill
        # Every line the survivor printed from its last commit before the kill to the K-th after.
        s["trace"] = [
            [round(e["ts"] - t_kill, 3), e["event"], e.get("step"), e.get("participants")]
            + ([e["error"]] if "error" in e else [])
            for e in w.events
            if "ts" in e and since <= e["ts"] <= trace_end + 0.001
        ]
        if config.impl == "replicaft":
            s["manager_events"] = [
                [round(ts - t_kill, 3), *rest] for ts, *rest in _replicaft_events(events_dir, w.name, since, trace_end)
            ]
        record["survivors"][w.name] = s
    record["recovered_in_time"] = recovered
    return record


def run(*, quick: bool) -> BenchmarkResult:
    repeats = 1 if quick else 6
    rng = random.Random(SEED)
    runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in CONFIGS}
    startup_failures: dict[str, list[str]] = {c.label: [] for c in CONFIGS}
    for r in range(repeats):
        for config in CONFIGS:
            for attempt in range(1, STARTUP_ATTEMPTS + 1):
                try:
                    record = asyncio.run(_one_run(config, victim_index=r % GROUPS, rng=rng))
                    break
                except ChildFailed as e:
                    # Raised only before the kill: the setup failed, nothing was measured. Kept in
                    # the params (and printed) so a startup problem is visible, then retried.
                    print(f"failover {config.label} run {r + 1}: setup failed (attempt {attempt}): {e}", flush=True)
                    startup_failures[config.label].append(str(e)[:4000])
                    if attempt == STARTUP_ATTEMPTS:
                        raise
            runs[config.label].append(record)
            lost = {n: s.get("lost_s", "crashed") for n, s in record["survivors"].items()}
            print(
                f"failover {config.label} run {r + 1}/{repeats}: {config.fault} to {record['victim']} "
                f"{record['kill_offset_s']:.3f}s after its commit, survivors lost {lost} "
                f"(load {record['load_1min']})",
                flush=True,
            )

    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    t_steady: dict[str, float] = {}
    gap1: dict[str, float | None] = {}
    missing: list[str] = []
    for config in CONFIGS:
        survivors = [s for rec in runs[config.label] for s in rec["survivors"].values()]
        losses = [s["lost_s"] for s in survivors if "lost_s" in s]
        t_steady[config.label] = statistics.median(s["t_steady_s"] for s in survivors)
        figures[config.crashes] = sum(1 for s in survivors if s.get("crashed"))
        gaps = [s["gap1_lost_s"] for s in survivors if "gap1_lost_s" in s]
        gap1[config.label] = round(statistics.median(gaps), 4) if gaps else None
        if not losses:  # every survivor crashed: no finite loss to report, and no fake number either
            missing.append(config.lost)
            continue
        (figures if config.is_figure else baselines)[config.lost] = statistics.median(losses)
    compared: dict[str, str] = {}
    if "survivor_lost_s" in figures:
        if baselines.get("torchft_survivor_lost_s", 0) > 0:
            compared["survivor_lost_s"] = "torchft_survivor_lost_s"
        if baselines.get("torchft_survivor_lost_s_hb1", 0) > 0:
            figures[SECOND_RATIO] = figures["survivor_lost_s"]
            compared[SECOND_RATIO] = "torchft_survivor_lost_s_hb1"
    if "hung_lost_s" in figures:
        if baselines.get("fixed_timeout_hung_lost_s", 0) > 0:
            compared["hung_lost_s"] = "fixed_timeout_hung_lost_s"
        if figures.get("survivor_lost_s", 0) > 0:
            figures[HUNG_VS_SIGKILL] = figures["hung_lost_s"]
            baselines["sigkill_survivor_lost_s"] = figures["survivor_lost_s"]
            compared[HUNG_VS_SIGKILL] = "sigkill_survivor_lost_s"
    return BenchmarkResult(
        name="failover",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes=(
            f"seconds a surviving group loses when one of 3 groups (W=1, ~1 MB model, {STEP_SLEEP_S * 1000:.0f} ms "
            f"pacing sleep per step) is SIGKILLed at a random point of a step: (K-th commit after the kill - last "
            f"commit before) - K*T_steady, K={AFTER_COMMITS}, median over 2 survivors x {repeats} run(s) per side; "
            "T_steady (median commit interval before the kill): "
            + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in t_steady.items())
            + "; torchft baselines: its lighthouse with CLI defaults (heartbeat timeout 5 s) and with a 1 s "
            f"heartbeat timeout (_hb1); {SECOND_RATIO} repeats survivor_lost_s to carry the ratio to _hb1; "
            "steps after the kill run with 2 groups and are a few ms shorter than T_steady, which hides "
            "that much of the loss on both sides; hung_lost_s: the same with SIGSTOP instead of SIGKILL (the stopped "
            "process's connection stays open), against replicaft's lighthouse with the adaptive silence limit off "
            f"({' '.join(FIXED_TIMEOUT_ARGS)}: the fixed timeout of before) and against the SIGKILL loss of the same "
            "run; "
            "*_survivor_crashes counts survivors that raised or did not commit K steps within "
            f"{RECOVERY_TIMEOUT_S:g} s of the kill (left out of the median)"
            + (f"; no survivor recovered, so not reported: {', '.join(missing)}" if missing else "")
        ),
        params={
            "quick": quick,
            "repeats": repeats,
            "groups": GROUPS,
            "step_sleep_s": STEP_SLEEP_S,
            "warm_steps": {c.label: c.warm_steps for c in CONFIGS},
            "after_commits_k": AFTER_COMMITS,
            "t_steady_s": t_steady,
            "gap1_lost_s_median": gap1,
            "startup_failures": startup_failures,
            "runs": runs,
        },
    )
