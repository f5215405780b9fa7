"""The network lab of partition and slow_link runs (chaos/network.py): the plan is pure; the lab
itself is built for real (root and ``ip`` needed, else skipped) and a TCP connection between two
namespaces is shown to cross the bridge, to stop when the link is cut and to resume after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from chaos.network import LIGHTHOUSE, NetworkLab, NetworkUnavailable, plan_hosts, shaping_qdisc


def test_hosts_get_fixed_addresses_and_per_run_namespaces() -> None:
    hosts = plan_hosts("rftX", ("g0", "g1"))
    assert [(h.name, h.namespace, h.address, h.port) for h in hosts.values()] == [
        ("lh", "rftX-lh", "10.88.0.1", "vlh"),
        ("g0", "rftX-g0", "10.88.0.10", "vg0"),
        ("g1", "rftX-g1", "10.88.0.11", "vg1"),
    ]


def test_too_many_groups_for_the_subnet_are_refused() -> None:
    with pytest.raises(ValueError, match="201 groups"):
        plan_hosts("p", tuple(f"g{i}" for i in range(201)))


@pytest.mark.parametrize(
    ("rate", "delay", "qdisc"),
    [
        (2.0, None, ["tbf", "rate", "2mbit", "burst", "4096", "latency", "1s"]),
        (100.0, None, ["tbf", "rate", "100mbit", "burst", "125000", "latency", "1s"]),
        (None, 50.0, ["netem", "delay", "50ms"]),
        (2.0, 50.0, ["netem", "delay", "50ms", "rate", "2mbit"]),
    ],
    ids=["rate: tbf", "tbf bucket grows with the rate", "delay: netem", "both: netem"],
)
def test_shaping_picks_the_qdisc(rate: float | None, delay: float | None, qdisc: list[str]) -> None:
    assert shaping_qdisc(rate, delay) == qdisc


def test_shaping_needs_a_rate_or_a_delay() -> None:
    with pytest.raises(ValueError):
        shaping_qdisc(None, None)


LISTENER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 29999)); s.listen(8); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hi"); c.close()
"""
CLIENT = """
import socket, sys
try:
    print(socket.create_connection((sys.argv[1], 29999), timeout=1.0).recv(2).decode())
except OSError as e:
    print("failed", type(e).__name__)
"""


def _connect(lab: NetworkLab, host: str, address: str) -> str:
    done = subprocess.run(
        lab.wrap(host, [sys.executable, "-c", CLIENT, address]), capture_output=True, text=True, timeout=20, check=True
    )
    return done.stdout.strip()


@pytest.mark.timeout(60)
def test_lab_connects_namespaces_and_a_cut_link_drops_traffic() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("building network namespaces needs root and iproute2's `ip`")
    lab = NetworkLab(("g0",))
    try:
        lab.create()
    except NetworkUnavailable as e:
        pytest.skip(f"network namespaces are unavailable here: {e}")
    listener = None
    try:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert f"{lab.prefix}-br" in names and f"{lab.prefix}-g0" in names
        lh = lab.address(LIGHTHOUSE)
        listener = subprocess.Popen(
            lab.wrap(LIGHTHOUSE, [sys.executable, "-c", LISTENER, lh]), stdout=subprocess.PIPE, text=True
        )
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        assert _connect(lab, "g0", lh) == "hi"
        lab.cut("g0")
        assert _connect(lab, "g0", lh).startswith("failed")
        lab.restore("g0")
        assert _connect(lab, "g0", lh) == "hi"
        try:
            lab.shape("g0", 1.0, None)
        except NetworkUnavailable as e:
            pytest.fail(f"tbf shaping failed: {e}")
        assert _connect(lab, "g0", lh) == "hi"
        lab.unshape("g0")
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        assert lab.close() == []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert lab.prefix not in names
