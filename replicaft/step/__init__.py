"""The step: what the training thread does from ``zero_grad`` to the commit.

Read top-down: ``driver.py`` (``StepDriver``: start the quorum, apply its plan, all-reduce,
vote, commit or abort), ``plan_applier.py`` (a quorum's plan applied to this rank),
``commit.py`` (the per-rank verdict and the commit rule, pure), ``record.py`` (what one step
learned and where its time went), ``notices.py`` (the lighthouse's notices against the step in
progress) and ``boundary.py`` (digest, checkpoint, resume and leave between steps).
"""
