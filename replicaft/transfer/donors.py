"""Which donors a healer believes and how it reads them: pure rules over their answers.

* ``agreed_donors``: the donors whose whole-state digest (manifest.state_digest) has a strict
  majority; no majority, no heal.
* ``check_against_own``: a manifest must be one the healer can load: its skeleton consistent
  with its tensor list, holding every state the healer requires, fitting the healer's own
  tensors (dtype, shape) and the state size it expects; checked before anything is allocated
  for it, and for a single donor's manifest as for one several donors agreed on.
* ``streams_by_donor``: how the healer's connections are dealt over donors and hosts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from replicaft.errors import HealError
from replicaft.state.skeleton import misplaced_tensor
from replicaft.transfer.manifest import Manifest, state_digest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Donor:
    replica_id: str
    address: str


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port)."""
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _deal(connections: int, among: Sequence[str]) -> dict[str, int]:
    """``connections`` dealt evenly among donors or hosts, at least one each."""
    base, extra = divmod(connections, len(among))
    return {key: max(1, base + (i < extra)) for i, key in enumerate(among)}


def streams_by_donor(connections: int, donors: Sequence[Donor], healer_index: int = 0) -> dict[str, int]:
    """Connections per donor read from: ``connections`` dealt over the donors' hosts, at least
    one each, each host's to one of its donors, chosen by ``healer_index`` so that several
    healers read different ones; the host's other donors are spares.

    Donors on one host share its link and memory bus, so reading several of them at once adds
    senders, not bandwidth. On the 2-core benchmark host (1 GiB over loopback, 2 connections,
    40-60 paired rounds each) reading two donors one connection each was 0-5 % slower than
    reading one over both, and three, one connection each, 5 % slower.
    """
    by_host: dict[str, list[str]] = {}
    for donor in donors:
        by_host.setdefault(host_port(donor.address)[0], []).append(donor.replica_id)
    return {
        by_host[host][healer_index % len(by_host[host])]: share
        for host, share in _deal(connections, list(by_host)).items()
    }


def agreed_donors(manifests: Mapping[str, Manifest], step: int) -> list[str]:
    """The donors whose manifests agree with a strict majority of all answers (whole-state
    digest, manifest.state_digest), in id order; HealError when no state has a majority: with
    two donors that disagree nobody can tell which one to believe, so neither is."""
    votes = Counter(state_digest(m) for m in manifests.values())
    (agreed, count), *others = votes.most_common()
    if others and others[0][1] == count:
        raise HealError(
            f"donors {sorted(manifests)} disagree on the state of step {step} and no version has a "
            "majority; not healing from any of them"
        )
    usable = sorted(rid for rid, m in manifests.items() if state_digest(m) == agreed)
    if len(usable) < len(manifests):
        logger.error(
            "heal: donors disagree on the state of step %d; %s are outvoted, using %s",
            step,
            sorted(set(manifests) - set(usable)),
            usable,
        )
    return usable


def check_against_own(
    manifest: Manifest,
    expected: Mapping[str, tuple[str, tuple[int, ...]]] | None,
    max_bytes: int | None,
    required: Collection[str] | None = None,
) -> None:
    """Refuse (HealError naming the first fault) a manifest the healer can tell is not a state it
    could load, whether one donor sent it or several agreed on it (issue 37):

    * its size exceeds ``max_bytes``;
    * its skeleton places a tensor elsewhere than the name its tensor list gives it (the
      tensors would be checked under one name and loaded into another, state.skeleton's
      ``misplaced_tensor``);
    * it lacks one of the ``required`` states (the healer's registered states that a load
      must find, StateRegistry.required): loading it would fail after the vote;
    * one of its tensors differs in dtype or shape from the healer's own of the same name.
    """
    who = f"the manifest of step {manifest.step} from {manifest.replica_id}"
    if max_bytes is not None and manifest.total_bytes > max_bytes:
        raise HealError(f"{who} claims {manifest.total_bytes} bytes of state; this rank expects at most {max_bytes}")
    misplaced = misplaced_tensor(manifest.skeleton, [t.name for t in manifest.tensors])
    if misplaced is not None:
        index, place = misplaced
        raise HealError(
            f"{who} names tensor {index} {manifest.tensors[index].name!r} but its skeleton puts it at "
            f"{place!r}; a donor's flatten names every tensor by its place, so this manifest is not one "
            "it made: not healing from it"
        )
    missing = sorted(set(required or ()) - set(manifest.skeleton))
    if missing:
        raise HealError(
            f"{who} lacks the states {missing} that this rank registered (its states: "
            f"{sorted(map(str, manifest.skeleton))[:20]}); do the donor and this rank run the same training script?"
        )
    for t in manifest.tensors if expected else ():
        own = expected.get(t.name)  # type: ignore[union-attr]
        if own is not None and own != (t.dtype, t.shape):
            raise HealError(
                f"{who} describes {t.name} as {t.dtype}{list(t.shape)}; this rank's is {own[0]}{list(own[1])}"
            )
