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
