"""``replicaft-launch``: a whole replicaft job on one machine, a lighthouse plus N replica groups.

The launcher plays the part Slurm or Kubernetes plays on a cluster: it starts every replica
group, and when one dies it starts it again, under the same replica id, after a delay. The
restarted group heals from its peers by itself; the launcher knows nothing about training and
never touches state. A group that exits 0 has finished training and stays down.

Design, module by module:

* ``options``: the command line, every argument checked once (:func:`parse_args`), and the
  job's secret (:func:`job_secret`);
* ``supervisor``: the launcher's loop (:class:`Launcher`): lighthouse, groups, status line;
* ``groups``: the supervisor that keeps each group running and restarts it
  (:class:`~replicaft.launch.groups.GroupSupervisor`), in a warm standby when one is ready.
  The chaos harness (``chaos/runner.py``) runs its groups on the same one, so chaos
  exercises the restart path a launched job runs on, standbys and reserves included;
* ``lighthouse_keeper``: the job's own lighthouse, started, its address read, restarted;
* ``standby_pool``: warm standbys and their memory reserves;
* ``reaper``: stopping a child, everything below it and whatever it orphaned;
* ``children``: a started process with its output labelled.

And why it is built so:

* The decisions are pure functions beside the shell that acts on them: :func:`parse_args`
  (every argument check), ``restart_policy.decide_restart`` (restart, done or give up),
  ``job_status.render_status``, ``console.label_torchrun_line`` and
  ``process_tree.descendants``. The :class:`Launcher` only starts, polls and signals
  processes and prints.
* Every child starts in a session of its own. Ctrl-C in a terminal then reaches only the
  launcher, which stops everything in order (SIGTERM, a grace period, SIGKILL) instead of
  racing torchrun's own signal forwarding.
* torchrun starts each rank in yet another session, so no process group covers a W>1 group.
  The launcher instead signals, one by one, every process below it in ``/proc``; and it is a
  child subreaper (``PR_SET_CHILD_SUBREAPER``), so ranks orphaned by a killed torchrun are
  re-parented to it rather than to init, and are found and killed with their group.
  Rejected: recording descendants periodically (a rank started since the last scan escapes),
  psutil (a dependency for a 20-line ``/proc`` walk), and ``PR_SET_PDEATHSIG`` alone (it reaches
  the launcher's own children, torchrun, not the ranks torchrun starts). The cost: a launcher killed with
  SIGKILL cannot clean up after itself, and the launcher runs on Linux only.
* The status line reads the structured event logs (STYLE §9), never the children's log text,
  so the launcher always sets ``REPLICAFT_EVENTS_DIR`` (a temporary directory by default).
* A restart runs in a warm standby when one is ready (``replicaft.process.standby``: an interpreter
  that has already imported torch and replicaft, which takes ~2.5 s here): the launcher writes
  the group's variables to its stdin and it becomes the group. With W = 1 the launcher keeps
  ``--standbys`` of them (default 1). It starts them only while no group is in its start-up
  (every running group has committed since it started, or ``STANDBY_QUIET_S`` have passed),
  so that their imports never compete for the CPU with a group's start or heal. A standby that
  exits before it is used turns standbys off for the run, with a message, and restarts go cold.
  Once the groups have reported the size of their state, each standby is asked to fault in that
  much memory (``--no-standby-reserve`` not to), for the restarted group's buckets and heal
  (``replicaft.process.reserve``). With W > 1 torchrun starts the ranks, so restarts are always cold.
* Every server of the job is authenticated: when the launcher starts the lighthouse and
  ``REPLICAFT_TOKEN`` is unset, it makes a secret for this job and hands it to the lighthouse,
  every group and every standby (in their environment, never on a command line, which any
  local user can read in ``/proc``). A job against an outside lighthouse (``--lighthouse``)
  uses that lighthouse's token, which the caller sets.
"""

from replicaft.launch.options import NUMBER_FLAGS, PROG, LaunchOptions, job_secret, parse_args
from replicaft.launch.supervisor import Launcher, main

__all__ = ["NUMBER_FLAGS", "PROG", "LaunchOptions", "Launcher", "job_secret", "main", "parse_args"]
