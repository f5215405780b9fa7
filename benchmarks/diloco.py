"""Why DiLoCo exists: tokens/s and loss over a slow link, DDP against (streaming) DiLoCo and torchft's.

Three groups of the GPT example (examples/train_gpt.py's model and corpus), each in its own
network namespace (chaos/network.py) whose link to the bridge is shaped with ``tc tbf`` to
``RATE_MBIT`` both ways, the lighthouse in a fourth. One run per mode, one after another, each
for the same wall time from its first commit: DDP (``examples/train_gpt.py``: an all-reduce
of every gradient every step), replicaft DiLoCo at H = 20 and H = 100, streaming DiLoCo
(4 fragments, each all-reduce overlapping inner steps), torchft 0.2.0's DiLoCo at H = 20
(benchmarks/diloco_torchft_worker.py, torchft's own lighthouse), and a replicaft DiLoCo
H = 20 run in which one group is SIGKILLed in the middle of a round and restarted.

Figures: job tokens/s (tokens of committed steps or syncs, all groups, over the time to the
last commit), the held-out loss at the end, and for DiLoCo the held-out loss at the first
sync whose job tokens reach DDP's final count (DiLoCo is meant to be as good per token and
faster per second). The fault's cost to a survivor: the longest of its three rounds after
the kill, less its median round, in inner steps (a round's time / H). Needs root, ``ip``
and ``tc`` (network namespaces); nothing leaves the namespaces this benchmark creates.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.results import (
    RESULTS_DIR,
    BenchmarkResult,
    format_table,
    machine_info,
    now_utc,
    write_result,
)
from chaos.network import NetworkLab
from replicaft.process.process_tree import dying_with_parent
from replicaft.telemetry.events import read_events_dir

REPO = Path(__file__).resolve().parent.parent
GROUPS = ("g0", "g1", "g2")
RATE_MBIT = 100.0
LIGHTHOUSE_PORT = 29510
JOIN_TIMEOUT_S = 20.0
"""How long a quorum waits for a live straggler. A DiLoCo round is seconds long and the groups
(three on two shared cores) finish theirs seconds apart; with the default 2 s the last one
missed the quorum at most syncs and spent the next round healing. A dead group is noticed
at once (its session breaks), so this only bounds the wait for a slow one."""
MODEL = ("--layers", "4", "--heads", "4", "--d-model", "256", "--context", "64", "--batch-size", "4", "--threads", "1")
CONTEXT = 64
_EVAL_LINE = re.compile(r"held-out loss ([0-9.]+)")


@dataclass
class Proc:
    """A process in a namespace, its stdout lines (with arrival times) read by a thread."""

    name: str
    popen: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)

    def read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def json_lines(self) -> list[dict[str, Any]]:
        out = []
        for _, line in self.lines:
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def wait_for(self, pattern: str, timeout_s: float, *, min_step: int | None = None) -> str:
        """The first line containing ``pattern`` (a sync line at ``min_step`` or later)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, line in self.lines:
                if pattern in line and (min_step is None or json.loads(line).get("step", -1) >= min_step):
                    return line
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(
            f"{self.name} printed no line with {pattern!r} within {timeout_s:g}s; last: {self.lines[-3:]}"
        )


def start(lab: NetworkLab, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Proc:
    stderr = (log_dir / f"{name}.stderr").open("ab")
    popen = subprocess.Popen(
        dying_with_parent(lab.wrap(name, args)),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
        cwd=REPO,
    )
    proc = Proc(name, popen)
    threading.Thread(target=proc.read, daemon=True).start()
    return proc


def stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
    for p in procs:
        p.popen.wait(10)


def run_mode(
    lab: NetworkLab, mode: str, seconds: float, log_dir: Path, *, kill_mid_round: bool = False
) -> dict[str, Any]:
    """One mode's run; returns its measurements."""
    lh_addr = f"{lab.address('lh')}:{LIGHTHOUSE_PORT}"
    events = log_dir / f"{mode}-events"
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        GLOO_SOCKET_IFNAME="eth0",
        REPLICAFT_LIGHTHOUSE=lh_addr,
        TORCHFT_LIGHTHOUSE=f"http://{lh_addr}",
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_COLLECTIVE_TIMEOUT_S="60",
        REPLICAFT_QUORUM_TIMEOUT_S="180",
        REPLICAFT_HEAL_TIMEOUT_S="120",
    )
    py = sys.executable
    torchft = mode.startswith("torchft")
    lighthouse = (
        [
            str(Path(py).parent / "torchft_lighthouse"),
            "--bind",
            f"{lab.address('lh')}:{LIGHTHOUSE_PORT}",
            "--min_replicas",
            "1",
            "--join_timeout_ms",
            str(int(JOIN_TIMEOUT_S * 1000)),
        ]
        if torchft
        else [
            py,
            "-m",
            "lighthouse",
            "--host",
            lab.address("lh"),
            "--port",
            str(LIGHTHOUSE_PORT),
            "--progress-timeout",
            "60",
            "--heartbeat-timeout",
            "5",
            "--join-timeout",
            str(JOIN_TIMEOUT_S),
        ]
    )
    procs = [start(lab, "lh", lighthouse, env, log_dir)]
    try:
        if not torchft:
            procs[0].wait_for("serving gRPC", 30)
        groups = {}
        for i, g in enumerate(GROUPS):
            genv = dict(env, REPLICAFT_REPLICA_ID=g, REPLICA_GROUP_ID=g, REPLICAFT_HOST=lab.address(g))
            groups[g] = start(lab, g, _group_args(mode, i, seconds, lab.address(g)), genv, log_dir)
        procs += groups.values()
        groups["g0"].wait_for("step" if mode == "ddp" else '"sync"', 300)
        started = time.monotonic()
        killed_at = None
        if kill_mid_round:
            killed_at, groups["g2"] = _kill_and_restart(lab, groups["g2"], mode, seconds, env, log_dir, started)
            procs.append(groups["g2"])
        if mode == "ddp":
            time.sleep(seconds)  # DDP has no time limit of its own: measured over the same wall time
            for p in groups.values():
                p.popen.send_signal(signal.SIGTERM)
        for p in groups.values():
            p.popen.wait(seconds + 300)
    finally:
        stop(procs)
    if mode == "ddp":
        return _ddp_figures(groups, events, seconds)
    return _diloco_figures(groups, killed_at)


def _group_args(mode: str, rank: int, seconds: float, host: str) -> list[str]:
    py = sys.executable
    if mode == "ddp":
        return [py, "examples/train_gpt.py", "--steps", "100000", "--eval-every", "10", "--log-every", "10", *MODEL]
    if mode.startswith("torchft"):
        return [
            py,
            "benchmarks/diloco_torchft_worker.py",
            "--host",
            host,
            "--rank",
            str(rank),
            "--groups",
            str(len(GROUPS)),
            "--seconds",
            str(seconds),
            "--sync-every",
            "20",
            *MODEL[:-2],
        ]
    h = {
        "diloco_h20": ["--sync-every", "20"],
        "diloco_h100": ["--sync-every", "100"],
        "streaming": ["--sync-every", "100", "--fragments", "4", "--delay", "5"],
        "diloco_h20_fault": ["--sync-every", "20"],
    }[mode]
    return [
        py,
        "examples/train_diloco.py",
        "--syncs",
        "100000",
        "--seconds",
        str(seconds),
        "--eval-every",
        "1",
        *h,
        *MODEL,
    ]


def _kill_and_restart(
    lab: NetworkLab, victim: Proc, mode: str, seconds: float, env: dict[str, str], log_dir: Path, started: float
) -> tuple[float, Proc]:
    """SIGKILL ``victim`` in the middle of the round after its fourth sync, restart it a second
    later (an orchestrator's delay) to train until the others stop; returns the time of the
    kill and the new process."""
    victim.wait_for('"sync"', 300, min_step=4)
    rounds = [o["seconds"] for o in victim.json_lines() if o.get("event") == "sync"]
    time.sleep((rounds[-1] - rounds[-2]) / 2 if len(rounds) > 1 else 1.0)
    victim.popen.kill()
    killed_at = time.monotonic()
    time.sleep(1.0)
    genv = dict(
        env, REPLICAFT_REPLICA_ID=victim.name, REPLICA_GROUP_ID=victim.name, REPLICAFT_HOST=lab.address(victim.name)
    )
    remaining = max(seconds - (time.monotonic() - started), 1.0)
    return killed_at, start(
        lab,
        victim.name,
        _group_args(mode, GROUPS.index(victim.name), remaining, lab.address(victim.name)),
        genv,
        log_dir,
    )


def _ddp_figures(groups: dict[str, Proc], events_dir: Path, seconds: float) -> dict[str, Any]:
    commits: dict[int, tuple[float, int]] = {}
    for e in read_events_dir(events_dir):
        if e["event"] == "commit" and e.get("committed") and isinstance(e.get("samples"), list):
            commits.setdefault(int(e["step"]), (float(e["ts"]), (e["samples"][1] - e["samples"][0]) * CONTEXT))
    if not commits:
        raise RuntimeError(f"DDP committed no step with samples; see {events_dir}")
    times = sorted(ts for ts, _ in commits.values())
    t0 = times[0]
    inside = [n for ts, n in commits.values() if ts <= t0 + seconds]
    last = max(ts for ts, _ in commits.values() if ts <= t0 + seconds)
    evals = [float(m.group(1)) for _, line in groups["g0"].lines if (m := _EVAL_LINE.search(line))]
    return {
        "tokens": sum(inside),
        "tokens_per_s": sum(inside) / max(last - t0, 1e-9),
        "steps": len(inside),
        "held_out_loss": evals[-1] if evals else None,
    }


def _diloco_figures(groups: dict[str, Proc], killed_at: float | None) -> dict[str, Any]:
    """Job tokens/s: each group's tokens at its last committed sync over that sync's time,
    summed (the groups stop at their own time limit, a sync apart). The loss curve: at each
    step, the tokens every group had trained by then and the mean held-out loss reported."""
    lines = {name: [o for o in groups[name].json_lines() if o.get("event") == "sync"] for name in GROUPS}
    if not any(lines.values()):
        raise RuntimeError("no group committed a sync")
    rate = sum(g[-1]["tokens"] / max(g[-1]["seconds"], 1e-9) for g in lines.values() if g)
    steps = sorted({o["step"] for g in lines.values() for o in g})
    curve = []
    for step in steps:
        upto = [max((o for o in g if o["step"] <= step), key=lambda o: o["step"], default=None) for g in lines.values()]
        losses = [o["held_out_loss"] for g in lines.values() for o in g if o["step"] == step and "held_out_loss" in o]
        if losses:
            curve.append((sum(o["tokens"] for o in upto if o), statistics.mean(losses)))
    last = [g[-1] for g in lines.values() if g]
    out: dict[str, Any] = {
        "tokens": sum(o["tokens"] for o in last),
        "tokens_per_s": rate,
        "syncs": len(steps),
        "held_out_loss": statistics.mean(o["held_out_loss"] for o in last if "held_out_loss" in o),
        "curve": curve,
        "retried_syncs": max(o.get("retried", 0) for o in last),
    }
    if killed_at is not None:
        costs = [_fault_costs(groups[g], killed_at) for g in ("g0", "g1")]
        out["fault_round_excess_inner_steps"] = max(c[0] for c in costs)
        out["rejoin_round_excess_inner_steps"] = max(c[1] for c in costs)
        out["fault_cost_inner_steps"] = max(max(c) for c in costs)
    return out


def _fault_costs(survivor: Proc, killed_at: float) -> tuple[float, float]:
    """(the survivor's round that ends at its first sync after the kill, the longer of its next
    two rounds: the restarted group's join and heal), each less its median round, in inner
    steps (its median round / H). On this shared 2-core machine rounds of the same run vary
    by several inner steps without any fault: read these next to the fault run's tokens/s
    against the fault-free run's."""
    ends = [t for t, line in survivor.lines if line.startswith('{"event": "sync"')]
    rounds = [(b, b - a) for a, b in zip(ends, ends[1:], strict=False)]
    after = [r for end, r in rounds if end > killed_at]
    if len(after) < 3:
        raise RuntimeError(f"{survivor.name} committed fewer than three syncs after the kill")
    median = statistics.median(r for _, r in rounds)
    step = median / 20
    return (after[0] - median) / step, (max(after[1:3]) - median) / step


MODES = ("ddp", "diloco_h20", "diloco_h100", "streaming", "torchft_diloco", "diloco_h20_fault")


def run(*, quick: bool) -> BenchmarkResult:
    seconds = 40.0 if quick else 120.0
    with tempfile.TemporaryDirectory(prefix="replicaft-diloco-") as tmp:
        return _result(run_modes(MODES, seconds, Path(tmp)), seconds)


def run_modes(modes: Sequence[str], seconds: float, log_dir: Path) -> dict[str, dict[str, Any]]:
    """Run ``modes`` one after another in one set of namespaces; their measurements by mode.
    The groups' stderr and JSON event logs (``<mode>-events``) are left in ``log_dir``."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown diloco benchmark modes {unknown}; choose from {', '.join(MODES)}")
    lab = NetworkLab(GROUPS)
    results: dict[str, dict[str, Any]] = {}
    lab.create()
    try:
        for g in GROUPS:
            lab.shape(g, RATE_MBIT, None)
        for mode in modes:
            try:
                results[mode] = run_mode(lab, mode, seconds, log_dir, kill_mid_round=mode.endswith("_fault"))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                if not mode.startswith("torchft"):
                    raise
                results[mode] = {"error": str(e)}
            print(
                f"diloco benchmark: {mode}: { ({k: v for k, v in results[mode].items() if k != 'curve'}) }", flush=True
            )
    finally:
        lab.close()
    return results


def _loss_at_tokens(curve: list[tuple[int, float]], tokens: int) -> float | None:
    return next((loss for t, loss in curve if t >= tokens), None)


def _result(r: dict[str, dict[str, Any]], seconds: float) -> BenchmarkResult:
    """The record of the runs in ``r``. A run without its loss curve (one read back from the
    results file by ``--update``) gives no loss-at-DDP's-tokens figure: the caller keeps the
    one recorded with it."""
    ddp = r["ddp"]
    figures: dict[str, float] = {}
    for mode in ("diloco_h20", "diloco_h100", "streaming"):
        figures[f"{mode}_tokens_per_s"] = r[mode]["tokens_per_s"]
        figures[f"{mode}_held_out_loss"] = r[mode]["held_out_loss"]
        at = _loss_at_tokens(r[mode].get("curve", []), ddp["tokens"])
        if at is not None:
            figures[f"{mode}_held_out_loss_at_ddp_tokens"] = at
    figures["diloco_h20_vs_torchft_tokens_per_s"] = r["diloco_h20"]["tokens_per_s"]
    fault = r["diloco_h20_fault"]
    for name in ("fault_cost_inner_steps", "fault_round_excess_inner_steps", "rejoin_round_excess_inner_steps"):
        if name in fault:  # the split came after the first recorded fault runs
            figures[name] = fault[name]
    figures["fault_run_tokens_per_s"] = fault["tokens_per_s"]
    baselines = {
        "ddp_tokens_per_s": ddp["tokens_per_s"],
        "ddp_held_out_loss": ddp["held_out_loss"] or 0.0,
        "fault_free_h20_tokens_per_s": r["diloco_h20"]["tokens_per_s"],
    }
    torchft = r["torchft_diloco"]
    if "error" not in torchft:
        baselines["torchft_diloco_h20_tokens_per_s"] = torchft["tokens_per_s"]
        baselines["torchft_diloco_h20_held_out_loss"] = torchft["held_out_loss"]
    compared = {f"{m}_tokens_per_s": "ddp_tokens_per_s" for m in ("diloco_h20", "diloco_h100", "streaming")}
    compared.update(
        {
            f"{m}_held_out_loss_at_ddp_tokens": "ddp_held_out_loss"
            for m in ("diloco_h20", "diloco_h100", "streaming")
            if f"{m}_held_out_loss_at_ddp_tokens" in figures and baselines["ddp_held_out_loss"] > 0
        }
    )
    if "error" not in torchft:
        compared["diloco_h20_vs_torchft_tokens_per_s"] = "torchft_diloco_h20_tokens_per_s"
    compared["fault_run_tokens_per_s"] = "fault_free_h20_tokens_per_s"
    return BenchmarkResult(
        name="diloco",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes=(
            "3 groups of the GPT example (4 layers, d_model 256, context 64, 4 windows per step, 1 thread each), "
            f"each group's link shaped to {RATE_MBIT:g} Mbit/s (tc tbf) in its own network namespace; every mode "
            f"runs {seconds:g} s from its first commit. tokens/s counts committed steps or syncs of all groups; "
            "losses are held-out (32 windows). A group is SIGKILLed in the middle of a round of the fault run and "
            "restarted 1 s later: fault_cost_inner_steps is a survivor's longest round among the three after the "
            "kill, less its median round, in inner steps (the worse survivor); fault_round_excess_inner_steps is "
            "the first of those rounds (ends at the first sync after the kill), rejoin_round_excess_inner_steps the "
            "longer of the next two (the join and heal); rounds vary by several inner steps here without faults. "
            "After a partial rerun (python -m benchmarks.diloco --modes ... --update), params.modes_run says when "
            "each mode last ran."
        ),
        params={
            "seconds": seconds,
            "rate_mbit": RATE_MBIT,
            "runs": {m: {k: v for k, v in x.items() if k != "curve"} for m, x in r.items()},
        },
    )


def update_results(
    new_runs: dict[str, dict[str, Any]], seconds: float, path: Path, *, when: str, machine: dict[str, Any]
) -> dict[str, Any]:
    """The results record at ``path`` with the modes in ``new_runs`` replaced: their runs,
    the figures and ratios computed from them, and ``params.modes_run[mode] = when``. The other
    modes' runs and figures stay as recorded (their curves are not kept, so their
    loss-at-DDP's-tokens figures are carried over, not recomputed)."""
    old = json.loads(path.read_text())
    runs = {**old["params"]["runs"], **new_runs}
    missing = [m for m in MODES if m not in runs]
    if missing:
        raise ValueError(f"{path} has no runs of {missing} to keep; run them too (--modes) or the whole benchmark")
    new = _result(runs, seconds).to_record(when=when, machine=machine)
    params = new["params"]
    params["compared_to"] = {**old["params"].get("compared_to", {}), **params["compared_to"]}
    params["modes_run"] = {
        **{m: old["when"] for m in MODES},
        **old["params"].get("modes_run", {}),
        **{m: when for m in new_runs},
    }
    params["seconds_by_mode"] = {
        **{m: old["params"]["seconds"] for m in MODES},
        **old["params"].get("seconds_by_mode", {}),
        **{m: seconds for m in new_runs},
    }
    figures = {**old["figures"], **new["figures"]}
    baselines = {**old["baselines"], **new["baselines"]}
    ratios = {
        f: round(figures[f] / baselines[b], 4)
        for f, b in params["compared_to"].items()
        if f in figures and baselines.get(b)
    }
    return {**new, "figures": figures, "baselines": baselines, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.diloco --modes diloco_h20_fault [--update]``: some modes only."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.diloco",
        description="Run some modes of the diloco benchmark (python -m benchmarks diloco runs all).",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: %(default)s")
    parser.add_argument("--seconds", type=float, default=120.0, help="each mode's run from its first commit")
    parser.add_argument("--log-dir", type=Path, help="keep the groups' stderr and event logs here (default: removed)")
    parser.add_argument(
        "--update",
        action="store_true",
        help=f"replace these modes' runs and figures in {RESULTS_DIR / 'diloco.json'}, keep the others",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="replicaft-diloco-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        when, machine = now_utc(), machine_info()
        runs = run_modes(modes, args.seconds, log_dir)
    if args.update:
        machine["load_average_end"] = machine_info()["load_average"]
        record = update_results(runs, args.seconds, RESULTS_DIR / "diloco.json", when=when, machine=machine)
        print(f"updated {write_result(record, RESULTS_DIR)}")
        print(format_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
