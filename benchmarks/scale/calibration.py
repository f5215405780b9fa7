"""The simulator's costs, calibrated on this machine's measured figures (benchmarks/results).

Each cost that a benchmark measured is read from its results file, so that a re-run of that
benchmark re-calibrates the simulator; ``Costs.basis`` names the file and figure. Costs no
benchmark here can measure (a spare host being scheduled, a 16,384-GPU job restarting, a
400 Gb/s NIC) stay the parameters' defaults and are marked as assumptions with their source.
A missing results file (a fresh clone that never ran the benchmark) keeps the default too, and
says so, rather than failing: the simulator is useful before every benchmark has run.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.results import RESULTS_DIR
from benchmarks.scale.params import Costs

ASSUMED = {
    "host_replace_s": "assumed: a spare host scheduled and started (10 min)",
    "job_restart_s": "assumed: a whole large job stopped and restarted, 10 min (arXiv 2602.00277's stall per "
    "recovery at O(100k) GPUs without fault tolerance)",
    "network_gbps": "assumed: a 400 Gb/s NIC per GPU",
    "reconnect_s": "assumed: a client's first reconnect attempt after the lighthouse is back",
    "torchft_timeout_s": "torchft Manager's default timeout (60 s)",
}


def _read(results_dir: Path, name: str) -> Mapping[str, Any] | None:
    path = results_dir / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _median(rows: list[Mapping[str, float]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def calibrated_costs(results_dir: Path = RESULTS_DIR) -> Costs:
    """The default :class:`Costs` with every value this machine measured put in its place."""
    values: dict[str, float] = {}
    basis = dict(ASSUMED)

    def take(field_name: str, value: float, why: str) -> None:
        values[field_name] = value
        basis[field_name] = why

    if (rec := _read(results_dir, "recovery")) is not None:
        p = rec["params"]
        warm, cold = p["breakdown_100mb"], p["cold_breakdown_100mb"]
        take(
            "warm_restart_s",
            _median(warm, "launch_s") + _median(warm, "join_s"),
            "recovery.json: launch_s + join_s of a restart in the launcher's warm standby (100 MB)",
        )
        take(
            "cold_restart_s",
            _median(cold, "launch_s") + _median(cold, "join_s"),
            "recovery.json: launch_s + join_s of a fresh process (python and torch import)",
        )
        # Two state sizes give a line: seconds = fixed + bytes / throughput, as a restart heals.
        small, large = p["breakdown_100mb"], p["breakdown_1gb_state"]
        s_small, s_large = _median(small, "heal_s"), _median(large, "heal_s")
        b_small, b_large = small[0]["heal_bytes"], large[0]["heal_bytes"]
        s_per_byte = (s_large - s_small) / (b_large - b_small)
        take("heal_gbps", 1e-9 / s_per_byte, "recovery.json: heal_s at 100 MB and 1 GB, slope")
        take("heal_fixed_s", max(0.0, s_small - b_small * s_per_byte), "recovery.json: heal_s, intercept")
        take(
            "donor_slowdown",
            float(rec["figures"]["donor_step_ratio_during_heal"]),
            "recovery.json: donor_step_ratio_during_heal",
        )
    if (rec := _read(results_dir, "heal")) is not None:
        take(
            "torchft_heal_gbps",
            float(rec["baselines"]["torchft_best_gbps_1gb"]),
            "heal.json: torchft_best_gbps_1gb (torchft 0.2.0's faster transport, 1 GB)",
        )
    if (rec := _read(results_dir, "failover")) is not None:
        t_steady = float(rec["params"]["t_steady_s"]["replicaft"])
        take(
            "pg_rebuild_s",
            max(0.0, float(rec["figures"]["survivor_lost_s"]) - t_steady / 2),
            "failover.json: survivor_lost_s less half a step (the aborted step's mean lost work)",
        )
    if (rec := _read(results_dir, "lighthouse")) is not None:
        take("notice_s", float(rec["figures"]["notice_ms_p50"]) / 1000, "lighthouse.json: notice_ms_p50")
    if (rec := _read(results_dir, "lighthouse_ha")) is not None:
        take(
            "lighthouse_failover_s",
            float(rec["figures"]["leader_kill_lost_s"]),
            "lighthouse_ha.json: leader_kill_lost_s (a replicated lighthouse's leader SIGKILLed)",
        )
    if (rec := _read(results_dir, "checkpoint")) is not None:
        f, gb = rec["figures"], rec["params"]["state_bytes_1gb"] / 1e9
        take(
            "checkpoint_s_per_gb",
            float(f["blocked_async_1gb_ms"]) / 1000 / gb,
            "checkpoint.json: blocked_async_1gb_ms per GB",
        )
        take(
            "checkpoint_load_s_per_gb",
            float(f["restart_from_disk_1gb_s"]) / gb,
            "checkpoint.json: restart_from_disk_1gb_s per GB",
        )
    for name in {f.name for f in dataclasses.fields(Costs)} - set(basis) - {"basis"}:
        basis[name] = "default (its results file is missing)"
    return dataclasses.replace(Costs(), **values, basis=basis)


def lighthouse_round_ms(results_dir: Path = RESULTS_DIR) -> dict[int, tuple[float, float]]:
    """Members -> (quorum_ms_p50, lighthouse_cpu_ms_per_round) as measured (lighthouse.json)."""
    rec = _read(results_dir, "lighthouse")
    if rec is None:
        return {}
    f = rec["figures"]
    sizes = sorted(int(k.rsplit("_", 1)[1]) for k in f if k.startswith("quorum_ms_p50_"))
    return {n: (float(f[f"quorum_ms_p50_{n}"]), float(f[f"lighthouse_cpu_ms_per_round_{n}"])) for n in sizes}
