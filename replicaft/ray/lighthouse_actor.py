"""The job's lighthouse as a Ray actor that Ray restarts at the same address.

The actor process is the lighthouse: replicaft's server (lighthouse/server/grpc_server.py, or the
replicated one with ``--etcd``) on an event loop of its own, built from the CLI's flags. It is
pinned to the node of the Ray Train controller that creates it and given a port chosen there, so
when it dies (its process killed, its worker crashed) Ray's ``max_restarts`` brings it back on the
same node at the same port: the groups keep the address they were given, and a restarted
lighthouse rebuilds its membership from the managers that reconnect (README: the control plane
can vanish), as under ``replicaft-launch``'s lighthouse keeper.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from lighthouse.__main__ import parse_options
from lighthouse.replicated.server import ReplicatedLighthouse
from lighthouse.server.binding import raise_open_file_limit
from lighthouse.server.grpc_server import LighthouseServer
from replicaft.process.threads import LoopThread

START_TIMEOUT_S = 30.0


class LighthouseActor:
    """Serves the lighthouse at ``host:port``; ``address()`` is what groups dial."""

    def __init__(self, host: str, port: int, lighthouse_args: list[str]) -> None:
        options, replication = parse_options([*lighthouse_args, "--host", host, "--port", str(port)])
        raise_open_file_limit()
        self._loop = LoopThread("replicaft-ray-lighthouse")
        self._loop.start()
        self._server = LighthouseServer(options) if replication is None else ReplicatedLighthouse(options, replication)
        self._addresses = self._loop.call(self._server.start(), START_TIMEOUT_S)

    def address(self) -> str:
        return self._addresses.grpc

    def status_url(self) -> str | None:
        return self._addresses.status


def start_lighthouse(host: str, port: int, lighthouse_args: list[str], node_id: str) -> ray.actor.ActorHandle:
    """The lighthouse actor on ``node_id`` (no CPU reserved: it is light, and must not wait for a
    slot the groups hold), restarted by Ray whenever it dies."""
    actor = ray.remote(num_cpus=0, max_restarts=-1)(LighthouseActor)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return actor.options(scheduling_strategy=strategy).remote(host, port, lighthouse_args)
