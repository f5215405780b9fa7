"""A discrete-event simulator of a whole fault-tolerant job, on the lighthouse's real rules.

``python -m benchmarks scale`` runs it (benchmark.py). The lighthouse's decisions are pure code
that takes the time as an argument (lighthouse/rules/), so the simulator imports them and
drives them through a virtual clock: every registration, heartbeat, quorum request, loss, fence
and quorum of a simulated replicaft job is a call into the real ``Membership``. The rest of
the job (step times, failures, restarts, heals, the network) is a model whose parameters are
calibrated on this machine's measured figures (calibration.py) or taken from published failure
statistics (faults.py). The alternatives run in the same simulator against the same failures:
torchft's published rules (torchft_lighthouse.py, a port of its ``quorum_compute``) and
checkpoint-restart of the whole job at the Young/Daly interval (checkpoint_job.py).

Modules: params.py (what a job is), calibration.py (costs from benchmarks/results), faults.py
(the failure process), steps.py (step times, lighthouse latency), events.py (the virtual clock),
job.py (the group lifecycle every fault-tolerant system shares), replicaft_lighthouse.py and
torchft_lighthouse.py (each system's rules behind one seam), checkpoint_job.py, outcome.py (what
a run reports), compare.py (one configuration under the three alternatives), left_out.py (a
rule problem reproduced), svg.py and page.py (the results page), benchmark.py (the sweeps).
"""
