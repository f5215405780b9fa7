"""The chaos harness: the smoke scenario end to end with real processes and real signals, its
report opened in a real browser, and the harness's own pure pieces (scenario files, event-line
recovery, figures, the report page).

The end-to-end test runs ``python -m chaos run smoke`` exactly as a user would: a lighthouse,
three groups of ``examples/train_ddp.py``, one SIGKILL with restart and one group killing
itself mid-all-reduce. It must exit 0 with no violations, having injected both faults, and
leave a self-contained report, which headless Chromium then renders to a screenshot (the run
is made once per module and shared by both tests).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import spawn_python

from chaos.__main__ import main
from chaos.metrics import goodput, recovery_seconds, rejoin_seconds
from chaos.record import LIGHTHOUSE, InjectedFault
from chaos.report import timeline_svg
from chaos.scenario import SCENARIO_DIR, ScenarioError, load_scenario, scenario_from_dict
from chaos.timeline import Commit

SMOKE_DEADLINE_S = 120.0
"""The scenario's own run_timeout_s (75 s) plus start-up and writing the report."""


@dataclass(frozen=True, slots=True)
class SmokeRun:
    out: Path
    code: int
    output: str


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """``python -m chaos run smoke``, once for the module (the process has exited on return)."""
    out = tmp_path_factory.mktemp("chaos") / "smoke"
    run = spawn_python("-m", "chaos", "run", "smoke", "--out", str(out), name="chaos-smoke")
    code = run.wait_exit(SMOKE_DEADLINE_S)
    return SmokeRun(out, code, run.output_tail(60))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_smoke_scenario_runs_clean_and_writes_a_report(smoke_run: SmokeRun) -> None:
    out = smoke_run.out
    assert smoke_run.code == 0, smoke_run.output

    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "scenario",
        "faults_injected",
        "violations",
        "invariants_checked",
        "hangs",
        "committed_steps",
        "goodput",
        "goodput_vs_fault_free",
        "recovery_seconds",
    ):
        assert key in summary, key
    assert summary["violations"] == []
    assert summary["faults_injected"] == {"fault_point": 1, "sigkill": 1}, summary["faults_skipped"]
    assert summary["committed_steps"] == summary["target_steps"] == 40
    assert {"identical_digests", "monotonic_steps", "no_hang", "faults_rejoined"} <= set(summary["invariants_checked"])
    assert set(summary["recovery_seconds"]) == {"fault_point", "sigkill"}
    assert summary["hangs"] == 0
    assert summary["restarts"] == {"g0": 0, "g1": 1, "g2": 1}, (
        "g1 SIGKILLed and g2 killed at its fault point restart once"
    )
    assert 0 < summary["goodput"] <= 1
    assert summary["goodput_vs_fault_free"] is None
    assert summary["environment"] == {"network": "loopback"}

    page = (out / "report.html").read_text()
    assert "<svg" in page and "</svg>" in page and "<polyline" in page
    assert "<script" not in page and "src=" not in page and "<link" not in page, "the report must load nothing"
    assert "sigkill" in page and "fault_point" in page
    assert "<td>restarts</td><td>g0: 0, g1: 1, g2: 1</td>" in page


# -- the report in a real browser ------------------------------------------------------------------

CHROMIUM_INSTALL_TIMEOUT_S = 600.0
SCREENSHOT_TIMEOUT_S = 120.0
VERDICT_OK_BACKGROUND = (0xE6, 0xF4, 0xEA)
"""``.ok`` in chaos/report.py: the "all checked invariants held" box, a solid fill."""
FIRST_GROUP_LINE = (0x1F, 0x77, 0xB4)
"""The first colour of the timeline palette (g0's line)."""


def _chromium() -> str:
    """The chromium binary, installed with apt-get if missing (Debian); skips when that is impossible."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=CHROMIUM_INSTALL_TIMEOUT_S, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"`{' '.join(cmd)}` did not finish within {CHROMIUM_INSTALL_TIMEOUT_S:g}s")
        if done.returncode != 0:
            pytest.skip(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but no `chromium` binary is on PATH")
    return found


def png_rows(data: bytes, max_rows: int) -> tuple[int, int, list[bytes]]:
    """Width, height and the first ``max_rows`` decoded rows (RGB) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], b""
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        header = body if kind == b"IHDR" else header
        idat += [body] if kind == b"IDAT" else []
        pos += 12 + size
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unexpected PNG format {depth=} {color=} {interlace=}"
    bpp = 3 if color == 2 else 4
    raw, stride, prev, rows = zlib.decompress(b"".join(idat)), width * bpp, bytearray(width * bpp), []
    for y in range(min(height, max_rows)):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line) if bpp == 3 else bytes(v for j, v in enumerate(line) if j % 4 != 3))
        prev = line
    return width, height, rows


@pytest.mark.slow
@pytest.mark.timeout(150 + CHROMIUM_INSTALL_TIMEOUT_S * 2 + SCREENSHOT_TIMEOUT_S)
def test_report_renders_in_a_headless_browser(smoke_run: SmokeRun, tmp_path: Path) -> None:
    report = smoke_run.out / "report.html"
    if not report.exists():
        pytest.fail(f"the smoke run wrote no report (exit {smoke_run.code}): {smoke_run.output}")
    chromium = _chromium()
    shot = tmp_path / "report.png"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1100,1400",
        f"--screenshot={shot}",
        report.resolve().as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=SCREENSHOT_TIMEOUT_S, check=False)
    assert done.returncode == 0 and shot.exists(), f"chromium exit {done.returncode}: {done.stderr[-2000:]}"
    data = shot.read_bytes()
    assert len(data) > 20_000, f"a {len(data)}-byte screenshot is all but blank"
    width, height, rows = png_rows(data, max_rows=600)  # the header, the verdict and the timeline
    assert (width, height) == (1100, 1400)
    pixels = {row[i : i + 3] for row in rows for i in range(0, len(row), 3)}
    assert len(pixels) > 50, f"only {len(pixels)} colours in the top of the page"
    assert bytes(VERDICT_OK_BACKGROUND) in pixels, "the green 'all checked invariants held' box is not rendered"
    assert bytes(FIRST_GROUP_LINE) in pixels, "the timeline's group lines are not rendered"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_run_cut_off_by_its_deadline_exits_1_reporting_a_hang(tmp_path: Path) -> None:
    scenario = tmp_path / "cut-short.toml"
    # step_delay_s: 40 steps take at least 40 s, so the run cannot end on its own within its 3 s
    # deadline however fast the machine (with one thread per process, 40 plain steps took 2.4 s).
    scenario.write_text('name = "cut-short"\ngroups = 2\nsteps = 40\nstep_delay_s = 1.0\nrun_timeout_s = 3.0\n')
    run = spawn_python("-m", "chaos", "run", str(scenario), "--out", str(tmp_path / "out"), name="chaos-cut-short")
    assert run.wait_exit(30.0) == 1, run.output_tail(40)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["deadline_exceeded"] is True
    assert summary["hangs"] == 1
    assert [v["invariant"] for v in summary["violations"]] == ["no_hang"]


# -- scenarios -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_loads(path: Path) -> None:
    scenario = load_scenario(path.stem)
    assert scenario.name == path.stem
    assert scenario.faults


def test_demo_has_the_faults_the_readme_promises() -> None:
    kinds = {f.kind for f in load_scenario("demo").faults}
    assert {"sigkill", "sigstop", "kill_lighthouse"} <= kinds


BAD_SCENARIOS = [
    ({"name": "x", "stepz": 3}, "unknown keys ['stepz']"),
    ({"name": "x", "faults": [{"kind": "sigkill", "target": "g1"}]}, "exactly one of at_s"),
    ({"name": "x", "faults": [{"kind": "sigkill", "target": "g7", "at_step": 2}]}, "target='g7'"),
    ({"name": "x", "faults": [{"kind": "sigstop", "target": "g1", "at_step": 2}]}, "duration_s"),
    (
        {"name": "x", "faults": [{"kind": "fault_point", "target": "g1", "at_s": 2.0, "point": "allreduce"}]},
        "use at_step",
    ),
    (
        {"name": "x", "faults": [{"kind": "fault_point", "target": "g1", "at_step": 2, "point": "lunch"}]},
        "point='lunch'",
    ),
    ({"name": "x", "faults": [{"kind": "kill_lighthouse", "target": "g1", "at_step": 2}]}, "takes no target"),
    ({"name": "x", "faults": [{"kind": "meteor", "at_step": 2}]}, "faults[0].kind must be one of"),
    (
        {"name": "x", "steps": 10, "faults": [{"kind": "sigkill", "target": "g0", "at_step": 10}]},
        "outside the run's steps",
    ),
    ({"name": "x", "heartbeat_timeout_s": 5.0, "progress_timeout_s": 5.0}, "progress_timeout_s=5.0"),
]


@pytest.mark.parametrize(("data", "message"), BAD_SCENARIOS, ids=[m for _, m in BAD_SCENARIOS])
def test_invalid_scenario_is_rejected_naming_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        scenario_from_dict(data, source="test.toml")


def test_fault_points_are_armed_only_for_their_target() -> None:
    scenario = load_scenario("smoke")
    assert scenario.fault_points_for("g2") == "allreduce@8"
    assert scenario.fault_points_for("g0") is None


def test_unknown_scenario_exits_2_listing_the_shipped_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run", "no-such-scenario", "--out", str(tmp_path)]) == 2
    assert "smoke" in capsys.readouterr().err


# -- figures ---------------------------------------------------------------------------------------


def c(group: str, step: int, ts: float, step_time_s: float = 1.0, quorum_wait_s: float = 0.0) -> Commit:
    return Commit(
        ts=ts,
        group=group,
        rank=0,
        step=step,
        quorum_id=1,
        incarnation=1,
        num_contributors=2,
        step_time_s=step_time_s,
        quorum_wait_s=quorum_wait_s,
    )


def test_goodput_of_back_to_back_steps_is_one_and_a_stall_lowers_it() -> None:
    steady = [c(g, s, float(s)) for s in range(1, 5) for g in ("g0", "g1")]
    assert goodput(steady).value == pytest.approx(1.0)
    stalled = [*steady, c("g0", 5, 9.0), c("g1", 5, 9.0)]  # step 5 took 1 s but landed 5 s later
    assert goodput(stalled).value == pytest.approx(5 / 9)


def test_goodput_does_not_count_waiting_for_a_quorum_as_training() -> None:
    steady = [c(g, s, float(s)) for s in range(1, 5) for g in ("g0", "g1")]
    # Step 5 waited 4 s for a new quorum after a failure, then trained for 1 s.
    reformed = [
        *steady,
        c("g0", 5, 9.0, step_time_s=5.0, quorum_wait_s=4.0),
        c("g1", 5, 9.0, step_time_s=5.0, quorum_wait_s=4.0),
    ]
    assert goodput(reformed).value == pytest.approx(5 / 9)


def test_recovery_counts_survivors_only_and_rejoin_starts_when_the_target_is_back() -> None:
    commits = [c("g1", 3, 10.0), c("g0", 3, 11.5), c("g1", 4, 20.0)]
    kill = InjectedFault("sigkill", "g1", ts=9.0, resumed_ts=12.0)
    assert recovery_seconds(commits, kill) == pytest.approx(2.5)
    assert rejoin_seconds(commits, kill) == pytest.approx(8.0)
    lighthouse = InjectedFault("kill_lighthouse", LIGHTHOUSE, ts=9.0, resumed_ts=10.5)
    assert recovery_seconds(commits, lighthouse) == pytest.approx(1.0)
    assert rejoin_seconds(commits, lighthouse) == pytest.approx(1.0)
    assert rejoin_seconds(commits, InjectedFault("sigkill", "g1", ts=9.0)) is None


def test_recovery_ignores_the_step_in_flight_when_the_fault_hit() -> None:
    commits = [c("g1", 3, 10.0), c("g0", 3, 10.01), c("g0", 4, 13.0)]
    assert recovery_seconds(commits, InjectedFault("sigkill", "g1", ts=10.005)) == pytest.approx(2.995)


def test_timeline_draws_a_line_per_process_and_marks_faults() -> None:
    commits = [
        c("g0", 1, 1.0),
        c("g0", 2, 2.0),
        c("g1", 1, 1.0),
        Commit(
            ts=5.0,
            group="g1",
            rank=0,
            step=4,
            quorum_id=2,
            incarnation=2,
            num_contributors=2,
            step_time_s=1.0,
            quorum_wait_s=0.0,
        ),
    ]
    svg = timeline_svg(
        commits, [InjectedFault("sigkill", "g1", 1.5, 3.0, "sigkill g1 at step 1")], t0=0.0, t_end=6.0, target_steps=4
    )
    assert svg.count("<polyline") == 3
    assert svg.count('stroke-dasharray="5 3"') == 1
    assert "sigkill g1 at step 1" in svg
