"""Several gateways as one Kafka cluster: who the brokers are, who leads what, who coordinates.

Pure (no Ray, no I/O, no clock beyond the ``now`` it is given). The gateway actor refreshes a
``PeerView`` from Ray's named actors (``gateway.py``); this module decides from it.

Any gateway serves any partition (a partition is an engine actor, the gateway only its door), so a
partition's "leader" is only where a client is told to send it, chosen per client: the gateways of
the client's zone first (``zone=...`` in its ``client.id``, as librdkafka has no Metadata field for
``client.rack``), the partitions spread round robin over them from a start that depends on the
client, so two clients of one topic lean on different gateways. Transactions answer from any
gateway too (``transactions.py`` keeps only a cache of the coordinator's state). A consumer
group's membership is the one thing a gateway holds itself (``groups.py``: joins wait for each
other in one process), so each group has one coordinating gateway, chosen by rendezvous hashing
over the live ones: when one dies only its groups move (their members rejoin at the new one, as
after a Kafka coordinator failover; offsets live in the engine), and when one joins it takes only
the groups that hash to it, after ``SETTLE_S`` in which every other gateway has seen it and stopped
answering for them (so no group has two coordinators at once while views differ).

A gateway that died stays listed as a broker for ``DEPARTED_LISTED_S``, leading no partition and
coordinating nothing, for librdkafka's sake (2.10 on, open as confluentinc/librdkafka#5511): it
drops a broker Metadata no longer lists, ending that broker's thread, but keeps it as a cached
group coordinator; only that thread's reconnect attempts would wake its waiting coordinator
request to ask FindCoordinator again, so ``send_offsets_to_transaction`` waits forever (past its
timeout: #5456). Listed, the dead gateway's thread keeps trying, each try refused at once, and
the request finds the new coordinator within a second of one. Kafka lists only live brokers; a
dead one is rarer there than a gateway that a Ray node takes down with it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15
REFRESH_S = 1.0  # how often a gateway lists its peers
SETTLE_S = 3 * REFRESH_S  # a gateway that joined coordinates nothing for this long
DEPARTED_LISTED_S = 30.0  # how long a dead gateway stays in Metadata (librdkafka#5511 above)
MAX_PEERS = 256
_ZONE = re.compile(r"(?:^|[;,\s])zone=([A-Za-z0-9_.:-]{1,64})")


@dataclass(frozen=True)
class Peer:
    """One gateway of a peer group, as clients are told of it."""

    node_id: int
    host: str
    port: int
    zone: str | None = None


def client_zone(client_id: str | None) -> str | None:
    """The zone a client names in its ``client.id`` (``app-1;zone=us-east-1a``), or None."""
    if not client_id:
        return None
    found = _ZONE.search(client_id)
    return found.group(1) if found else None


def _score(key: str, peer: Peer) -> bytes:
    return hashlib.blake2b(f"{peer.node_id}/{key}".encode(), digest_size=8).digest()


@dataclass
class PeerView:
    """What one gateway knows of its peer group: itself, the live peers (itself included) and
    when each was first seen, by node id; and the peers that died under ``DEPARTED_LISTED_S``
    ago, with when they were last seen."""

    me: Peer
    peers: dict[int, Peer] = field(default_factory=dict)
    first_seen: dict[int, float] = field(default_factory=dict)
    joined_at: float = 0.0
    departed: dict[int, tuple[Peer, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.peers.setdefault(self.me.node_id, self.me)
        self.first_seen.setdefault(self.me.node_id, self.joined_at)

    def refresh(self, live: list[Peer], now: float) -> None:
        """Take the peers Ray lists as alive (always keeping this gateway itself)."""
        assert len(live) <= MAX_PEERS, f"{len(live)} gateways in one peer group"
        before = self.peers
        self.peers = {p.node_id: p for p in live}
        self.peers[self.me.node_id] = self.me
        self.first_seen = {n: self.first_seen.get(n, now) for n in self.peers}
        self.departed.update({n: (p, now) for n, p in before.items() if n not in self.peers})
        self.departed = {n: (p, at) for n, (p, at) in self.departed.items()
                         if n not in self.peers and now - at < DEPARTED_LISTED_S}
        self.check_invariants()

    def check_invariants(self) -> None:
        assert self.peers[self.me.node_id] == self.me
        assert set(self.first_seen) == set(self.peers)
        assert all(p.node_id == n for n, p in self.peers.items())
        assert not set(self.departed) & set(self.peers)
        assert len(self.departed) <= MAX_PEERS

    def brokers(self) -> list[Peer]:
        """The live peers, by node id: what leads partitions and coordinates groups."""
        return sorted(self.peers.values(), key=lambda p: p.node_id)

    def listed(self) -> list[Peer]:
        """The brokers Metadata lists: the live peers and the recently departed ones."""
        return sorted([*self.peers.values(), *(p for p, _ in self.departed.values())], key=lambda p: p.node_id)

    def coordinator(self, key: str) -> Peer:
        """The gateway that coordinates group ``key``: the highest rendezvous score among the
        live peers."""
        return max(self.peers.values(), key=lambda p: _score(key, p))

    def coordinates(self, key: str, now: float) -> int:
        """NONE (0) when this gateway coordinates group ``key`` now; NOT_COORDINATOR when another
        does; COORDINATOR_NOT_AVAILABLE when it is this one but it joined under ``SETTLE_S`` ago
        (the one before may still be answering for the group)."""
        if self.coordinator(key) != self.me:
            return NOT_COORDINATOR
        if len(self.peers) > 1 and now - self.joined_at < SETTLE_S:
            return COORDINATOR_NOT_AVAILABLE
        return 0

    def leaders(self, client_id: str | None, topic: str, count: int) -> list[int]:
        """The node id each of a topic's ``count`` partitions is led by, for this client."""
        peers = self.brokers()
        zone = client_zone(client_id)
        local = [p for p in peers if zone is not None and p.zone == zone]
        chosen = local or peers
        start = int.from_bytes(hashlib.blake2b(f"{client_id}/{topic}".encode(), digest_size=4).digest(), "big")
        return [chosen[(start + p) % len(chosen)].node_id for p in range(count)]
