"""Heals: a group behind the quorum pulls the whole training state from the groups ahead of it.

``healer.py`` is the side that fetches, ``donor.py`` the side that serves, ``catchup.py`` the
bookkeeping that lets a healer take part in the steps its fetch outlasts and replay them; the
transfer itself (manifest, stripes, verification) is replicaft/transfer's.
"""

HEAL_WAIT_FRACTION = 1.0
"""At the end of a step during a heal, a donor waits for its healers to be sent the rest of its
live snapshot (transfer/live.py), and a healer for its fetch to arrive, at most this fraction
of the step's own time so far: the step's time minus what it spent blocked on the quorum and
on collectives, i.e. its own forward and backward. A transfer about to end then ends without
a copy on the donor, or a recorded step and its replay on the healer, while a transfer holds a
donor at most as long again as its own forward and backward. Not the step's whole time: a step
that waited long for its quorum (a peer restarting) or for a slow peer's all-reduce would wait
as long again.

A healer's wait holds its donors too (in the step's "ok" flag exchange), so it is bounded by
the donors' own time as well: each publishes its last step's own time with its quorum request
(``own_step_s``), and the healer waits at most the shortest of those and its own. A restarted
healer's first step runs cold (first touch of its gradient buckets beside the receive): in one
measured 1 GB restart its own time was 3.4 s against the donor's 0.5 s. Except for a fetch
about to arrive, which the healer waits for up to its own time (healer.py's ``fetch_wait_s``):
in the cold restart of a 100 MB model, whose donor's own step is 0.05 s, the fetch missed its
first step by a few tens of milliseconds in two runs of three, and the healer's first commit
came one step later."""
