"""The catalog: which topics (with how many partitions) and subscriptions exist, and who may
produce to and consume from each topic (with auth on).

Kept as one small record in the properties of the ``catalog`` stream's metadata, changed by
compare-and-set, so it survives restarts and two supervisors can never both write it (the one
that opened the stream last fences the other)."""

from __future__ import annotations

import msgspec

from raytxn.errors import InvalidArgument, TopicAlreadyExists, TopicNotFound
from raytxn.ids import check_actions, check_name, check_principal

MAX_PARTITIONS = 1024
CATALOG_STREAM = "catalog"
CATALOG_KEY = "catalog"


class TopicInfo(msgspec.Struct, frozen=True):
    name: str
    partitions: int
    created_ms: int


class SubscriptionInfo(msgspec.Struct, frozen=True):
    topic: str
    name: str
    initial_position: str  # "earliest" | "latest"
    created_ms: int


class Catalog(msgspec.Struct):
    topics: dict[str, TopicInfo] = msgspec.field(default_factory=dict)
    subscriptions: dict[str, dict[str, SubscriptionInfo]] = msgspec.field(default_factory=dict)
    # topic -> principal -> actions ("produce", "consume"); changes bump permissions_version, so
    # actors caching a topic's permissions keep the newest of what they are sent and fetch.
    permissions: dict[str, dict[str, list[str]]] = msgspec.field(default_factory=dict)
    permissions_version: int = 0

    def topic(self, name: str) -> TopicInfo:
        check_name(name, "topic")
        info = self.topics.get(name)
        if info is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        return info

    def with_topic(self, name: str, partitions: int, now_ms: int) -> Catalog:
        check_name(name, "topic")
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgument(f"partitions must be 1..{MAX_PARTITIONS}, got {partitions!r}")
        if name in self.topics:
            raise TopicAlreadyExists(f"topic {name!r} exists with {self.topics[name].partitions} partitions")
        return msgspec.structs.replace(self, topics={**self.topics, name: TopicInfo(name, partitions, now_ms)})

    def without_topic(self, name: str) -> Catalog:
        self.topic(name)
        topics = {k: v for k, v in self.topics.items() if k != name}
        subscriptions = {k: v for k, v in self.subscriptions.items() if k != name}
        permissions = {k: v for k, v in self.permissions.items() if k != name}
        return msgspec.structs.replace(self, topics=topics, subscriptions=subscriptions, permissions=permissions,
                                       permissions_version=self.permissions_version + 1)

    def with_subscription(self, topic: str, name: str, initial_position: str, now_ms: int) -> Catalog:
        self.topic(topic)
        check_name(name, "subscription")
        if initial_position not in ("earliest", "latest"):
            raise InvalidArgument(f"initial_position must be 'earliest' or 'latest', got {initial_position!r}")
        subs = dict(self.subscriptions.get(topic, {}))
        if name in subs:
            return self
        subs[name] = SubscriptionInfo(topic, name, initial_position, now_ms)
        return msgspec.structs.replace(self, subscriptions={**self.subscriptions, topic: subs})

    def without_subscription(self, topic: str, name: str) -> Catalog:
        subs = {k: v for k, v in self.subscriptions.get(topic, {}).items() if k != name}
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
    return Catalog() if data is None else _decoder.decode(data)
