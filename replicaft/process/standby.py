"""A warm standby: a Python process that has already imported torch and replicaft, waiting to
become a restarted replica group.

Why: on this machine a restarted group spends its first ~2.5 s importing, before it can even
ask for a quorum: ``import torch`` takes 1.1-1.6 s and ``torch._dynamo``, which torch's
optimizers import on their first ``add_param_group``, another ~1.1 s. A plain start of a small
training script is slower than the whole rest of its restart (join, heal, first commit). So
``replicaft-launch`` keeps a standby warm and, when a group dies, hands it that group's
identity instead of starting a cold interpreter.

The standby runs ``python -m replicaft.process.standby SCRIPT ARGS...`` with the environment a group
would get, minus the group's own variables. It imports, prints ``READY_LINE`` and its pid, then
reads JSON lines from its stdin, one object each:

* ``{"reserve_bytes": N}``: map and fault in N bytes of memory now, while idle (reserve.py),
  then print ``RESERVED_LINE``; unless that would leave less than ``RESERVE_HEADROOM_*`` of
  the machine's memory available, which it reports on stderr instead. The launcher sends this
  once its groups have reported the size of their state, so that the restarted group's
  gradient buckets and heal land on memory that already exists. It may come again with a
  larger size (the state grew); the new reserve replaces the old one.
* ``{"env": {NAME: VALUE, ...}}``: the activation, the variables that make it a particular
  group (``REPLICAFT_REPLICA_ID`` and the like). It sets them, points stdin at ``/dev/null``
  and runs SCRIPT exactly as ``python SCRIPT ARGS...`` would (``__name__ == "__main__"``,
  ``sys.argv``, the script's directory first on ``sys.path``).

Its wait for the activation has no deadline of its own: it lasts as long as the launcher, whose
end closes the pipe (EOF), and the standby then exits 0. It never initialises CUDA or binds a
port, and allocates training memory only as a reserve it was asked for: a standby that is never
used costs its imported modules' memory (~300 MB resident here) plus that reserve. While idle
its ``oom_score_adj`` is 1000, so under memory pressure the kernel kills it before any training
process; the activation sets it back to the launcher's value. Variables read at interpreter or
torch start-up (``PYTHONPATH``, ``OMP_NUM_THREADS``, ...) come from the launcher's environment,
as they would for a cold start; replicaft's own are read when the ``Manager`` is built, after
the activation.

The pipe comes from the standby's parent, never from the network; it carries JSON, nothing is
unpickled, and a malformed line ends the standby with a message saying what was wrong.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_LINE_BYTES = 1 << 20
"""An environment is kilobytes; a longer line is not a message from the launcher."""
READY_LINE = "replicaft standby ready, pid"
"""Printed with the pid once the imports are done; the launcher reports the standby warm then."""
RESERVED_LINE = "replicaft standby reserved"
"""Printed as ``RESERVED_LINE N bytes, pid P`` once a reserve is faulted in."""
RESERVE_HEADROOM_BYTES = 1 << 30
RESERVE_HEADROOM_FRACTION = 0.1
"""A reserve is faulted in only if this much memory stays available beside it (the larger of
the two, of ``MemTotal``): an idle standby must never be why a training process runs out."""
IDLE_OOM_SCORE_ADJ = 1000
"""While idle a standby is the first process the kernel's OOM killer takes (the most it allows)."""
RESERVE_MARGIN = 1 / 32
RESERVE_SLACK_BYTES = 1 << 20
"""A reserve is the state's size plus this much and ``RESERVE_MARGIN`` of it: room for the
padding between tensors in the heal's buffer (transfer/manifest.py) and a state that grows."""


@dataclass(frozen=True)
class Reserve:
    """Fault in this much memory for the group this standby may become (reserve.py)."""

    num_bytes: int


@dataclass(frozen=True)
class Activation:
    """Become the group these variables describe."""

    env: dict[str, str]


def warm_up() -> None:
    """Import what every replicaft training script imports, and run the first-use imports of
    torch's optimizers, without touching a device, a port or the training memory."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    import replicaft.manager  # noqa: F401
    import replicaft.wrappers.ddp  # noqa: F401
    import replicaft.wrappers.optim  # noqa: F401

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


def encode_activation(env: Mapping[str, str]) -> str:
    """The line the launcher writes to a standby's stdin to make it the group ``env`` describes."""
    return json.dumps({"env": dict(env)}) + "\n"


def reserve_bytes_for(cpu_state_bytes: int) -> int:
    """The reserve for a group whose state holds ``cpu_state_bytes`` in host memory; 0: none.

    A restarted group takes its gradient buckets (the size of the parameters) and its heal's
    buffer (the rest of the state: the optimizer's moments, which a new process lacks) from
    it, which together come to the size of the state (reserve.py).
    """
    if cpu_state_bytes <= 0:
        return 0
    return cpu_state_bytes + int(cpu_state_bytes * RESERVE_MARGIN) + RESERVE_SLACK_BYTES


def reserve_refusal(num_bytes: int, meminfo: str) -> str | None:
    """Why a reserve of ``num_bytes`` should not be faulted in, given ``/proc/meminfo``'s text;
    None when it fits (or the text says nothing: the kernel then decides, as for any mapping)."""
    fields = {}
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            fields[name] = int(value[0]) * 1024
    if "MemAvailable" not in fields or "MemTotal" not in fields:
        return None
    headroom = max(RESERVE_HEADROOM_BYTES, int(fields["MemTotal"] * RESERVE_HEADROOM_FRACTION))
    if num_bytes > fields["MemAvailable"] - headroom:
        return (
            f"only {fields['MemAvailable']} bytes of memory are available, and {headroom} of them are kept "
            "free for the training processes"
        )
    return None


def encode_reserve(num_bytes: int) -> str:
    """The line the launcher writes to a standby's stdin to have it fault in ``num_bytes``."""
    return json.dumps({"reserve_bytes": num_bytes}) + "\n"


def decode_message(line: str) -> Reserve | Activation:
    """The launcher's message on this line; ValueError says what is malformed."""
    try:
        message = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"the standby's message is not JSON ({e}): {line[:200]!r}") from None
    if isinstance(message, dict) and set(message) == {"reserve_bytes"}:
        size = message["reserve_bytes"]
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"the reserve's 'reserve_bytes' must be a positive integer, got {size!r:.200}")
        return Reserve(size)
    if not isinstance(message, dict) or set(message) != {"env"}:
        raise ValueError(
            f"the standby's message must be an object with exactly the key 'env' (an activation) or "
            f"'reserve_bytes' (a reserve), got {line[:200]!r}"
        )
    env = message["env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"the activation's 'env' must map names to strings, got {env!r:.200}")
    bad = [k for k in env if not k or "=" in k or "\0" in k or "\0" in env[k]]
    if bad:
        raise ValueError(f"the activation names invalid environment variables: {bad}")
    return Activation(env)


def read_line(fd: int) -> str:
    """One line from ``fd``, read a byte at a time so that nothing after it is consumed (``sys.stdin``
    would buffer ahead, and the script must find its stdin untouched); "" at EOF."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"a line from the launcher is longer than {MAX_LINE_BYTES} bytes")
    return line.decode("utf-8", errors="replace")


def wait_for_activation(fd: int) -> Activation | None:
    """Read the launcher's messages, faulting in each reserve asked for, up to the activation;
    None at EOF (the launcher is gone)."""
    # Imported here: reserve.py imports torch, which the launcher (importing this module) must not.
    from replicaft.process import reserve

    while True:
        line = read_line(fd)
        if not line:
            return None
        message = decode_message(line)
        if isinstance(message, Activation):
            return message
        try:
            why = reserve_refusal(message.num_bytes, _read_text("/proc/meminfo"))
            if why is None:
                reserve.install(message.num_bytes)
        except (OSError, ValueError) as e:
            why = str(e)
        if why is not None:  # the restart still works, on fresh memory
            print(
                f"replicaft.process.standby: no reserve of {message.num_bytes} bytes: {why}",
                file=sys.stderr,
                flush=True,
            )
            continue
        print(f"{RESERVED_LINE} {message.num_bytes} bytes, pid {os.getpid()}", flush=True)


def run_script(script: str, args: Sequence[str]) -> None:
    """Run ``script`` as ``python script args...`` would in this process."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _set_oom_score_adj(value: str) -> bool:
    """Best effort: False (nothing changed) without the file or the right to set ``value``."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(value)
    except OSError:
        return False
    return True


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -m replicaft.process.standby SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    group_oom_score_adj = _read_text("/proc/self/oom_score_adj").strip()
    _set_oom_score_adj(str(IDLE_OOM_SCORE_ADJ))
    warm_up()
    print(READY_LINE, os.getpid(), flush=True)
    try:
        activation = wait_for_activation(0)
    except ValueError as e:
        print(f"replicaft.process.standby: {e}", file=sys.stderr)
        return 2
    if activation is None:
        return 0
    if group_oom_score_adj and not _set_oom_score_adj(group_oom_score_adj):
        print(
            f"replicaft.process.standby: could not set oom_score_adj back to {group_oom_score_adj}; this group is the "
            "OOM killer's first choice",
            file=sys.stderr,
            flush=True,
        )
    os.environ.update(activation.env)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    run_script(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
