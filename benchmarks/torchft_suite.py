"""torchft 0.2.0's own integration tests, run against replicaft's shim and against torchft.

The files come from the installed torchft wheel (the ``bench`` and ``dev`` extras install it):
``manager_integ_test.py``, ``local_sgd_integ_test.py`` and ``diloco_regression_test.py``.
Each suite runs in its own pytest process, once with ``import torchft`` resolved to
``replicaft.compat.torchft`` (benchmarks/torchft_suite_plugin.py, the alias folder of
``replicaft-launch --torchft``) and once against torchft itself, the baseline from the same
run. Every test's outcome and, when it does not pass, the first lines of its failure are kept
in ``params.tests``; the guide's list of reasons (docs/guide/torchft.md) is written from them. A test that fails
on its own deadline often failed earlier inside replicaft (a heal refused, a step not
committed): the first such cause replicaft logged is added to the reason, since the
exception alone names only the symptom.

While working on the shim, ``python -m benchmarks.torchft_suite [-k EXPR] [--torchft] [FILE ...]``
runs some of the tests (pytest's ``-k``) and prints each outcome and reason; it writes no
results file, so a partial run never replaces the whole suite's record.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.results import BenchmarkResult
from benchmarks.torchft_suite_plugin import installed_torchft_dir

REPO = Path(__file__).resolve().parent.parent
SUITES = ("manager_integ_test.py", "local_sgd_integ_test.py", "diloco_regression_test.py")
QUICK = (
    "manager_integ_test.py::ManagerIntegTest::test_ddp_healthy",
    "manager_integ_test.py::ManagerIntegTest::test_ddp_recovery_0_async_quorum",
)
PER_TEST_TIMEOUT_S = 90
LOGGED_CAUSE = re.compile(r"^WARNING +replicaft\S* .*?step will not commit: (.*)$", re.MULTILINE)
"""replicaft's warning for a step that fails, as pytest captures it (junit_logging=log)."""


def run_suite(
    targets: list[str], *, real: bool, per_test_timeout_s: int = PER_TEST_TIMEOUT_S, select: str | None = None
) -> dict[str, dict[str, str]]:
    """Run pytest on ``targets`` (paths under the installed torchft), only the tests matching
    ``select`` (pytest's ``-k``) if given; outcome and reason per test."""
    with tempfile.TemporaryDirectory(prefix="torchft-suite-") as tmp:
        report = Path(tmp) / "report.xml"
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        env["TORCHFT_SUITE_REAL"] = "1" if real else "0"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "benchmarks.torchft_suite_plugin",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            tmp,
            "-q",
            "--timeout",
            str(per_test_timeout_s),
            f"--junitxml={report}",
            "-o",
            "junit_logging=log",
            "-o",
            "log_level=WARNING",
            *(["-k", select] if select else []),
            *targets,
        ]
        subprocess.run(
            cmd,
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=per_test_timeout_s * 60,
            check=False,
        )
        return parse_junit(report) if report.exists() else {}


def parse_junit(path: Path) -> dict[str, dict[str, str]]:
    tests: dict[str, dict[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                reason = _first_lines(child.get("message") or child.text or "")
                if outcome != "skipped":
                    reason = _with_logged_cause(reason, case.findtext("system-out") or "")
                break
        tests[name] = {"outcome": outcome, "reason": reason, "seconds": case.get("time", "")}
    return tests


def _first_lines(text: str, limit: int = 400) -> str:
    return " ".join(text.strip().split())[:limit]


def _with_logged_cause(reason: str, captured_log: str) -> str:
    """``reason``, then the first step failure replicaft logged in the test, where there was one
    and the reason does not already say it."""
    match = LOGGED_CAUSE.search(captured_log)
    if match is None or match.group(1).strip() in reason:
        return reason
    return f"{_first_lines(reason, 250)} [first logged: step will not commit: {_first_lines(match.group(1), 250)}]"


def run(*, quick: bool) -> BenchmarkResult:
    root = installed_torchft_dir()
    targets = [str(root / t) for t in (QUICK if quick else SUITES)]
    shim = run_suite(targets, real=False)
    real = run_suite(targets, real=True)
    figures: dict[str, float] = {"shim_tests_passed": _count(shim, "passed"), "shim_tests_run": _ran(shim)}
    baselines: dict[str, float] = {"torchft_tests_passed": _count(real, "passed"), "torchft_tests_run": _ran(real)}
    tests: dict[str, Any] = {
        name: {"shim": shim.get(name), "torchft": real.get(name)} for name in sorted(shim.keys() | real.keys())
    }
    return BenchmarkResult(
        name="torchft_suite",
        figures=figures,
        baselines=baselines,
        compared_to={"shim_tests_passed": "torchft_tests_passed"} if baselines["torchft_tests_passed"] else {},
        notes=(
            "torchft 0.2.0's integration test files from its wheel, run unmodified with `import torchft` resolved to "
            "replicaft.compat.torchft, and against torchft itself in the same run; skipped tests (CUDA, torchcomms) "
            "are not counted as run. Per-test outcomes and failure reasons are in params.tests."
        ),
        params={"suites": list(QUICK if quick else SUITES), "per_test_timeout_s": PER_TEST_TIMEOUT_S, "tests": tests},
    )


def _count(tests: dict[str, dict[str, str]], outcome: str) -> float:
    return float(sum(1 for t in tests.values() if t["outcome"] == outcome))


def _ran(tests: dict[str, dict[str, str]]) -> float:
    return float(sum(1 for t in tests.values() if t["outcome"] != "skipped"))


def main(argv: list[str] | None = None) -> int:
    """Run a subset against the shim (or torchft) and print outcome, seconds, test and reason."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.torchft_suite", description=__doc__.splitlines()[0])
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help=f"test files of the torchft wheel (default: all of {', '.join(SUITES)})",
    )
    p.add_argument("-k", dest="select", help="pytest's -k expression, e.g. 'upscale and not 11'")
    p.add_argument("--torchft", action="store_true", help="run against torchft itself instead of the shim")
    args = p.parse_args(argv)
    unknown = [f for f in args.files if f not in SUITES]
    if unknown:
        p.error(f"{', '.join(unknown)}: not one of the suite's files ({', '.join(SUITES)})")
    root = installed_torchft_dir()
    tests = run_suite([str(root / f) for f in args.files or SUITES], real=args.torchft, select=args.select)
    for name, t in sorted(tests.items()):
        print(f"{t['outcome']:8} {float(t['seconds'] or 0):7.2f}s  {name}  {t['reason']}".rstrip())
    print(f"{_count(tests, 'passed'):.0f} of {_ran(tests):.0f} run passed ({len(tests) - _ran(tests):.0f} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
