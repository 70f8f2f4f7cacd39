"""The catalog: which topics (with how many partitions) and subscriptions exist, and who may
produce to and consume from each topic (with auth on).

Kept as one small record in the properties of the ``catalog`` stream's metadata, changed by
compare-and-set, so it survives restarts and two supervisors can never both write it (the one
that opened the stream last fences the other).

Creating or deleting a topic or subscription takes several steps (actors, objects), so an entry
carries its ``EntryState`` and every step starts with a durable catalog change: a create saves
CREATING, starts the actors, then saves ACTIVE; a delete saves DELETING, stops the actors, deletes
the objects, then removes the entry. A supervisor that crashes in between finds the state on
recovery and finishes the step (a CREATING entry is made ACTIVE, a DELETING one deleted), so a
crash leaves the whole topic or nothing. Only ACTIVE entries are visible to clients."""

from __future__ import annotations

import enum
from collections.abc import Sequence

import msgspec

from raytxn.errors import CorruptLedger, InvalidArgument, NotAllowed, TopicAlreadyExists, TopicNotFound
from raytxn.ids import check_actions, check_name, check_principal
from raytxn.protocol.retention import NO_RETENTION_POLICY, RetentionPolicy

MAX_PARTITIONS = 1024
CATALOG_STREAM = "catalog"
CATALOG_KEY = "catalog"


class EntryState(enum.StrEnum):
    """Where a topic or subscription is in its life (see the module docstring)."""

    CREATING = "CREATING"
    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


# As the coordinator's table: which state may follow which. CREATING has none (only a new entry
# starts there); an entry leaves the catalog only from DELETING.
VALID_PREVIOUS_STATES: dict[EntryState, frozenset[EntryState]] = {
    EntryState.CREATING: frozenset(),
    EntryState.ACTIVE: frozenset({EntryState.CREATING}),
    EntryState.DELETING: frozenset({EntryState.CREATING, EntryState.ACTIVE}),
}


def _check_transition(what: str, old: EntryState, new: EntryState) -> None:
    if old not in VALID_PREVIOUS_STATES[new]:
        raise NotAllowed(f"{what}: {old} -> {new} not allowed")


def _doing(state: EntryState) -> str:
    return "created" if state is EntryState.CREATING else "deleted"


class TopicInfo(msgspec.Struct, frozen=True):
    name: str
    partitions: int
    created_ms: int
    state: EntryState = EntryState.ACTIVE  # the default reads catalogs written before states
    # The retention policy (see protocol/retention.py); absent in catalogs written before it.
    retention_bytes: int | None = None
    retention_s: float | None = None
    # Compaction (protocol/retention.py); absent in catalogs written before it: not compacted.
    compacted: bool = False
    compaction_threshold_bytes: int | None = None

    @property
    def retention(self) -> RetentionPolicy:
        return RetentionPolicy(self.retention_bytes, self.retention_s, self.compacted,
                               self.compaction_threshold_bytes)


class SubscriptionInfo(msgspec.Struct, frozen=True):
    topic: str
    name: str
    initial_position: str  # "earliest" | "latest"
    created_ms: int
    state: EntryState = EntryState.ACTIVE


class Catalog(msgspec.Struct):
    topics: dict[str, TopicInfo] = msgspec.field(default_factory=dict)
    subscriptions: dict[str, dict[str, SubscriptionInfo]] = msgspec.field(default_factory=dict)
    # topic -> principal -> actions ("produce", "consume"); changes bump permissions_version, so
    # actors caching a topic's permissions keep the newest of what they are sent and fetch.
    permissions: dict[str, dict[str, list[str]]] = msgspec.field(default_factory=dict)
    permissions_version: int = 0

    def topic(self, name: str) -> TopicInfo:
        """The ACTIVE topic ``name`` (one being created or deleted does not exist for clients)."""
        info = self.topic_entry(name)
        if info.state is not EntryState.ACTIVE:
            raise TopicNotFound(f"topic {name!r} does not exist (it is being {_doing(info.state)})")
        return info

    def topic_entry(self, name: str) -> TopicInfo:
        """The entry of topic ``name`` in any state."""
        check_name(name, "topic")
        info = self.topics.get(name)
        if info is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        return info

    def with_topic(self, name: str, partitions: int, now_ms: int,
                   retention: RetentionPolicy = NO_RETENTION_POLICY) -> Catalog:
        """A new topic, CREATING. ``retention``: checked already (``check_retention``)."""
        check_name(name, "topic")
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgument(f"partitions must be 1..{MAX_PARTITIONS}, got {partitions!r}")
        if name in self.topics:
            existing = self.topics[name]
            if existing.state is EntryState.DELETING:  # as Kafka's "marked for deletion"
                raise TopicAlreadyExists(f"topic {name!r} is being deleted; create it again once it is gone")
            raise TopicAlreadyExists(f"topic {name!r} exists with {existing.partitions} partitions")
        info = TopicInfo(name, partitions, now_ms, EntryState.CREATING, retention.retention_bytes,
                         retention.retention_s, retention.compacted, retention.compaction_threshold_bytes)
        return msgspec.structs.replace(self, topics={**self.topics, name: info})

    def with_topics(self, names: Sequence[str], partitions: int, now_ms: int,
                    retention: RetentionPolicy = NO_RETENTION_POLICY, subscriptions: Sequence[str] = (),
                    initial_position: str = "earliest") -> Catalog:
        """Many new topics at once, each with ``subscriptions``, all CREATING: every rule of
        ``with_topic`` and ``with_subscription`` holds for each, and one broken makes none (the
        error names it). One copy of the catalog for the lot, not one per topic."""
        if len(set(names)) != len(names):
            raise InvalidArgument("a topic is named twice in one bulk create")
        for sub in subscriptions:
            check_name(sub, "subscription")
        if initial_position not in ("earliest", "latest"):
            raise InvalidArgument(f"initial_position must be 'earliest' or 'latest', got {initial_position!r}")
        topics, subs = dict(self.topics), dict(self.subscriptions)
        empty = Catalog()
        for name in names:
            if name in topics:
                self.with_topic(name, partitions, now_ms, retention)  # raises the error a single create would
            topics[name] = empty.with_topic(name, partitions, now_ms, retention).topics[name]
            subs[name] = {sub: SubscriptionInfo(name, sub, initial_position, now_ms, EntryState.CREATING)
                          for sub in subscriptions}
        return msgspec.structs.replace(self, topics=topics, subscriptions=subs)

    def with_topics_active(self, names: Sequence[str]) -> Catalog:
        """``names`` (and their subscriptions) from CREATING to ACTIVE; ACTIVE ones stay."""
        topics, subs = dict(self.topics), dict(self.subscriptions)
        for name in names:
            info = self.topic_entry(name)
            if info.state is EntryState.CREATING:
                topics[name] = msgspec.structs.replace(info, state=EntryState.ACTIVE)
            elif info.state is not EntryState.ACTIVE:
                _check_transition(f"topic {name!r}", info.state, EntryState.ACTIVE)
            subs[name] = {k: msgspec.structs.replace(v, state=EntryState.ACTIVE)
                          if v.state is EntryState.CREATING else v for k, v in subs.get(name, {}).items()}
        return msgspec.structs.replace(self, topics=topics, subscriptions=subs)

    def with_topics_deleting(self, names: Sequence[str]) -> Catalog:
        """``names`` DELETING (those already DELETING stay); an unknown name raises ``TopicNotFound``."""
        topics = dict(self.topics)
        for name in names:
            info = self.topic_entry(name)
            if info.state is not EntryState.DELETING:
                _check_transition(f"topic {name!r}", info.state, EntryState.DELETING)
                topics[name] = msgspec.structs.replace(info, state=EntryState.DELETING)
        return msgspec.structs.replace(self, topics=topics)

    def without_topics(self, names: Sequence[str]) -> Catalog:
        """``names`` gone (each must be DELETING or gone already), as ``without_topic``."""
        gone = {name for name in names if name in self.topics}
        for name in gone:
            if (state := self.topics[name].state) is not EntryState.DELETING:
                raise NotAllowed(f"topic {name!r} is {state}: only a DELETING topic leaves the catalog")
        return msgspec.structs.replace(
            self, topics={k: v for k, v in self.topics.items() if k not in gone},
            subscriptions={k: v for k, v in self.subscriptions.items() if k not in gone},
            permissions={k: v for k, v in self.permissions.items() if k not in gone},
            permissions_version=self.permissions_version + 1)

    def with_topic_state(self, name: str, state: EntryState) -> Catalog:
        info = self.topic_entry(name)
        _check_transition(f"topic {name!r}", info.state, state)
        topics = {**self.topics, name: msgspec.structs.replace(info, state=state)}
        return msgspec.structs.replace(self, topics=topics)

    def without_topic(self, name: str) -> Catalog:
        """The topic gone with its subscriptions and permissions (it must be DELETING)."""
        info = self.topic_entry(name)
        if info.state is not EntryState.DELETING:
            raise NotAllowed(f"topic {name!r} is {info.state}: only a DELETING topic leaves the catalog")
        topics = {k: v for k, v in self.topics.items() if k != name}
        subscriptions = {k: v for k, v in self.subscriptions.items() if k != name}
        permissions = {k: v for k, v in self.permissions.items() if k != name}
        return msgspec.structs.replace(self, topics=topics, subscriptions=subscriptions, permissions=permissions,
                                       permissions_version=self.permissions_version + 1)

    def topics_in(self, state: EntryState) -> list[TopicInfo]:
        return [info for info in self.topics.values() if info.state is state]

    def subscriptions_in(self, state: EntryState) -> list[SubscriptionInfo]:
        return [sub for subs in self.subscriptions.values() for sub in subs.values() if sub.state is state]

    def subscription_names(self, topic: str, states: tuple[EntryState, ...] = (EntryState.ACTIVE,)) -> list[str]:
        """The names of ``topic``'s subscriptions in ``states``, sorted."""
        return sorted(name for name, sub in self.subscriptions.get(topic, {}).items() if sub.state in states)

    def with_subscription(self, topic: str, name: str, initial_position: str, now_ms: int) -> Catalog:
        """A new subscription, CREATING; unchanged when it exists already (subscribing again)."""
        self.topic(topic)
        check_name(name, "subscription")
        if initial_position not in ("earliest", "latest"):
            raise InvalidArgument(f"initial_position must be 'earliest' or 'latest', got {initial_position!r}")
        subs = dict(self.subscriptions.get(topic, {}))
        existing = subs.get(name)
        if existing is not None:
            if existing.state is EntryState.DELETING:
                raise NotAllowed(f"subscription {name!r} of {topic!r} is being deleted; subscribe once it is gone")
            return self
        subs[name] = SubscriptionInfo(topic, name, initial_position, now_ms, EntryState.CREATING)
        return msgspec.structs.replace(self, subscriptions={**self.subscriptions, topic: subs})

    def with_subscription_state(self, topic: str, name: str, state: EntryState) -> Catalog:
        sub = self.subscriptions.get(topic, {}).get(name)
        if sub is None:
            raise NotAllowed(f"subscription {name!r} of {topic!r} does not exist")
        _check_transition(f"subscription {name!r} of {topic!r}", sub.state, state)
        subs = {**self.subscriptions[topic], name: msgspec.structs.replace(sub, state=state)}
        return msgspec.structs.replace(self, subscriptions={**self.subscriptions, topic: subs})

    def without_subscription(self, topic: str, name: str) -> Catalog:
        """The subscription gone (it must be DELETING); unchanged when it is gone already (its
        topic's deletion may have taken it)."""
        sub = self.subscriptions.get(topic, {}).get(name)
        if sub is None:
            return self
        if sub.state is not EntryState.DELETING:
            raise NotAllowed(f"subscription {name!r} of {topic!r} is {sub.state}: only a DELETING one is removed")
        subs = {k: v for k, v in self.subscriptions[topic].items() if k != name}
        return msgspec.structs.replace(self, subscriptions={**self.subscriptions, topic: subs})

    def topic_permissions(self, topic: str) -> dict[str, list[str]]:
        self.topic(topic)
        return dict(self.permissions.get(topic, {}))

    def with_grant(self, topic: str, principal: str, actions: list[str]) -> Catalog:
        """``principal`` may do exactly ``actions`` on ``topic`` (a grant replaces the earlier one,
        as Pulsar's grant-permission does)."""
        self.topic(topic)
        check_principal(principal)
        granted = {**self.permissions.get(topic, {}), principal: list(check_actions(actions))}
        return msgspec.structs.replace(self, permissions={**self.permissions, topic: granted},
                                       permissions_version=self.permissions_version + 1)

    def without_grant(self, topic: str, principal: str) -> Catalog:
        self.topic(topic)
        check_principal(principal)
        granted = {k: v for k, v in self.permissions.get(topic, {}).items() if k != principal}
        return msgspec.structs.replace(self, permissions={**self.permissions, topic: granted},
                                       permissions_version=self.permissions_version + 1)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Catalog)


def encode_catalog(catalog: Catalog) -> bytes:
    return _encoder.encode(catalog)


def decode_catalog(data: bytes | None) -> Catalog:
    """The catalog stored as the supervisor stream's property; ``CorruptLedger`` naming it when the
    bytes (which passed their frame's checksum, so a bug wrote them or a newer release did) are not
    a catalog this release reads, instead of msgspec's error from deep in a start."""
    if data is None:
        return Catalog()
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CorruptLedger(f"the catalog ({len(data)} bytes) is not one this release reads: {e}", "catalog") from e
