"""torchft 0.2.0's own integration tests pass against replicaft's shim (a fast subset).

The whole suite (three files, 45 tests, several minutes) runs as ``python -m benchmarks
torchft_suite``, against the shim and against torchft in the same run; its pass list and the
reason for every test that does not pass are in benchmarks/results/torchft_suite.json and the
README. The files come from the torchft wheel the ``dev`` extra installs.
"""

from __future__ import annotations

import pytest

from benchmarks.torchft_suite import QUICK, run_suite
from benchmarks.torchft_suite_plugin import installed_torchft_dir


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchfts_own_ddp_tests_pass_against_the_shim_unmodified() -> None:
    root = installed_torchft_dir()
    results = run_suite([str(root / t) for t in QUICK], real=False, per_test_timeout_s=120)
    assert len(results) == len(QUICK), results
    assert {name: r["outcome"] for name, r in results.items()} == dict.fromkeys(results, "passed"), results


MODULES_LOADED = """
import importlib, json, sys
import benchmarks.torchft_suite_plugin as plugin
for name in ("torchft.manager_integ_test", "torchft.local_sgd_integ_test", "torchft._test.diloco_trainer"):
    importlib.import_module(name)
loaded = {n: getattr(m, "__file__", None) for n, m in sys.modules.items() if n == "torchft" or n.startswith("torchft.")}
try:
    importlib.import_module("torchft.http")
    missing = None
except ImportError as e:
    missing = str(e)
print(json.dumps({"wheel": str(plugin.installed_torchft_dir()), "loaded": loaded,
    "names": {n: sys.modules[n].__name__ for n in loaded}, "missing": missing}))
"""


@pytest.mark.timeout(180)
def test_with_the_shim_only_torchfts_test_files_load_from_its_wheel(tmp_path) -> None:
    """Every module torchft's integration tests import is replicaft's; from the wheel's folder
    only the test files themselves load, and a torchft module the shim lacks is missing, as with
    replicaft installed without torchft."""
    import json
    import os
    import subprocess
    import sys

    from benchmarks.torchft_suite import REPO
    from benchmarks.torchft_suite_plugin import is_test_module

    env = dict(os.environ, PYTHONPATH=str(REPO), TORCHFT_SUITE_REAL="0")
    out = subprocess.run(
        [sys.executable, "-c", MODULES_LOADED], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    from_wheel = {n for n, f in report["loaded"].items() if f is None or f.startswith(report["wheel"])}
    assert from_wheel and all(is_test_module(n) for n in from_wheel), sorted(from_wheel)
    shim = {n: name for n, name in report["names"].items() if n not in from_wheel}
    assert {"torchft", "torchft.manager", "torchft.process_group", "torchft.local_sgd", "torchft.ddp"} <= set(shim)
    assert all(name.startswith("replicaft.compat.torchft") for name in shim.values()), shim
    assert report["missing"] and "torchft.http" in report["missing"]
