"""Which consumer gets which message: the dispatcher of one subscription on one partition, pure.

Messages the subscription should deliver wait in a queue ordered by ``(position, batch index)``,
so redelivered messages go out before newer ones. Consumers pull: a fetch announces a *demand*
(how many messages the consumer's receiver queue can take now), and ``dispatch`` hands queued
messages to consumers with demand, by the subscription type:

* Exclusive: one consumer; a second one is refused with ``NotAllowed``.
* Failover: any number attach; the active one is ``sorted(consumers)[partition % n]`` (Pulsar's
  rule, which spreads a topic's partitions over the consumers); the others get nothing until the
  set changes. When the active consumer changes, the old one's outstanding messages are given back.
* Shared: round-robin over the consumers with demand, one message at a time.
* Key_Shared: a consistent-hash ring over the consumers picks each key's consumer, so a key stays
  with one consumer while the set of consumers is stable (and only some keys move when it
  changes). A message whose consumer has no demand waits, and so do the later messages of its key
  (they route to the same consumer), while other keys' messages pass it.
  When a consumer joins, some keys move to it while their earlier messages are still outstanding
  with their old consumer. Such a key *drains*: its messages wait until no message of the key is
  outstanding with any other consumer (acked, taken by a transaction, or given back), so nobody
  gets a key's later message while an earlier one is unacked elsewhere. This is Pulsar's rule for
  recently joined consumers (hold back the newcomer's keys until what was dispatched before it
  joined is acked), kept per key as Pulsar 4 does with its draining hashes (PIP-379, which
  replaced the position-based ``readPositionWhenJoining``): keys that did not move, or whose
  earlier messages are acked, do not wait for unrelated slow messages. A message given back goes
  to the key's current consumer like any other.

A handed-out message is *outstanding* with its consumer until it is acked (``settle``) or given
back (``release``: negative ack, ack timeout, consumer gone, failover switch). A given-back
message's redelivery count goes up; the caller brings it back into the queue by reading it again
(``SubscriptionState.rewind``), so the dispatcher never holds payloads of outstanding messages.

Pure: no Ray, no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Iterable

from sortedcontainers import SortedDict

from raytxn.errors import InvalidArgument, NotAllowed
from raytxn.hashing import stable_hash
from raytxn.ids import Position


class ConsumerType(enum.StrEnum):
    """Subscription types, as in Pulsar (``KeyShared`` is Pulsar's Key_Shared)."""

    Exclusive = "Exclusive"
    Shared = "Shared"
    Failover = "Failover"
    KeyShared = "Key_Shared"


MessageKey = tuple[Position, int]  # (entry position, batch index); batch index 0 for single messages

# Settled = acked or held by a transaction: such a message is dropped from the queue at dispatch.
SettledCheck = Callable[[Position, int, int], bool]

_MAX_INDEX = 1 << 62  # above every batch index: (position, _MAX_INDEX) ends an entry's keys


class QueuedMessage:
    """A message waiting for a consumer: where it is, and its encoded ``MessageRecord``."""

    __slots__ = ("_key_hash", "batch_index", "batch_size", "position", "publish_time_ms", "record")

    def __init__(self, position: Position, batch_index: int, batch_size: int, publish_time_ms: int,
                 record: bytes) -> None:
        self.position = position
        self.batch_index = batch_index
        self.batch_size = batch_size
        self.publish_time_ms = publish_time_ms
        self.record = record
        self._key_hash: int | None = None  # Key_Shared: the hash of its routing key, once computed

    @property
    def key(self) -> MessageKey:
        return (self.position, self.batch_index)


class _Consumer:
    __slots__ = ("consumer_id", "demand", "fetching", "last_seen", "name", "outbox", "outstanding")

    def __init__(self, consumer_id: str, name: str, now: float) -> None:
        self.consumer_id = consumer_id
        self.name = name
        self.demand = 0                     # messages the current fetch can still take
        self.outbox: list[QueuedMessage] = []  # handed out, not yet returned by the fetch
        # Handed out, not acked (insertion ordered) -> its key's hash (Key_Shared; else None).
        self.outstanding: dict[MessageKey, int | None] = {}
        self.last_seen = now
        self.fetching = 0                   # fetches in progress (a consumer waiting is alive)


class Dispatcher:
    """Consumers, queued and outstanding messages of one subscription partition."""

    def __init__(self, partition: int, routing_key_of: Callable[[bytes], str | None],
                 ring_points: int = 100) -> None:
        """``routing_key_of(record)`` extracts a message's key (only Key_Shared needs it)."""
        self.partition = partition
        self.type: ConsumerType | None = None
        self.max_dispatched: Position | None = None  # the highest position ever handed out
        self._routing_key_of = routing_key_of
        self._ring_points = ring_points
        self._consumers: dict[str, _Consumer] = {}
        self._order: list[_Consumer] = []  # attach order: the round-robin order
        self._round_robin = 0
        self._active: str | None = None  # Exclusive / Failover
        self._ring_hashes: list[int] = []
        self._ring_owners: list[str] = []
        self._queue: SortedDict = SortedDict()  # MessageKey -> QueuedMessage
        self._owner: dict[Position, dict[int, str]] = {}  # outstanding: entry -> batch index -> consumer id
        self._redeliveries: dict[MessageKey, int] = {}
        # Key_Shared: key hash -> consumer id -> its outstanding messages of such keys
        self._key_holders: dict[int, dict[str, int]] = {}

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer_id: str, name: str, consumer_type: ConsumerType | str,
                     now: float) -> list[MessageKey]:
        """Attach a consumer (again: a no-op). Returns the messages a failover switch gave back."""
        try:
            consumer_type = ConsumerType(consumer_type)
        except ValueError:
            raise InvalidArgument(f"unknown consumer type {consumer_type!r}") from None
        existing = self._consumers.get(consumer_id)
        if existing is not None:
            existing.last_seen = now
            return []
        if self._consumers:
            if consumer_type is not self.type:
                raise NotAllowed(f"the subscription has {self.type} consumers; a {consumer_type} consumer "
                                 "cannot join")
            if consumer_type is ConsumerType.Exclusive:
                holder = next(iter(self._consumers.values()))
                raise NotAllowed(f"exclusive subscription: consumer {holder.name!r} is attached")
        self.type = consumer_type
        self._consumers[consumer_id] = _Consumer(consumer_id, name, now)
        return self._reconfigure()

    def remove_consumer(self, consumer_id: str) -> list[MessageKey]:
        """Detach a consumer; returns its outstanding messages (and those of a failover switch)."""
        if consumer_id not in self._consumers:
            return []
        released = self.release(consumer_id)
        del self._consumers[consumer_id]
        if not self._consumers:
            self.type = None
        return released + self._reconfigure()

    def has_consumer(self, consumer_id: str) -> bool:
        return consumer_id in self._consumers

    def consumer_ids(self) -> list[str]:
        return list(self._consumers)

    def touch(self, consumer_id: str, now: float, fetching: int = 0) -> None:
        """The consumer showed a sign of life; ``fetching`` +1 / -1 around a waiting fetch."""
        consumer = self._consumers.get(consumer_id)
        if consumer is not None:
            consumer.last_seen = now
            consumer.fetching = max(0, consumer.fetching + fetching)

    def idle_consumers(self, now: float, timeout_s: float) -> list[str]:
        """Consumers neither fetching nor seen for ``timeout_s``: gone, to be removed."""
        return [c.consumer_id for c in self._consumers.values()
                if not c.fetching and now - c.last_seen > timeout_s]

    def active_consumer(self) -> str | None:
        """The consumer that gets everything (Exclusive, Failover), else None."""
        return self._active

    def _reconfigure(self) -> list[MessageKey]:
        """Recompute the active consumer and the hash ring after the set of consumers changed."""
        previous = self._active
        self._active = None
        self._order = list(self._consumers.values())
        if self.type in (ConsumerType.Exclusive, ConsumerType.Failover):
            ranked = sorted(self._consumers.values(), key=lambda c: (c.name, c.consumer_id))
            self._active = ranked[self.partition % len(ranked)].consumer_id
        points = sorted((stable_hash(f"{consumer_id}#{point}"), consumer_id)
                        for consumer_id in (self._consumers if self.type is ConsumerType.KeyShared else ())
                        for point in range(self._ring_points))
        self._ring_hashes = [point_hash for point_hash, _ in points]
        self._ring_owners = [owner for _, owner in points]
        if previous is not None and previous != self._active and previous in self._consumers:
            return self.release(previous)  # the old active consumer's messages go to the new one
        return []

    # --- the queue ---------------------------------------------------------------------------

    def offer(self, message: QueuedMessage) -> bool:
        """Queue a message unless it is queued or outstanding already."""
        key = message.key
        if self.is_tracked(key):
            return False
        self._queue[key] = message
        return True

    def is_tracked(self, key: MessageKey) -> bool:
        """Whether the message is queued or outstanding (so reading it again must not queue it)."""
        owners = self._owner.get(key[0])
        return key in self._queue or (owners is not None and key[1] in owners)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def outstanding(self) -> int:
        return sum(len(c.outstanding) for c in self._consumers.values())

    def want(self, consumer_id: str, max_messages: int) -> None:
        """A fetch of ``consumer_id`` can take ``max_messages`` (its outbox counts against it)."""
        consumer = self._consumers.get(consumer_id)
        if consumer is not None:
            consumer.demand = max(0, max_messages - len(consumer.outbox))

    def has_outbox(self, consumer_id: str) -> bool:
        consumer = self._consumers.get(consumer_id)
        return consumer is not None and bool(consumer.outbox)

    def dispatch(self, settled: SettledCheck) -> list[str]:
        """Hand queued messages to consumers with demand; returns the consumers that got some.
        Queued messages that are ``settled`` by now (acked, held by a txn) are dropped."""
        demand = sum(c.demand for c in self._consumers.values())
        if not demand or not self._queue:
            return []
        served: dict[str, None] = {}
        done: list[MessageKey] = []
        for key, message in self._queue.items():
            if settled(message.position, message.batch_index, message.batch_size):
                done.append(key)
                continue
            consumer = self._route(message)
            if consumer is None:
                if self.type is ConsumerType.KeyShared:
                    continue  # its consumer is busy: later keys may still go to others
                break
            consumer.outbox.append(message)
            consumer.demand -= 1
            self._add_outstanding(consumer, key, message._key_hash if self.type is ConsumerType.KeyShared else None)
            self._owner.setdefault(message.position, {})[message.batch_index] = consumer.consumer_id
            served[consumer.consumer_id] = None
            done.append(key)
            if self.max_dispatched is None or message.position > self.max_dispatched:
                self.max_dispatched = message.position
            demand -= 1
            if not demand:
                break
        for key in done:
            del self._queue[key]
        return list(served)

    def _route(self, message: QueuedMessage) -> _Consumer | None:
        """The consumer that takes ``message`` now, or None (nobody with demand may)."""
        if self.type is ConsumerType.Shared:
            order = self._order
            for step in range(len(order)):
                consumer = order[(self._round_robin + step) % len(order)]
                if consumer.demand > 0:
                    self._round_robin = (self._round_robin + step + 1) % len(order)
                    return consumer
            return None
        if self.type is ConsumerType.KeyShared:
            if message._key_hash is None:
                message._key_hash = stable_hash(self._routing_key_of(message.record) or "")
            owner = self._consumers[self._ring_owner(message._key_hash)]
            if self._draining(message._key_hash, owner.consumer_id):
                return None
        else:
            owner = self._consumers[self._active] if self._active is not None else None
        return owner if owner is not None and owner.demand > 0 else None

    def consumer_of_key(self, key: str | None) -> str:
        """The Key_Shared consumer of ``key`` (messages without a key share the empty key)."""
        if not self._ring_owners:
            raise InvalidArgument("no Key_Shared consumers")
        return self._ring_owner(stable_hash(key or ""))

    def _ring_owner(self, key_hash: int) -> str:
        index = bisect.bisect_right(self._ring_hashes, key_hash)
        return self._ring_owners[index % len(self._ring_owners)]

    def _draining(self, key_hash: int, consumer_id: str) -> bool:
        """Whether messages of keys with this hash are outstanding with another consumer than
        ``consumer_id`` (the key moved to it): then its messages wait (module docstring)."""
        holders = self._key_holders.get(key_hash)
        return holders is not None and any(holder != consumer_id for holder in holders)

    def draining_keys(self) -> int:
        """Key hashes whose messages wait for another consumer's outstanding ones (stats)."""
        if self.type is not ConsumerType.KeyShared or not self._ring_owners:
            return 0
        return sum(any(holder != self._ring_owner(key_hash) for holder in holders)
                   for key_hash, holders in self._key_holders.items())

    def _add_outstanding(self, consumer: _Consumer, key: MessageKey, key_hash: int | None) -> None:
        consumer.outstanding[key] = key_hash
        if key_hash is not None:
            holders = self._key_holders.setdefault(key_hash, {})
            holders[consumer.consumer_id] = holders.get(consumer.consumer_id, 0) + 1

    def _drop_outstanding(self, consumer: _Consumer, key: MessageKey) -> None:
        key_hash = consumer.outstanding.pop(key, None)
        if key_hash is None:
            return
        holders = self._key_holders[key_hash]
        holders[consumer.consumer_id] -= 1
        if not holders[consumer.consumer_id]:
            del holders[consumer.consumer_id]
            if not holders:
                del self._key_holders[key_hash]

    def take(self, consumer_id: str) -> list[tuple[QueuedMessage, int]]:
        """End a fetch: the messages handed to ``consumer_id`` with their redelivery counts."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            return []
        taken, consumer.outbox, consumer.demand = consumer.outbox, [], 0
        return [(message, self._redeliveries.get(message.key, 0)) for message in taken]

    # --- acks and redelivery -----------------------------------------------------------------

    def settle(self, keys: Iterable[MessageKey]) -> list[MessageKey]:
        """The messages are acked (or held by a txn): no longer outstanding nor queued. Returns
        the keys that were outstanding."""
        removed = []
        for key in keys:
            self._queue.pop(key, None)
            owners = self._owner.get(key[0])
            owner = owners.pop(key[1], None) if owners is not None else None
            if owner is not None:
                if not owners:
                    del self._owner[key[0]]
                self._drop_outstanding(self._consumers[owner], key)
                removed.append(key)
        return removed

    def first_queued(self) -> MessageKey | None:
        """The lowest message read but not yet handed out (None: nothing queued)."""
        return self._queue.peekitem(0)[0] if self._queue else None

    def unqueue_from(self, position: Position) -> int:
        """Drop the queued (not yet handed out) messages at or after ``position``; returns how
        many. After a rewind to ``position`` they are read again, in order behind the messages
        being given back, so no consumer gets a later message before an earlier one."""
        keys = list(self._queue.irange(minimum=(position, 0)))
        for key in keys:
            del self._queue[key]
        return len(keys)

    def settle_entry(self, position: Position) -> list[MessageKey]:
        """``settle`` every message of the entry at ``position`` (a whole batch acked at once)."""
        for key in list(self._queue.irange((position, 0), (position, _MAX_INDEX))):
            del self._queue[key]
        removed = []
        for index, owner in self._owner.pop(position, {}).items():
            self._drop_outstanding(self._consumers[owner], (position, index))
            removed.append((position, index))
        return removed

    def settle_through(self, position: Position) -> list[MessageKey]:
        """``settle`` every message at or below ``position`` (a cumulative ack)."""
        for key in list(self._queue.irange(maximum=(position, _MAX_INDEX))):
            del self._queue[key]
        removed = []
        for entry in [entry for entry in self._owner if entry <= position]:
            removed += self.settle_entry(entry)
        return removed

    def release(self, consumer_id: str, keys: Iterable[MessageKey] | None = None) -> list[MessageKey]:
        """Give back outstanding messages of ``consumer_id`` (all when ``keys`` is None); their
        redelivery counts go up. Returns the keys given back, for the caller to read again."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            return []
        if keys is None:
            released = list(consumer.outstanding)
        else:
            released = [key for key in keys if key in consumer.outstanding]
        for key in released:
            self._drop_outstanding(consumer, key)
            owners = self._owner[key[0]]
            del owners[key[1]]
            if not owners:
                del self._owner[key[0]]
        self.count_redelivery(released)
        gone = set(released)
        consumer.outbox = [message for message in consumer.outbox if message.key not in gone]
        return released

    def count_redelivery(self, keys: Iterable[MessageKey]) -> None:
        for key in keys:
            self._redeliveries[key] = self._redeliveries.get(key, 0) + 1

    def forget_redeliveries(self, keys: Iterable[MessageKey]) -> None:
        for key in keys:
            self._redeliveries.pop(key, None)

    def prune_redeliveries(self, acked_below: Position) -> None:
        """Drop the counts of messages below the mark-delete bound (acked for good)."""
        if self._redeliveries:
            self._redeliveries = {k: v for k, v in self._redeliveries.items() if k[0] >= acked_below}

    def redelivery_count(self, key: MessageKey) -> int:
        return self._redeliveries.get(key, 0)

    def reset(self) -> None:
        """Forget queued and outstanding messages and redelivery counts (a seek)."""
        self._queue.clear()
        self._owner.clear()
        self._redeliveries.clear()
        self._key_holders.clear()
        for consumer in self._consumers.values():
            consumer.outstanding.clear()
            consumer.outbox = []

    def consumer_stats(self) -> list[dict[str, object]]:
        return [{"consumer_id": c.consumer_id, "name": c.name, "outstanding": len(c.outstanding),
                 "demand": c.demand, "active": c.consumer_id == self._active}
                for c in self._consumers.values()]
