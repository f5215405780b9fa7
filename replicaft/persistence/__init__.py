"""The manager's persistent-checkpoint duties: save rarely, resume only when no peer can donate.

``duties.py`` (``Persistence``: when to save and what to resume from), ``cadence.py`` (the
``checkpoint_interval="auto"`` interval), ``resume_check.py`` (does a resumed run train like
the run that wrote the checkpoint?) and ``preemption.py`` (leave before a preemption's SIGTERM).
The checkpoint format, its tiers and its catalog are ``replicaft.checkpoint``.
"""
