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

Granularity. The queue and the outboxes hold whole entries (a producer batch, up to thousands of
messages) with the batch indexes of theirs that still wait, not one object per message: Exclusive
and Failover consumers take an entry's messages in one slice, so handing out a batch costs about
what handing out one message does. Shared and Key_Shared route message by message within an
entry, as their rules need, but still hand out slices of entries, and a consumer's demand may
end in the middle of an entry (the rest of it stays queued). An Exclusive or Failover consumer
with any demand takes the rest of an entry whole, as Pulsar's dispatcher hands out whole entries
and lets a consumer's permits go below zero: a consumer asking for half its 1,000-message receive
queue then gets a producer's 1,000-message batch in one fetch, not in two, and its queue holds at
most one entry more than its size.

Pure: no Ray, no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Iterable, Sequence

from sortedcontainers import SortedDict

from raytxn.errors import InvalidArgument, NotAllowed
from raytxn.hashing import stable_hash
from raytxn.ids import Position
from raytxn.protocol.packed_records import PackedRecords


class ConsumerType(enum.StrEnum):
    """Subscription types, as in Pulsar (``KeyShared`` is Pulsar's Key_Shared)."""

    Exclusive = "Exclusive"
    Shared = "Shared"
    Failover = "Failover"
    KeyShared = "Key_Shared"


MessageKey = tuple[Position, int]  # (entry position, batch index); batch index 0 for single messages

# ``deliverable(position, batch_size, indexes)``: the indexes (a sorted list) of the entry that
# may still be delivered, the same list when all may. The rest are settled by now (acked, or held
# by a transaction) and dropped from the queue at dispatch.
DeliverableCheck = Callable[[Position, int, list[int]], list[int]]


class QueuedEntry:
    """An entry with messages waiting for a consumer: its records as read (``records[0]`` is the
    header, ``records[i + 1]`` message ``i``) and the batch indexes still queued, ascending.
    The records stay packed as the partition sent them while every message is queued; otherwise
    they are a list with None for each message not queued, so a mostly acked batch read again
    does not keep every payload."""

    __slots__ = ("batch_size", "indexes", "key_hashes", "position", "publish_time_ms", "records")

    def __init__(self, position: Position, batch_size: int, publish_time_ms: int,
                 records: list | PackedRecords, indexes: list[int]) -> None:
        self.position = position
        self.batch_size = batch_size
        self.publish_time_ms = publish_time_ms
        self.records = records
        self.indexes = indexes
        self.key_hashes: dict[int, int] | None = None  # Key_Shared: batch index -> its key's hash

    def record(self, batch_index: int) -> bytes:
        return self.records[batch_index + 1]


class QueuedMessage:
    """One message: where it is, and its encoded ``MessageRecord`` (``offer`` and ``take`` speak
    in these; the queue itself holds ``QueuedEntry``s)."""

    __slots__ = ("batch_index", "batch_size", "position", "publish_time_ms", "record")

    def __init__(self, position: Position, batch_index: int, batch_size: int, publish_time_ms: int,
                 record: bytes) -> None:
        self.position = position
        self.batch_index = batch_index
        self.batch_size = batch_size
        self.publish_time_ms = publish_time_ms
        self.record = record

    @property
    def key(self) -> MessageKey:
        return (self.position, self.batch_index)


# A slice of an entry handed to a consumer: the entry, and the batch indexes it got (ascending).
Chunk = tuple[QueuedEntry, list[int]]


class _Consumer:
    __slots__ = ("asked", "consumer_id", "demand", "fetching", "last_seen", "name", "outbox", "outbox_count",
                 "outstanding", "outstanding_count")

    def __init__(self, consumer_id: str, name: str, now: float) -> None:
        self.consumer_id = consumer_id
        self.name = name
        self.demand = 0                     # messages the current fetch can still take
        self.asked = 0                      # messages its last fetch (not a ping) could take
        self.outbox: list[Chunk] = []       # handed out, not yet returned by the fetch
        self.outbox_count = 0
        # Handed out, not acked: entry -> batch index -> its key's hash (Key_Shared; else None),
        # insertion ordered.
        self.outstanding: dict[Position, dict[int, int | None]] = {}
        self.outstanding_count = 0
        self.last_seen = now
        self.fetching = 0                   # fetches in progress (a consumer waiting is alive)

    def add_outbox(self, entry: QueuedEntry, indexes: list[int]) -> None:
        """Append to the outbox, extending its last chunk when it is of the same entry (the
        caller took them off the consumer's demand when it chose them)."""
        if self.outbox and self.outbox[-1][0] is entry and self.outbox[-1][1][-1] < indexes[0]:
            self.outbox[-1][1].extend(indexes)  # (chunks stay ascending: a whole one is 0..n-1)
        else:
            self.outbox.append((entry, indexes))
        self.outbox_count += len(indexes)

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
        self._queue: SortedDict = SortedDict()  # Position -> QueuedEntry (with queued indexes)
        self._queued = 0  # messages in the queue
        self._owner: dict[Position, dict[int, str]] = {}  # outstanding: entry -> batch index -> consumer id
        self._redeliveries: dict[MessageKey, int] = {}
        # Key_Shared: key hash -> consumer id -> its outstanding messages of such keys
        self._key_holders: dict[int, dict[str, int]] = {}
        # Outstanding messages to hand to their holder (``_owner``) once more (``resend``)
        self._resend: set[MessageKey] = set()

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

    def offer_entry(self, position: Position, batch_size: int, publish_time_ms: int,
                    records: list | PackedRecords, indexes: list[int]) -> int:
        """Queue the messages ``indexes`` (ascending) of an entry as read (``records[0]`` its
        header), except those queued or outstanding already; returns how many were queued."""
        queued = self._queue.get(position)
        owners = self._owner.get(position)
        if queued is not None or owners is not None:
            taken = set(queued.indexes) if queued is not None else set()
            if owners is not None:
                taken.update(index for index in owners if (position, index) not in self._resend)
            indexes = [index for index in indexes if index not in taken]
        if not indexes:
            return 0
        if queued is None:
            self._queue[position] = QueuedEntry(position, batch_size, publish_time_ms, records, indexes)
        else:
            if not isinstance(queued.records, list):  # packed as read: made a list to fill in
                queued.records = list(queued.records)
            for index in indexes:
                queued.records[index + 1] = records[index + 1]
            queued.indexes = sorted(queued.indexes + indexes)
        self._queued += len(indexes)
        return len(indexes)

    def offer(self, message: QueuedMessage) -> bool:
        """Queue one message unless it is queued or outstanding already."""
        records: list = [None] * (message.batch_size + 1)
        records[message.batch_index + 1] = message.record
        return bool(self.offer_entry(message.position, message.batch_size, message.publish_time_ms, records,
                                     [message.batch_index]))

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def asked(self) -> int:
        """Messages the consumers' last fetches could take, together: about their receive queues."""
        return sum(c.asked for c in self._consumers.values())

    @property
    def outstanding(self) -> int:
        return sum(c.outstanding_count for c in self._consumers.values())

    def want(self, consumer_id: str, max_messages: int) -> None:
        """A fetch of ``consumer_id`` can take ``max_messages`` (its outbox counts against it)."""
        consumer = self._consumers.get(consumer_id)
        if consumer is not None:
            consumer.demand = max(0, max_messages - consumer.outbox_count)
            if max_messages > 0:
                consumer.asked = max_messages

    def has_outbox(self, consumer_id: str) -> bool:
        consumer = self._consumers.get(consumer_id)
        return consumer is not None and bool(consumer.outbox)

    def dispatch(self, deliverable: DeliverableCheck) -> list[str]:
        """Hand queued messages to consumers with demand; returns the consumers that got some.
        Queued messages no longer ``deliverable`` (acked, held by a txn) are dropped."""
        demand = sum(c.demand for c in self._consumers.values())
        if not demand or not self._queue:
            return []
        served: dict[str, None] = {}
        emptied: list[Position] = []
        whole_entries = self.type in (ConsumerType.Exclusive, ConsumerType.Failover)
        for position, entry in self._queue.items():
            indexes = deliverable(position, entry.batch_size, entry.indexes)
            if len(indexes) != len(entry.indexes):
                self._queued -= len(entry.indexes) - len(indexes)
                entry.indexes = indexes
            if indexes:
                if whole_entries:
                    handed = self._hand_out_whole(entry, served)
                    if not handed:
                        break
                else:
                    handed = self._hand_out_routed(entry, served, demand)
                    if handed is None:
                        break
                demand -= handed
            if not entry.indexes:
                emptied.append(position)
            if demand <= 0:
                break
        for position in emptied:
            del self._queue[position]
        return list(served)

    def _hand_out_whole(self, entry: QueuedEntry, served: dict[str, None]) -> int:
        """Exclusive / Failover: the active consumer, if it has any demand, takes every queued
        index of the entry (see the module docstring: whole entries, as Pulsar). Returns how many
        (0: nobody may take any)."""
        consumer = self._consumers[self._active] if self._active is not None else None
        if consumer is None or consumer.demand <= 0:
            return 0
        handed, entry.indexes = entry.indexes, []
        consumer.demand = max(0, consumer.demand - len(handed))
        self._hand_out(consumer, entry, handed, None)
        served[consumer.consumer_id] = None
        return len(handed)

    def _hand_out_routed(self, entry: QueuedEntry, served: dict[str, None], demand: int) -> int | None:
        """Shared / Key_Shared: route each queued message of the entry. Returns how many were
        handed out; None when a message found nobody and later ones must not pass it (Shared)."""
        key_shared = self.type is ConsumerType.KeyShared
        waiting: list[int] = []
        handed_to: dict[str, list[int]] = {}
        handed = 0
        stopped = False
        for position_in_queue, index in enumerate(entry.indexes):
            if handed == demand:
                waiting.extend(entry.indexes[position_in_queue:])
                break
            consumer = self._route(entry, index)
            if consumer is None:
                if key_shared or (entry.position, index) in self._resend:
                    waiting.append(index)  # its consumer is busy: later keys may still go to others
                    continue
                waiting.extend(entry.indexes[position_in_queue:])
                stopped = True
                break
            consumer.demand -= 1
            handed_to.setdefault(consumer.consumer_id, []).append(index)
            handed += 1
        entry.indexes = waiting
        for consumer_id, indexes in handed_to.items():
            consumer = self._consumers[consumer_id]
            key_hashes = entry.key_hashes if key_shared else None
            self._hand_out(consumer, entry, indexes, key_hashes)
            served[consumer_id] = None
        return None if stopped and not handed else handed

    def _hand_out(self, consumer: _Consumer, entry: QueuedEntry, indexes: list[int],
                  key_hashes: dict[int, int] | None) -> None:
        """Move ``indexes`` of ``entry`` (already off the queue's list) to the consumer's outbox
        and its outstanding messages."""
        position = entry.position
        self._queued -= len(indexes)
        if self._resend:  # handed out once more: outstanding with its new holder only, counted once
            for index in indexes:
                if (position, index) in self._resend:
                    self._resend.discard((position, index))
                    previous = self._owner[position][index]
                    self._drop_outstanding(self._consumers[previous], position, (index,))
        consumer.add_outbox(entry, indexes)
        held = consumer.outstanding.get(position)
        if held is None:
            held = consumer.outstanding[position] = {}
        if key_hashes is None:
            held.update(dict.fromkeys(indexes))
        else:
            for index in indexes:
                key_hash = key_hashes[index]
                held[index] = key_hash
                holders = self._key_holders.setdefault(key_hash, {})
                holders[consumer.consumer_id] = holders.get(consumer.consumer_id, 0) + 1
        consumer.outstanding_count += len(indexes)
        owners = self._owner.get(position)
        if owners is None:
            self._owner[position] = dict.fromkeys(indexes, consumer.consumer_id)
        else:
            owners.update(dict.fromkeys(indexes, consumer.consumer_id))
        if self.max_dispatched is None or position > self.max_dispatched:
            self.max_dispatched = position

    def _route(self, entry: QueuedEntry, index: int) -> _Consumer | None:
        """The consumer that takes message ``index`` of ``entry`` now, or None (nobody with demand
        may). Shared and Key_Shared only. A message to ``resend`` goes to its holder."""
        shared = self.type is ConsumerType.Shared
        if not shared:
            if entry.key_hashes is None:
                entry.key_hashes = {}
            key_hash = entry.key_hashes.get(index)
            if key_hash is None:
                key_hash = entry.key_hashes[index] = stable_hash(self._routing_key_of(entry.record(index)) or "")
        if self._resend and (entry.position, index) in self._resend:
            consumer = self._consumers[self._owner[entry.position][index]]
            return consumer if consumer.demand > 0 else None
        if shared:
            order = self._order
            for step in range(len(order)):
                consumer = order[(self._round_robin + step) % len(order)]
                if consumer.demand > 0:
                    self._round_robin = (self._round_robin + step + 1) % len(order)
                    return consumer
            return None
        owner = self._consumers[self._ring_owner(key_hash)]
        if self._draining(key_hash, owner.consumer_id):
            return None
        return owner if owner.demand > 0 else None

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

    def _drop_outstanding(self, consumer: _Consumer, position: Position, indexes: Iterable[int]) -> None:
        """``indexes`` of the entry at ``position`` are no longer outstanding with ``consumer``."""
        held = consumer.outstanding.get(position)
        if held is None:
            return
        for index in indexes:
            if index not in held:
                continue
            key_hash = held.pop(index)
            consumer.outstanding_count -= 1
            if key_hash is not None:
                self._unhold_key(consumer.consumer_id, key_hash)
        if not held:
            del consumer.outstanding[position]

    def _drop_outstanding_entry(self, consumer: _Consumer, position: Position) -> None:
        held = consumer.outstanding.pop(position, None)
        if held is None:
            return
        consumer.outstanding_count -= len(held)
        if self.type is ConsumerType.KeyShared:
            for key_hash in held.values():
                if key_hash is not None:
                    self._unhold_key(consumer.consumer_id, key_hash)

    def _unhold_key(self, consumer_id: str, key_hash: int) -> None:
        holders = self._key_holders[key_hash]
        holders[consumer_id] -= 1
        if not holders[consumer_id]:
            del holders[consumer_id]
            if not holders:
                del self._key_holders[key_hash]

    def take_chunks(self, consumer_id: str) -> list[Chunk]:
        """End a fetch: the slices of entries handed to ``consumer_id``, in the order handed out."""
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            return []
        taken = consumer.outbox
        consumer.outbox, consumer.outbox_count, consumer.demand = [], 0, 0
        return taken

    def take(self, consumer_id: str) -> list[tuple[QueuedMessage, int]]:
        """``take_chunks`` one message at a time, with the redelivery counts."""
        return [(QueuedMessage(entry.position, index, entry.batch_size, entry.publish_time_ms, entry.record(index)),
                 self._redeliveries.get((entry.position, index), 0))
                for entry, indexes in self.take_chunks(consumer_id) for index in indexes]

    def redelivery_counts(self, position: Position, indexes: Sequence[int]) -> list[int] | None:
        """The redelivery counts of those messages of an entry (None: all 0)."""
        if not self._redeliveries:
            return None
        counts = [self._redeliveries.get((position, index), 0) for index in indexes]
        return counts if any(counts) else None

    # --- acks and redelivery -----------------------------------------------------------------

    def settle(self, keys: Iterable[MessageKey]) -> list[MessageKey]:
        """The messages are acked (or held by a txn): no longer outstanding nor queued. Returns
        the keys that were outstanding."""
        removed = []
        for key in keys:
            position, index = key
            queued = self._queue.get(position)
            if queued is not None and _contains(queued.indexes, index):
                queued.indexes.remove(index)
                self._queued -= 1
                if not queued.indexes:
                    del self._queue[position]
            owners = self._owner.get(position)
            owner = owners.pop(index, None) if owners is not None else None
            if owner is not None:
                self._unpin(position, (index,))
                if not owners:
                    del self._owner[position]
                self._drop_outstanding(self._consumers[owner], position, (index,))
                removed.append(key)
        return removed

    def settle_indexes(self, position: Position, first: int, last: int) -> None:
        """``settle`` batch indexes ``first..last`` of the entry at ``position`` (a plain ack of an
        index run), and forget the redelivery counts of those that were outstanding: one lookup
        of the entry for the run, not one per message."""
        queued = self._queue.get(position)
        if queued is not None:
            kept = [index for index in queued.indexes if not first <= index <= last]
            if len(kept) < len(queued.indexes):
                self._queued -= len(queued.indexes) - len(kept)
                if kept:
                    queued.indexes[:] = kept
                else:
                    del self._queue[position]
        owners = self._owner.get(position)
        if owners is None:
            return
        by_holder: dict[str, list[int]] = {}
        for index in range(first, last + 1):
            holder = owners.pop(index, None)
            if holder is not None:
                by_holder.setdefault(holder, []).append(index)
        if not owners:
            del self._owner[position]
        for holder, indexes in by_holder.items():
            self._unpin(position, indexes)
            self._drop_outstanding(self._consumers[holder], position, indexes)
            self.forget_redeliveries((position, index) for index in indexes)

    def settle_for(self, holder: str, keys: Iterable[MessageKey],
                   entries: Iterable[Position] = ()) -> tuple[list[MessageKey], list[MessageKey]]:
        """``settle`` the messages ``keys`` and every message of ``entries`` for acks that
        consumer ``holder`` made, except those outstanding with another consumer: they stay
        outstanding with it (and their keys keep draining). Returns (settled, kept). An entry
        no other consumer holds any of is settled whole (``settle_entry``), as before."""
        settled: list[MessageKey] = []
        mine, kept = [], []
        for position in entries:
            owners = self._owner.get(position)
            if owners is None or set(owners.values()) <= {holder}:
                settled += self.settle_entry(position)
                continue
            queued = self._queue.pop(position, None)
            if queued is not None:
                self._queued -= len(queued.indexes)
            for index, owner in owners.items():
                (mine if owner == holder else kept).append((position, index))
        for key in keys:
            owners = self._owner.get(key[0])
            owner = owners.get(key[1]) if owners is not None else None
            (kept if owner is not None and owner != holder else mine).append(key)
        return settled + self.settle(mine), kept

    def resend(self, keys: Iterable[MessageKey]) -> list[MessageKey]:
        """Hand these messages once more to the consumers holding them (the abort of a txn that
        acked them while another consumer held them: ``SubscriptionState._settle_txn_acks``).
        They stay outstanding with their holder, so their keys keep draining, and their
        redelivery counts go up; the caller reads them again, and ``offer_entry`` queues them
        for that consumer alone. Keys no longer outstanding are left out (a rewind queues them
        as usual). Returns the keys marked.

        Why not give them back: another consumer would get them while their holder may still
        be working on them, against Key_Shared. Why not leave them be: the holder may have
        given up on them already (its own txn ack of them was refused while that txn held
        them), and then nothing would ever hand them out again."""
        marked = []
        for key in keys:
            owners = self._owner.get(key[0])
            holder = owners.get(key[1]) if owners is not None else None
            if holder is not None:
                self._resend.add(key)
                marked.append(key)
        self.count_redelivery(marked)
        return marked

    def first_queued(self) -> MessageKey | None:
        """The lowest message read but not yet handed out (None: nothing queued)."""
        if not self._queue:
            return None
        position, entry = self._queue.peekitem(0)
        return (position, entry.indexes[0])

    def unqueue_from(self, position: Position) -> int:
        """Drop the queued (not yet handed out) messages at or after ``position``; returns how
        many. After a rewind to ``position`` they are read again, in order behind the messages
        being given back, so no consumer gets a later message before an earlier one."""
        dropped = 0
        for entry_position in list(self._queue.irange(minimum=position)):
            dropped += len(self._queue.pop(entry_position).indexes)
        self._queued -= dropped
        return dropped

    def settle_entry(self, position: Position) -> list[MessageKey]:
        """``settle`` every message of the entry at ``position`` (a whole batch acked at once)."""
        queued = self._queue.pop(position, None)
        if queued is not None:
            self._queued -= len(queued.indexes)
        owners = self._owner.pop(position, None)
        if owners is None:
            return []
        self._unpin(position, owners)
        for consumer_id in set(owners.values()):
            self._drop_outstanding_entry(self._consumers[consumer_id], position)
        return [(position, index) for index in owners]

    def _unpin(self, position: Position, indexes: Iterable[int]) -> None:
        """Those messages are no longer outstanding: nothing to ``resend`` to a holder."""
        if self._resend:
            self._resend.difference_update((position, index) for index in indexes)

    def ack_entries(self, positions: Iterable[Position]) -> None:
        """The entries are acked for good: ``settle`` them and forget their redelivery counts
        (without listing their messages, which would cost one object per message)."""
        for position in positions:
            queued = self._queue.pop(position, None)
            if queued is not None:
                self._queued -= len(queued.indexes)
            owners = self._owner.pop(position, None)
            if owners is not None:
                self._unpin(position, owners)
                for consumer_id in set(owners.values()):
                    self._drop_outstanding_entry(self._consumers[consumer_id], position)
                if self._redeliveries:
                    self.forget_redeliveries([(position, index) for index in owners])

    def settle_through(self, position: Position) -> list[MessageKey]:
        """``settle`` every message at or below ``position`` (a cumulative ack)."""
        for entry_position in list(self._queue.irange(maximum=position)):
            self._queued -= len(self._queue.pop(entry_position).indexes)
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
            released = [(position, index) for position, held in consumer.outstanding.items() for index in held]
        else:
            # Once each: a message can be due twice in one request (its negative ack and its ack
            # timeout), and giving it back twice met its owner already gone (KeyError).
            released = [key for key in dict.fromkeys(keys) if key[1] in consumer.outstanding.get(key[0], ())]
        by_entry: dict[Position, list[int]] = {}
        for position, index in released:
            by_entry.setdefault(position, []).append(index)
        for position, indexes in by_entry.items():
            self._drop_outstanding(consumer, position, indexes)
            owners = self._owner[position]
            for index in indexes:
                del owners[index]
            if not owners:
                del self._owner[position]
            self._unpin(position, indexes)
        self.count_redelivery(released)
        if released and consumer.outbox:
            self._drop_from_outbox(consumer, by_entry)
        return released

    @staticmethod
    def _drop_from_outbox(consumer: _Consumer, gone: dict[Position, list[int]]) -> None:
        outbox = []
        for entry, indexes in consumer.outbox:
            dropped = gone.get(entry.position)
            if dropped:
                dropped_set = set(dropped)
                indexes = [index for index in indexes if index not in dropped_set]
            if indexes:
                outbox.append((entry, indexes))
        consumer.outbox = outbox
        consumer.outbox_count = sum(len(indexes) for _, indexes in outbox)

    def count_redelivery(self, keys: Iterable[MessageKey]) -> None:
        for key in keys:
            self._redeliveries[key] = self._redeliveries.get(key, 0) + 1

    def forget_redeliveries(self, keys: Iterable[MessageKey]) -> None:
        if not self._redeliveries:
            return
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
        self._queued = 0
        self._owner.clear()
        self._redeliveries.clear()
        self._key_holders.clear()
        self._resend.clear()
        for consumer in self._consumers.values():
            consumer.outstanding.clear()
            consumer.outstanding_count = 0
            consumer.outbox, consumer.outbox_count = [], 0

    def consumer_stats(self) -> list[dict[str, object]]:
        return [{"consumer_id": c.consumer_id, "name": c.name, "outstanding": c.outstanding_count,
                 "demand": c.demand, "active": c.consumer_id == self._active}
                for c in self._consumers.values()]


def _contains(sorted_indexes: list[int], index: int) -> bool:
    at = bisect.bisect_left(sorted_indexes, index)
    return at < len(sorted_indexes) and sorted_indexes[at] == index
