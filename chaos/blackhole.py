"""A TCP relay that can be cut without closing anything: a partition on loopback.

``python -m chaos.blackhole LISTEN_PORT TARGET_HOST:TARGET_PORT [...more pairs]`` relays
every connection made to ``127.0.0.1:LISTEN_PORT`` to its target and prints ``ready`` once
listening. SIGUSR1 cuts it: bytes in both directions are dropped from then on and new
connections are accepted but go nowhere, while every socket stays open, as when a network
partition separates two hosts (no reset, no FIN; each side only sees silence). SIGUSR2
heals it: later bytes flow again (what was dropped stays lost, as a real partition's would
be retransmitted by TCP; connections whose peers timed out meanwhile are theirs to redo).

Used to cut one replicated lighthouse off from etcd while it keeps running and keeps its
members' sessions (chaos's ``partition_lighthouse_leader``, tests/lighthouse/test_replicated_lighthouse.py):
the lighthouse is given its etcd endpoints through one relay per etcd member.
"""

from __future__ import annotations

import asyncio
import signal
import sys


class Blackhole:
    def __init__(self) -> None:
        self.cut = False

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if not self.cut:
                    writer.write(data)
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _relay(self, target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            await reader.read()  # held open, going nowhere, until the peer gives up
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def serve(self, pairs: list[tuple[int, tuple[str, int]]]) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(self, "cut", True))
        loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(self, "cut", False))
        servers = [
            await asyncio.start_server(lambda r, w, t=target: self._relay(t, r, w), "127.0.0.1", port)
            for port, target in pairs
        ]
        print("ready", flush=True)
        await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print("usage: python -m chaos.blackhole LISTEN_PORT HOST:PORT [LISTEN_PORT HOST:PORT ...]", file=sys.stderr)
        return 2
    pairs = []
    for port, target in zip(argv[::2], argv[1::2], strict=True):
        host, _, target_port = target.rpartition(":")
        pairs.append((int(port), (host, int(target_port))))
    asyncio.run(Blackhole().serve(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
