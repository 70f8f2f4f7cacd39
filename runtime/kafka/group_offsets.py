"""OffsetCommit, OffsetFetch, OffsetDelete, AddOffsetsToTxn and TxnOffsetCommit: a Kafka group's committed
offsets are the cursor of the raytxn subscription named after the group (``mapping``), so they
are as durable as any cursor and outlive the gateway. Nothing about offsets is kept here.

* Commit offset O on partition p: the partition maps O to the message it names (``kafka_locate``:
  entry position and index, or the partition's end for the high watermark), then the
  subscription takes "everything before that message is consumed" (``kafka_commit``): plainly
  (the cursor moves there, also back, persisted before the answer) or in the Kafka transaction's
  raytxn transaction, as a cumulative ack that commits or aborts with it. The subscription is
  created at ``earliest`` on a group's first commit to a topic; the transaction registers it with
  its coordinator before the ack.
* Fetch: the subscription's first unacked message (``kafka_committed``) mapped back to an offset
  (``kafka_offset_of``); -1 when the group never committed on the topic (no subscription, or
  one whose cursor never moved: where a group's aborted first transaction leaves it).
  ``require_stable`` (read_committed consumers) gets UNSTABLE_OFFSET_COMMIT while a transaction
  holds acks on the partition, as from Kafka (KIP-447): the consumer asks again after it ended.

A commit's metadata string is kept with the offset, as durably: the cursor holds it with its
mark-delete bound (persisted with it), a transactional commit's rides with its cumulative ack in the
pending-ack log and is set when the transaction commits (an abort drops it); fetches answer it.
Past 4096 UTF-8 bytes (Kafka's default offset.metadata.max.bytes) a partition's commit gets
OFFSET_METADATA_TOO_LARGE and changes nothing. Offsets outside [log start offset, high
watermark] get OFFSET_OUT_OF_RANGE, as does a transactional commit below the committed offset
(a transaction only moves it forward). A group's commits and raytxn consumers (or leases) on the
same subscription do not mix: INCONSISTENT_GROUP_PROTOCOL.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import OffsetCommitResponse, OffsetDeleteResponse, OffsetFetchResponse
from kafka.protocol.producer import TxnOffsetCommitResponse

from raytxn.errors import (
    InvalidArgument,
    MetadataTooLarge,
    NotAllowed,
    RaytxnError,
    Timeout,
    TopicNotFound,
    TransactionConflict,
)
from raytxn.ids import TxnID
from raytxn.kafka import mapping, wire
from raytxn.kafka.group_admin import GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP
from raytxn.kafka.group_membership import GroupMembership, group_id_error
from raytxn.kafka.transactions import KafkaTransactions, TxnState
from raytxn.protocol.cursor import check_metadata

KNOWN_SUBSCRIPTION_S = 2.0  # how long "this group's subscription exists" is trusted without asking
MAX_KNOWN = 10_000


@dataclass(frozen=True)
class Engine:
    """How the offset handlers reach raytxn (the gateway's calls). ``partitions(topic)``: the
    count (``TopicNotFound`` if none); ``partition_call(topic, p, method, *args)``;
    ``subscription_call(topic, p, group, method, *args)``; ``subscriptions(topic)``: its
    subscription names; ``create_subscription(topic, group)`` at earliest; ``topics()``: every
    topic as ``{"name", "partitions", "subscriptions"}``."""

    partitions: Callable[[str], Awaitable[int]]
    partition_call: Callable[..., Awaitable[Any]]
    subscription_call: Callable[..., Awaitable[Any]]
    subscriptions: Callable[[str], Awaitable[list[str]]]
    create_subscription: Callable[[str, str], Awaitable[Any]]
    topics: Callable[[], Awaitable[list[dict[str, Any]]]]


def commit_error(error: RaytxnError) -> int:
    """The Kafka error code of a commit or fetch that raytxn refused."""
    if isinstance(error, TransactionConflict):
        return wire.CONCURRENT_TRANSACTIONS  # another txn's offsets are pending there: retry later
    if isinstance(error, MetadataTooLarge):
        return wire.OFFSET_METADATA_TOO_LARGE
    if isinstance(error, NotAllowed):
        return wire.INCONSISTENT_GROUP_PROTOCOL  # raytxn consumers or a lease read the subscription
    if type(error) is InvalidArgument:
        return wire.OFFSET_OUT_OF_RANGE  # a transactional commit moving the offset back
    if isinstance(error, Timeout):
        return wire.REQUEST_TIMED_OUT
    if error.retriable:
        return wire.COORDINATOR_NOT_AVAILABLE  # an actor restarting: the client finds us and retries
    return mapping.error_code(error)


def metadata_error(metadata: str) -> int:
    """OFFSET_METADATA_TOO_LARGE for a commit metadata string past the limit, else NONE."""
    try:
        check_metadata(metadata)
    except MetadataTooLarge:
        return wire.OFFSET_METADATA_TOO_LARGE
    return wire.NONE


# One offset to commit: (topic, partition, offset, metadata).
Wanted = tuple[str, int, int, str]


class GroupOffsets:
    def __init__(self, engine: Engine, membership: GroupMembership, transactions: KafkaTransactions) -> None:
        self.engine, self.membership, self.transactions = engine, membership, transactions
        self._known: dict[tuple[str, str], float] = {}  # (topic, group) -> when its subscription was seen

    async def _partition_error(self, topic: str, partition: int) -> int:
        try:
            count = await self.engine.partitions(topic)
        except (TopicNotFound, InvalidArgument) as e:
            return mapping.error_code(e)
        return wire.NONE if 0 <= partition < count else wire.UNKNOWN_TOPIC_OR_PARTITION

    async def _ensure_subscription(self, topic: str, group: str) -> None:
        now = time.monotonic()
        seen = self._known.get((topic, group))
        if seen is not None and now - seen < KNOWN_SUBSCRIPTION_S:
            return
        if group not in await self.engine.subscriptions(topic):
            await self.engine.create_subscription(topic, group)
        if len(self._known) >= MAX_KNOWN:
            self._known.clear()
        self._known[(topic, group)] = now

    async def _locate(self, topic: str, partition: int, offset: int) -> dict[str, Any] | int:
        """Where ``offset`` is (see the partition's ``kafka_locate``), or the Kafka error code."""
        error = await self._partition_error(topic, partition)
        if error != wire.NONE:
            return error
        try:
            where = await self.engine.partition_call(topic, partition, "kafka_locate", offset)
        except RaytxnError as e:
            return commit_error(e)
        return wire.OFFSET_OUT_OF_RANGE if where is None else where

    async def _commit(self, topic: str, partition: int, group: str, where: dict[str, Any],
                      txn: TxnID | None, metadata: str) -> int:
        try:  # (the subscription exists: ``_commit_all`` made sure of it)
            await self.engine.subscription_call(topic, partition, group, "kafka_commit", where["position"],
                                                where["index"], where["size"], txn, f"kafka-{uuid.uuid4().hex}",
                                                metadata)
        except RaytxnError as e:
            return commit_error(e)
        return wire.NONE

    # --- plain commits and fetches -----------------------------------------------------------

    async def offset_commit(self, request: Any, version: int) -> dict[str, Any]:
        """Every partition located at once, each topic's subscription made sure of once, then
        every commit at once: a group's first commit starts the subscription's actors, and one
        after another a 4-partition commit took four process starts, long enough under load for
        librdkafka (which holds heartbeats behind it) to give up the member's session."""
        group = request.group_id
        error = group_id_error(group)
        if error == wire.NONE:
            instance_id = request.group_instance_id if version >= 7 else None
            error = self.membership.check_commit(group, request.member_id, request.generation_id_or_member_epoch,
                                                 instance_id)
        wanted = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "")
                  for t in request.topics for p in t.partitions]
        codes = await self._commit_all(group, wanted, error)
        result = OffsetCommitResponse.OffsetCommitResponseTopic
        return {"throttle_time_ms": 0, "topics": [
            result(name=t.name, partitions=[result.OffsetCommitResponsePartition(
                partition_index=p.partition_index, error_code=codes[(t.name, p.partition_index)])
                for p in t.partitions]) for t in request.topics]}

    async def _commit_all(self, group: str, wanted: list[Wanted], error: int,
                          txn_state: TxnState | None = None, txn: TxnID | None = None) -> dict[tuple[str, int], int]:
        """Each ``(topic, partition)``'s error code after committing its offset and metadata (in
        ``txn``, the group's txn of ``txn_state``, after registering its subscriptions there).
        Metadata past the limit: OFFSET_METADATA_TOO_LARGE for that partition, not committed."""
        if error != wire.NONE:
            return {(name, index): error for name, index, _, _ in wanted}
        codes: dict[tuple[str, int], int] = {}
        for name, index, _, metadata in wanted:
            if metadata_error(metadata) != wire.NONE:
                codes[(name, index)] = wire.OFFSET_METADATA_TOO_LARGE
        wanted = [row for row in wanted if (row[0], row[1]) not in codes]
        metadata_of = {(name, index): metadata for name, index, _, metadata in wanted}
        wheres = await asyncio.gather(*(self._locate(name, index, offset) for name, index, offset, _ in wanted))
        located: dict[tuple[str, int], dict[str, Any]] = {}
        for (name, index, _, _), where in zip(wanted, wheres, strict=True):
            if isinstance(where, int):
                codes[(name, index)] = where
            else:
                located[(name, index)] = where
        for name in dict.fromkeys(name for name, _ in located):  # a group's first commit creates it
            try:
                await self._ensure_subscription(name, group)
            except RaytxnError as e:
                codes.update({key: commit_error(e) for key in located if key[0] == name})
        located = {key: where for key, where in located.items() if key not in codes}
        registered = wire.NONE
        if txn_state is not None and located:
            registered = await self.transactions.add_subscriptions(
                txn_state, [(name, index, group) for name, index in located])
        if registered != wire.NONE:
            return {**codes, **dict.fromkeys(located, registered)}
        committed = await asyncio.gather(*(self._commit(name, index, group, where, txn, metadata_of[(name, index)])
                                           for (name, index), where in located.items()))
        return {**codes, **dict(zip(located, committed, strict=True))}

    async def offset_fetch(self, request: Any, version: int) -> dict[str, Any]:
        """Committed offsets of the topics asked for (None, v2+: every topic the group has a
        subscription on), every partition asked at once."""
        group, stable = request.group_id, bool(getattr(request, "require_stable", False))
        error = group_id_error(group)
        wanted: list[tuple[str, list[int]]] = []
        if error == wire.NONE and request.topics is None:
            wanted = [(row["name"], list(range(row["partitions"]))) for row in await self.engine.topics()
                      if group in row["subscriptions"]]
        elif request.topics is not None:
            wanted = [(t.name, list(t.partition_indexes)) for t in request.topics]
        result = OffsetFetchResponse.OffsetFetchResponseTopic
        topics = []
        for name, indexes in wanted:
            answers = await self._fetch_topic(name, indexes, group, stable, error)
            topics.append(result(name=name, partitions=[result.OffsetFetchResponsePartition(
                partition_index=index, committed_offset=offset, committed_leader_epoch=-1, metadata=metadata,
                error_code=code) for index, (offset, metadata, code) in zip(indexes, answers, strict=True)]))
        return {"throttle_time_ms": 0, "topics": topics, "error_code": error}

    async def _fetch_topic(self, name: str, indexes: list[int], group: str, stable: bool,
                           error: int) -> list[tuple[int, str, int]]:
        """``(offset, metadata, error code)`` of each partition of ``indexes`` of topic ``name``."""
        if error != wire.NONE:
            return [(-1, "", error)] * len(indexes)
        codes = await asyncio.gather(*(self._partition_error(name, index) for index in indexes))
        if all(code != wire.NONE for code in codes):
            return [(-1, "", code) for code in codes]
        try:
            subscribed = group in await self.engine.subscriptions(name)
        except RaytxnError as e:
            return [(-1, "", code if code != wire.NONE else commit_error(e)) for code in codes]

        async def fetch(index: int, code: int) -> tuple[int, str, int]:
            if code != wire.NONE or not subscribed:
                return -1, "", code
            try:
                return await self._committed(name, index, group, stable)
            except RaytxnError as e:
                return -1, "", commit_error(e)

        return list(await asyncio.gather(*(fetch(index, code) for index, code in zip(indexes, codes, strict=True))))

    async def _committed(self, topic: str, partition: int, group: str, stable: bool) -> tuple[int, str, int]:
        committed = await self.engine.subscription_call(topic, partition, group, "kafka_committed")
        if stable and committed["pending"]:
            return -1, "", wire.UNSTABLE_OFFSET_COMMIT
        if committed["acked_nothing"]:
            return -1, "", wire.NONE
        offset = await self.engine.partition_call(topic, partition, "kafka_offset_of", committed["position"],
                                                  committed["index"])
        return offset, committed["metadata"], wire.NONE

    # --- deleting offsets ---------------------------------------------------------------------

    async def offset_delete(self, request: Any, version: int) -> dict[str, Any]:
        """OffsetDelete: the group's committed offsets on the partitions named are deleted
        (``kafka_delete_offset``), as Kafka does it: GROUP_ID_NOT_FOUND for a group with neither
        members nor a subscription, NON_EMPTY_GROUP for one with members of another protocol
        type than "consumer"; per partition UNKNOWN_TOPIC_OR_PARTITION, and
        GROUP_SUBSCRIBED_TO_TOPIC on a topic a member consumes (or a raytxn consumer or lease
        reads the subscription). A partition the group never committed on has nothing to delete."""
        group = request.group_id
        error = group_id_error(group)
        consumed: set[str] | None = set()
        if error == wire.NONE:
            active = self.membership.table.groups.get(group)
            if active is not None and active.members:
                consumed = active.consumed_topics()
                if active.protocol_type != "consumer":
                    error = NON_EMPTY_GROUP
            else:
                try:
                    if not any(group in row["subscriptions"] for row in await self.engine.topics()):
                        error = GROUP_ID_NOT_FOUND
                except RaytxnError as e:
                    error = commit_error(e)
        result = OffsetDeleteResponse.OffsetDeleteResponseTopic
        if error != wire.NONE:
            return {"error_code": error, "throttle_time_ms": 0, "topics": []}
        topics = []
        for topic in request.topics:
            indexes = [p.partition_index for p in topic.partitions]
            codes = await self._delete_topic(topic.name, indexes, group, consumed)
            topics.append(result(name=topic.name, partitions=[
                result.OffsetDeleteResponsePartition(partition_index=index, error_code=code)
                for index, code in zip(indexes, codes, strict=True)]))
        return {"error_code": wire.NONE, "throttle_time_ms": 0, "topics": topics}

    async def _delete_topic(self, name: str, indexes: list[int], group: str, consumed: set[str] | None) -> list[int]:
        """The error code of deleting ``group``'s offset on each partition of ``indexes`` of ``name``."""
        codes = await asyncio.gather(*(self._partition_error(name, index) for index in indexes))
        if consumed is None or name in consumed:
            return [code if code != wire.NONE else wire.GROUP_SUBSCRIBED_TO_TOPIC for code in codes]
        if all(code != wire.NONE for code in codes):
            return list(codes)
        try:
            subscribed = group in await self.engine.subscriptions(name)
        except RaytxnError as e:
            return [code if code != wire.NONE else commit_error(e) for code in codes]

        async def delete(index: int, code: int) -> int:
            if code != wire.NONE or not subscribed:
                return code  # (not subscribed: the group has no offsets on the topic to delete)
            try:
                await self.engine.subscription_call(name, index, group, "kafka_delete_offset")
            except NotAllowed:
                return wire.GROUP_SUBSCRIBED_TO_TOPIC  # raytxn consumers or a lease read it
            except RaytxnError as e:
                return commit_error(e)
            return wire.NONE

        return list(await asyncio.gather(*(delete(index, code) for index, code in zip(indexes, codes, strict=True))))

    # --- offsets in transactions -------------------------------------------------------------

    async def add_offsets_to_txn(self, request: Any, version: int) -> dict[str, Any]:
        state = await self.transactions.state_of(request.transactional_id, request.producer_id, request.producer_epoch)
        error = state if isinstance(state, int) else group_id_error(request.group_id)
        if error == wire.NONE and isinstance(state, TxnState):
            error = await self.transactions.add_offsets(state, request.group_id)
        return {"throttle_time_ms": 0, "error_code": error}

    async def txn_offset_commit(self, request: Any, version: int) -> dict[str, Any]:
        """Each partition's offset as a cumulative ack in the transaction, after every partition
        was located and its subscription registered with the transaction's coordinator."""
        group = request.group_id
        state = await self.transactions.state_of(request.transactional_id, request.producer_id, request.producer_epoch)
        error = state if isinstance(state, int) else group_id_error(group)
        txn = None
        if error == wire.NONE and isinstance(state, TxnState):
            found = await self.transactions.offsets_txn_of(state, group)
            txn, error = (None, found) if isinstance(found, int) else (found, wire.NONE)
        if error == wire.NONE and version >= 3:
            error = self.membership.check_txn_commit(group, request.member_id, request.generation_id,
                                                     request.group_instance_id)
        wanted = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata or "")
                  for t in request.topics for p in t.partitions]
        codes = await self._commit_all(group, wanted, error, state if isinstance(state, TxnState) else None, txn)
        result = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
        return {"throttle_time_ms": 0, "topics": [
            result(name=t.name, partitions=[result.TxnOffsetCommitResponsePartition(
                partition_index=p.partition_index, error_code=codes[(t.name, p.partition_index)])
                for p in t.partitions]) for t in request.topics]}
