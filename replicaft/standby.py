"""A warm standby: a Python process that has already imported torch and replicaft, waiting to
become a restarted replica group.

Why: on this machine a restarted group spends its first ~2.5 s importing, before it can even
ask for a quorum: ``import torch`` takes 1.1-1.6 s and ``torch._dynamo``, which torch's
optimizers import on their first ``add_param_group``, another ~1.1 s. A plain start of a small
training script is slower than the whole rest of its restart (join, heal, first commit). So
``replicaft-launch`` keeps a standby warm and, when a group dies, hands it that group's
identity instead of starting a cold interpreter.

The standby runs ``python -m replicaft.standby SCRIPT ARGS...`` with the environment a group
would get, minus the group's own variables. It imports, prints ``READY_LINE`` and its pid, then reads one
line from its stdin: the activation, a JSON object ``{"env": {NAME: VALUE, ...}}`` with the
variables that make it a particular group (``REPLICAFT_REPLICA_ID`` and the like). It sets them,
points stdin at ``/dev/null`` and runs SCRIPT exactly as ``python SCRIPT ARGS...`` would
(``__name__ == "__main__"``, ``sys.argv``, the script's directory first on ``sys.path``).

Its wait for the activation has no deadline of its own: it lasts as long as the launcher, whose
end closes the pipe (EOF), and the standby then exits 0. It never initialises CUDA, binds a
port or allocates training memory: a standby that is never used costs its imported modules'
memory (~300 MB resident here) and nothing else. Variables read at interpreter or torch start-up (``PYTHONPATH``,
``OMP_NUM_THREADS``, ...) come from the launcher's environment, as they would for a cold
start; replicaft's own are read when the ``Manager`` is built, after the activation.

The pipe comes from the standby's parent, never from the network; it carries JSON, nothing is
unpickled, and a malformed activation ends the standby with a message saying what was wrong.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping, Sequence

MAX_ACTIVATION_BYTES = 1 << 20
"""An environment is kilobytes; a longer line is not an activation."""
READY_LINE = "replicaft standby ready, pid"
"""Printed with the pid once the imports are done; the launcher reports the standby warm then."""


def warm_up() -> None:
    """Import what every replicaft training script imports, and run the first-use imports of
    torch's optimizers, without touching a device, a port or the training memory."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    import replicaft.ddp  # noqa: F401
    import replicaft.manager  # noqa: F401
    import replicaft.optim  # noqa: F401

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


def encode_activation(env: Mapping[str, str]) -> str:
    """The line the launcher writes to a standby's stdin to make it the group ``env`` describes."""
    return json.dumps({"env": dict(env)}) + "\n"


def decode_activation(line: str) -> dict[str, str]:
    """The environment variables in an activation line; ValueError says what is malformed."""
    try:
        message = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"the activation is not JSON ({e}): {line[:200]!r}") from None
    if not isinstance(message, dict) or set(message) != {"env"}:
        raise ValueError(f"the activation must be an object with exactly the key 'env', got {line[:200]!r}")
    env = message["env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"the activation's 'env' must map names to strings, got {env!r:.200}")
    bad = [k for k in env if not k or "=" in k or "\0" in k or "\0" in env[k]]
    if bad:
        raise ValueError(f"the activation names invalid environment variables: {bad}")
    return env


def read_activation_line(fd: int) -> str:
    """One line from ``fd``, read a byte at a time so that nothing after it is consumed (``sys.stdin``
    would buffer ahead, and the script must find its stdin untouched); "" at EOF."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
        if len(line) > MAX_ACTIVATION_BYTES:
            raise ValueError(f"the activation is longer than {MAX_ACTIVATION_BYTES} bytes")
    return line.decode("utf-8", errors="replace")


def run_script(script: str, args: Sequence[str]) -> None:
    """Run ``script`` as ``python script args...`` would in this process."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -m replicaft.standby SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    warm_up()
    print(READY_LINE, os.getpid(), flush=True)
    try:
        line = read_activation_line(0)
        if not line:
            return 0
        env = decode_activation(line)
    except ValueError as e:
        print(f"replicaft.standby: {e}", file=sys.stderr)
        return 2
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    run_script(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
