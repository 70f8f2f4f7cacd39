"""Kafka's transaction admin APIs (KIP-664): ListTransactions, DescribeTransactions and
DescribeProducers, what ``kafka-transactions.sh list|describe|describe-producers|find-hanging``,
kafka-python's ``KafkaAdminClient.list_transactions`` / ``describe_transactions`` /
``describe_producers`` / ``find_hanging_transactions`` and Flink's listing abort strategy call.

Nothing here is this gateway's memory: transactional ids and their last transaction come from
the raytxn coordinators (``describe_transactional_ids``, every coordinator for a listing, the id's
own for a description), producers from the partition actors (``producer_states``), so every
gateway answers the same, also right after a restart.

Kafka's transaction states from raytxn's: OPEN is Ongoing, COMMITTING PrepareCommit, ABORTING
PrepareAbort, a remembered COMMITTED CompleteCommit and ABORTED (by its owner, a timeout or a
fence) CompleteAbort; an id that never began a transaction, or whose last one's outcome is
forgotten, is Empty. Producers: a Kafka producer with an id writes as ``kafka-<id>-<epoch>``
(``mapping``), so its rows carry that id and epoch; a raytxn transaction open on the partition
whose producer is not a Kafka one is shown under the producer id its batches are fetched under
(``mapping.txn_producer_id``), so a native transaction left hanging is found too.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from kafka.protocol.admin.transactions import (
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    ListTransactionsResponse,
)

from raytxn.errors import InvalidArgument, RaytxnError, TopicNotFound
from raytxn.hashing import coordinator_for
from raytxn.kafka import mapping, wire
from raytxn.kafka.transactions import KafkaTransactions, tid_producer_id

TRANSACTIONAL_ID_NOT_FOUND = 105
KAFKA_STATES = {"OPEN": "Ongoing", "COMMITTING": "PrepareCommit", "ABORTING": "PrepareAbort",
                "COMMITTED": "CompleteCommit", "ABORTED": "CompleteAbort", None: "Empty"}
# States Kafka has that raytxn never reports (so a filter naming them is known, and matches nothing).
OTHER_KAFKA_STATES = ("Dead", "PrepareEpochFence")
_PRODUCER_NAME = re.compile(r"^kafka-(\d+)-(\d+)$")
MAX_PATTERN_CHARS = 1000

# ``describe(tc_id, transactional_ids | None)``: that coordinator's rows (``describe_transactional_ids``);
# ``partitions(topic)``: the count (TopicNotFound if none); ``partition_call(topic, p, method, *args)``.
Describe = Callable[[int, list[str] | None], Awaitable[list[dict[str, Any]]]]
Partitions = Callable[[str], Awaitable[int]]
PartitionCall = Callable[..., Awaitable[Any]]


def kafka_state(row: dict[str, Any]) -> str:
    return KAFKA_STATES.get(row["state"], "Empty")


class TransactionAdmin:
    def __init__(self, num_coordinators: int, describe: Describe, partitions: Partitions,
                 partition_call: PartitionCall, transactions: KafkaTransactions,
                 now_ms: Callable[[], int]) -> None:
        self.num_coordinators, self._describe = num_coordinators, describe
        self._partitions, self._partition_call = partitions, partition_call
        self.transactions, self._now_ms = transactions, now_ms

    # --- ListTransactions ----------------------------------------------------------------------

    async def list_transactions(self, request: Any, version: int) -> dict[str, Any]:
        """Every transactional id of every coordinator, filtered by state (unknown state names
        come back in ``unknown_state_filters``, as from Kafka), producer id, from v1 how long
        the transaction has run (``duration_filter`` ms, -1: any) and from v2 a regular
        expression the id must match in full (INVALID_REQUEST for one that does not compile)."""
        known = set(KAFKA_STATES.values()) | set(OTHER_KAFKA_STATES)
        states = set(request.state_filters or ())
        producer_ids = set(request.producer_id_filters or ())
        duration = request.duration_filter if version >= 1 else -1
        pattern = None
        if version >= 2 and request.transactional_id_pattern:
            try:
                if len(request.transactional_id_pattern) > MAX_PATTERN_CHARS:
                    raise re.error("pattern too long")
                pattern = re.compile(request.transactional_id_pattern)
            except re.error:
                return _listed(wire.INVALID_REQUEST, [], [])
        try:
            rows = [row for rows in await asyncio.gather(*(self._describe(tc, None)
                                                           for tc in range(self.num_coordinators)))
                    for row in rows]
        except RaytxnError as e:
            return _listed(mapping.error_code(e), [], [])
        now = self._now_ms()
        found = []
        for row in rows:
            tid, state = row["transactional_id"], kafka_state(row)
            if (states and state not in states) or (producer_ids and tid_producer_id(tid) not in producer_ids):
                continue
            if duration is not None and duration >= 0 and (row["start_ms"] is None or state not in (
                    "Ongoing", "PrepareCommit", "PrepareAbort") or now - row["start_ms"] < duration):
                continue
            if pattern is not None and not pattern.fullmatch(tid):
                continue
            found.append(ListTransactionsResponse.TransactionState(
                transactional_id=tid, producer_id=tid_producer_id(tid), transaction_state=state))
        return _listed(wire.NONE, sorted(states - known), found)

    # --- DescribeTransactions ------------------------------------------------------------------

    async def describe_transactions(self, request: Any, version: int) -> dict[str, Any]:
        """Each id's state, timeout, start time, producer id and epoch and the partitions of its
        live transaction, asked of the id's coordinator; TRANSACTIONAL_ID_NOT_FOUND for an id
        never registered. The timeout of an id without a live transaction is the one this
        gateway saw in its InitProducerId, else -1 (raytxn keeps a timeout per transaction)."""
        by_home: dict[int, list[str]] = {}
        for tid in dict.fromkeys(request.transactional_ids):
            by_home.setdefault(coordinator_for(tid, self.num_coordinators), []).append(tid)
        answers: dict[str, Any] = {}

        async def ask(tc_id: int, tids: list[str]) -> None:
            try:
                rows = {row["transactional_id"]: row for row in await self._describe(tc_id, tids)}
            except RaytxnError as e:
                answers.update({tid: _described(tid, mapping.error_code(e)) for tid in tids})
                return
            for tid in tids:
                answers[tid] = self._description(tid, rows.get(tid))

        await asyncio.gather(*(ask(tc, tids) for tc, tids in by_home.items()))
        return {"throttle_time_ms": 0,
                "transaction_states": [answers[tid] for tid in dict.fromkeys(request.transactional_ids)]}

    def _description(self, tid: str, row: dict[str, Any] | None) -> Any:
        if row is None or row["epoch"] is None:
            return _described(tid, TRANSACTIONAL_ID_NOT_FOUND)
        state = kafka_state(row)
        live = state in ("Ongoing", "PrepareCommit", "PrepareAbort")
        timeout = row["timeout_ms"]
        if timeout is None:
            cached = self.transactions.cached(tid)
            timeout = cached.timeout_ms if cached is not None and cached.timeout_ms is not None else -1
        topics: dict[str, list[int]] = {}
        for topic, partition in row["partitions"] if live else ():
            topics.setdefault(topic, []).append(partition)
        data = DescribeTransactionsResponse.TransactionState.TopicData
        return DescribeTransactionsResponse.TransactionState(
            error_code=wire.NONE, transactional_id=tid, transaction_state=state, transaction_timeout_ms=timeout,
            transaction_start_time_ms=row["start_ms"] if live and row["start_ms"] is not None else -1,
            producer_id=tid_producer_id(tid), producer_epoch=row["epoch"],
            topics=[data(topic=t, partitions=ps) for t, ps in topics.items()])

    # --- DescribeProducers ---------------------------------------------------------------------

    async def describe_producers(self, request: Any, version: int) -> dict[str, Any]:
        """Per partition asked, its active Kafka producers (see the module docstring)."""
        result = DescribeProducersResponse.TopicResponse
        wanted = [(t.name, p) for t in request.topics for p in t.partition_indexes]
        answers = await asyncio.gather(*(self._producers(name, p) for name, p in wanted))
        by_key = dict(zip(wanted, answers, strict=True))
        return {"throttle_time_ms": 0, "topics": [
            result(name=t.name, partitions=[by_key[(t.name, p)] for p in t.partition_indexes])
            for t in request.topics]}

    async def _producers(self, topic: str, partition: int) -> Any:
        answer = DescribeProducersResponse.TopicResponse.PartitionResponse
        try:
            count = await self._partitions(topic)
            if not 0 <= partition < count:
                return answer(partition_index=partition, error_code=wire.UNKNOWN_TOPIC_OR_PARTITION,
                              error_message=None, active_producers=[])
            rows = await self._partition_call(topic, partition, "producer_states")
        except (TopicNotFound, InvalidArgument, RaytxnError) as e:
            return answer(partition_index=partition, error_code=mapping.error_code(e), error_message=str(e),
                          active_producers=[])
        return answer(partition_index=partition, error_code=wire.NONE, error_message=None,
                      active_producers=producer_rows(rows))


def producer_rows(rows: list[dict[str, Any]]) -> list[Any]:
    """DescribeProducers' rows of one partition from its ``producer_states``: one per Kafka
    producer id (its latest epoch), and one per open raytxn transaction of a non-Kafka producer."""
    state = DescribeProducersResponse.TopicResponse.PartitionResponse.ProducerState
    by_id: dict[int, Any] = {}
    for row in rows:
        named = _PRODUCER_NAME.match(row["producer"])
        if named is not None:
            producer_id, epoch = int(named.group(1)), int(named.group(2))
        elif row["txn"] is not None:
            producer_id, epoch = mapping.txn_producer_id(row["txn"]), 0
        else:
            continue  # a native producer or a Kafka producer without id: no Kafka producer id
        start = row["txn_start_offset"] if row["txn"] is not None and row["txn_start_offset"] is not None else -1
        known = by_id.get(producer_id)
        if known is not None and known.producer_epoch > epoch:
            continue
        by_id[producer_id] = state(producer_id=producer_id, producer_epoch=epoch, last_sequence=row["last_sequence"],
                                   last_timestamp=row["last_timestamp_ms"], coordinator_epoch=-1,
                                   current_txn_start_offset=start)
    return list(by_id.values())


def _listed(error: int, unknown: list[str], found: list[Any]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": error, "unknown_state_filters": unknown,
            "transaction_states": found}


def _described(tid: str, error: int) -> Any:
    return DescribeTransactionsResponse.TransactionState(
        error_code=error, transactional_id=tid, transaction_state="", transaction_timeout_ms=-1,
        transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])
