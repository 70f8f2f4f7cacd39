"""The Kafka APIs on raytxn: one handler per API, each taking the decoded request and returning
the response's fields (``wire`` encodes them). Partitions are called through their actors, so a
gateway holds no partition state: any number of gateways serve the same topics.

This gateway is one Kafka node (id 0) that leads every partition, coordinates every Kafka
transaction (``transactions``) and every consumer group (``group_membership``, ``group_offsets``);
Metadata and FindCoordinator say so, and clients send it everything.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import AddPartitionsToTxnResponse, ProduceResponse

from raytxn.errors import InvalidArgument, RaytxnError, TopicNotFound
from raytxn.kafka import codecs, mapping, wire
from raytxn.kafka.idle_partitions import IdlePartitions
from raytxn.kafka.peers import PeerView
from raytxn.kafka.records import EncodedBatches, decode_batches, encode_compacted_run
from raytxn.kafka.transactions import INVALID_TXN_STATE, KafkaTransactions, TxnState
from raytxn.protocol.packed_records import PackedRecords

log = logging.getLogger(__name__)
CLUSTER_ID = "raytxn"
EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP = -2, -1, -3  # -3: of v7 (KIP-734)
TOPIC_CACHE_S = 2.0
FETCH_ENTRIES = 500
MAX_FETCH_WAITS = 100  # a fetch waiting for min_bytes re-reads at most this often before answering

# How the broker reaches raytxn: ``topic_partitions(name)`` (TopicNotFound if none),
# ``call(topic, partition, method, *args)`` on a partition actor, ``topics()`` all topic names.
TopicPartitions = Callable[[str], Awaitable[int]]
PartitionCall = Callable[..., Awaitable[Any]]
TopicNames = Callable[[], Awaitable[list[str]]]


class _Unserved(Exception):
    """A ListOffsets time the gateway does not serve."""


@dataclass
class Connection:
    """Per-connection state: the raytxn producer a Kafka producer without id writes as."""

    anonymous_producer: str
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)
    client_host: str = ""  # "/address" of the client, as Kafka's group descriptions show it


def _stored_bytes(reads: list[dict[str, Any]]) -> int:
    """The stored bytes of the entries read: what a fetch's ``min_bytes`` is held against (the
    record batches built from them are within a few bytes a record of it)."""
    return sum(len(records.data) if isinstance(records, PackedRecords) else sum(map(len, records))
               for read in reads for _, records in read.get("entries", ()))


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1  # keys: the codec names and error names (bounded sets)


class Broker:
    def __init__(self, peers: PeerView, topic_partitions: TopicPartitions, call: PartitionCall,
                 topics: TopicNames, transactions: KafkaTransactions, watch_idle: bool = True) -> None:
        """``watch_idle``: answer fetches of partitions known to be idle without reading them
        (``idle_partitions``); only with the engine's authentication off, as a read is where the
        connection's right to consume is checked."""
        self.peers, self.transactions = peers, transactions  # this gateway and the others of its group
        self._topic_partitions, self._call, self._topics = topic_partitions, call, topics
        self._cache: dict[str, tuple[float, int]] = {}
        self._connections = itertools.count()
        self.gateway_id = secrets.token_hex(6)
        # Produce batches by codec ("gzip": n) and refused partitions by error ("CORRUPT_MESSAGE": n).
        self.batch_stats: dict[str, dict[str, int]] = {"codecs": {}, "refused": {}}
        self.encoded = EncodedBatches()  # fetched entries' record batches, shared by every connection
        self.idle = IdlePartitions(call) if watch_idle else None

    def connection(self) -> Connection:
        return Connection(f"kafka-anon-{self.gateway_id}-{next(self._connections)}")

    async def partitions(self, kafka_topic: str) -> int:
        """Partition count of the raytxn topic for ``kafka_topic`` (cached briefly)."""
        topic = mapping.raytxn_topic(kafka_topic)
        now = time.monotonic()
        cached = self._cache.get(topic)
        if cached is not None and now - cached[0] < TOPIC_CACHE_S:
            return cached[1]
        count = await self._topic_partitions(topic)
        self._cache[topic] = (now, count)
        return count

    def forget(self, kafka_topic: str) -> None:
        """Drop the cached partition count and ends (the topic was created or deleted here)."""
        self._cache.pop(kafka_topic, None)
        if self.idle is not None:
            self.idle.forget(kafka_topic)

    async def _partition_error(self, kafka_topic: str, partition: int) -> int:
        """NONE when the partition exists, else the Kafka error code saying why not."""
        try:
            count = await self.partitions(kafka_topic)
        except (TopicNotFound, InvalidArgument) as e:
            return mapping.error_code(e)
        return wire.NONE if 0 <= partition < count else wire.UNKNOWN_TOPIC_OR_PARTITION

    # --- metadata ------------------------------------------------------------------------------

    async def metadata(self, request: Any, version: int) -> dict[str, Any]:
        names = None if request.topics is None else [t.name for t in request.topics]
        if names is None or (version == 0 and not names):
            names = await self._topics()
        client_id = request.header.client_id
        topics = []
        for name in names:
            try:
                count, error = await self.partitions(name), wire.NONE
            except (TopicNotFound, InvalidArgument) as e:
                count, error = 0, mapping.error_code(e)
            partitions = [MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                error_code=wire.NONE, partition_index=p, leader_id=leader, leader_epoch=0,
                replica_nodes=[leader], isr_nodes=[leader], offline_replicas=[])
                for p, leader in enumerate(self.peers.leaders(client_id, name, count))]
            topics.append(MetadataResponse.MetadataResponseTopic(error_code=error, name=name, is_internal=False,
                                                                 partitions=partitions))
        brokers = [MetadataResponse.MetadataResponseBroker(node_id=p.node_id, host=p.host, port=p.port, rack=p.zone)
                   for p in self.peers.listed()]  # the dead too, a while: peers.DEPARTED_LISTED_S
        return {"throttle_time_ms": 0, "brokers": brokers, "cluster_id": CLUSTER_ID,
                "controller_id": self.peers.me.node_id, "topics": topics}

    async def find_coordinator(self, request: Any, version: int) -> dict[str, Any]:
        """The gateway of the peer group that coordinates each key (``peers``: the one the
        group's membership lives in; for a transactional id, which any gateway serves, the same
        spread), for consumer groups (key type 0) and transactions (key type 1)."""
        keys = request.coordinator_keys or [request.key]
        coordinators = []
        for key in keys:
            if getattr(request, "key_type", 0) in (0, 1):
                peer = self.peers.coordinator(key)
                error, message, node, host, port = wire.NONE, None, peer.node_id, peer.host, peer.port
            else:
                error, message = wire.INVALID_REQUEST, f"coordinator key type {request.key_type} is not served"
                node, host, port = -1, "", -1
            coordinators.append(FindCoordinatorResponse.Coordinator(key=key, node_id=node, host=host, port=port,
                                                                    error_code=error, error_message=message))
        first = coordinators[0]
        return {"throttle_time_ms": 0, "error_code": first.error_code, "error_message": first.error_message,
                "node_id": first.node_id, "host": first.host, "port": first.port, "coordinators": coordinators}

    async def init_producer_id(self, request: Any, version: int) -> dict[str, Any]:
        if request.transactional_id is not None:
            error, producer_id, epoch = await self.transactions.init_producer_id(
                request.transactional_id, request.transaction_timeout_ms)
            return {"throttle_time_ms": 0, "error_code": error, "producer_id": producer_id,
                    "producer_epoch": epoch}
        given = getattr(request, "producer_id", -1)
        if given is not None and given >= 0:  # KIP-360: the producer asks for its next epoch
            return {"throttle_time_ms": 0, "error_code": wire.NONE, "producer_id": given,
                    "producer_epoch": request.producer_epoch + 1}
        return {"throttle_time_ms": 0, "error_code": wire.NONE, "producer_id": secrets.randbelow(1 << 61),
                "producer_epoch": 0}

    async def add_partitions_to_txn(self, request: Any, version: int) -> dict[str, Any]:
        topics = request.v3_and_below_topics
        state = await self.transactions.state_of(request.v3_and_below_transactional_id,
                                                 request.v3_and_below_producer_id, request.v3_and_below_producer_epoch)
        error = state if not isinstance(state, TxnState) else wire.NONE
        wanted = [(topic.name, p) for topic in topics for p in topic.partitions]
        for name, p in wanted:  # every partition exists, or none is added
            if error == wire.NONE:
                error = await self._partition_error(name, p)
        if error == wire.NONE and isinstance(state, TxnState):
            error = await self.transactions.add_partitions(state, wanted)
        result = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
            result(name=t.name, results_by_partition=[result.AddPartitionsToTxnPartitionResult(
                partition_index=p, partition_error_code=error) for p in t.partitions]) for t in topics]}

    async def end_txn(self, request: Any, version: int) -> dict[str, Any]:
        state = await self.transactions.state_of(request.transactional_id, request.producer_id, request.producer_epoch)
        error = await self.transactions.end(state, request.committed) if isinstance(state, TxnState) else state
        return {"throttle_time_ms": 0, "error_code": error}

    # --- offsets -------------------------------------------------------------------------------

    async def list_offsets(self, request: Any, version: int) -> dict[str, Any]:
        committed = getattr(request, "isolation_level", 0) == 1
        topics = []
        for topic in request.topics:
            partitions = []
            for part in topic.partitions:
                offset, timestamp = -1, -1
                error = await self._partition_error(topic.name, part.partition_index)
                if error == wire.NONE:
                    try:
                        offset, timestamp = await self._offset_for(topic.name, part.partition_index,
                                                                   part.timestamp, committed, version)
                    except RaytxnError as e:
                        error = mapping.error_code(e)
                    except _Unserved:
                        error = wire.UNSUPPORTED_FOR_MESSAGE_FORMAT
                partitions.append(ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                    partition_index=part.partition_index, error_code=error, timestamp=timestamp, offset=offset,
                    leader_epoch=0))
            topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
        return {"throttle_time_ms": 0, "topics": topics}

    async def _offset_for(self, topic: str, partition: int, timestamp: int, committed: bool,
                          version: int) -> tuple[int, int]:
        """(offset, timestamp) for one ListOffsets partition: the log start (-2), the end (-1:
        the last stable offset for read_committed, else the high watermark), the first message
        at or after a time (>= 0), or from v7 the message with the largest timestamp (-3,
        KIP-734), of those below that end; offset and timestamp -1 when there is none, as in
        Kafka. ``_Unserved`` for the other special times (-4 and -5, of tiered storage)."""
        if timestamp >= 0:
            found = await self._call(topic, partition, "kafka_offset_for_time", timestamp, committed)
            return (-1, -1) if found is None else (found[0], found[1])
        if timestamp == MAX_TIMESTAMP and version >= 7:
            found = await self._call(topic, partition, "kafka_offset_of_max_time", committed)
            return (-1, -1) if found is None else (found[0], found[1])
        if timestamp not in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
            raise _Unserved(timestamp)
        marks = await self._call(topic, partition, "kafka_offsets")
        if timestamp == EARLIEST_TIMESTAMP:
            return marks["log_start"], -1
        return marks["last_stable" if committed else "high_watermark"], -1

    # --- produce -------------------------------------------------------------------------------

    async def produce(self, request: Any, version: int, conn: Connection) -> dict[str, Any] | None:
        """None for acks=0: Kafka sends no response then."""
        results = []
        for topic in request.topic_data:
            partitions = []
            for data in topic.partition_data:
                error, base_offset, message = await self._produce_partition(request, topic.name, data, conn)
                partitions.append(ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                    index=data.index, error_code=error, base_offset=base_offset, log_append_time_ms=-1,
                    log_start_offset=-1, record_errors=[], error_message=message))
            results.append(ProduceResponse.TopicProduceResponse(name=topic.name, partition_responses=partitions))
        if request.acks == 0:
            return None
        return {"responses": results, "throttle_time_ms": 0}

    async def _produce_partition(self, request: Any, topic: str, data: Any,
                                 conn: Connection) -> tuple[int, int, str | None]:
        if request.acks not in (0, 1, -1):
            return wire.INVALID_REQUIRED_ACKS, -1, f"acks={request.acks}: use 0, 1 or -1"
        error = await self._partition_error(topic, data.index)
        if error != wire.NONE:
            return error, -1, None
        try:
            batches = decode_batches(data.records)  # all or none: a bad batch appends nothing
            for batch in batches:
                _count(self.batch_stats["codecs"], codecs.name(batch.codec))
            base_offset = -1
            for batch in batches:
                txn = None
                if batch.transactional:
                    state = await self.transactions.state_of(request.transactional_id, batch.producer_id,
                                                             batch.producer_epoch)
                    if not isinstance(state, TxnState):
                        return state, -1, "not the current producer of its transactional id"
                    txn = self.transactions.txn_for(state, topic, data.index)
                    if txn is None:
                        return INVALID_TXN_STATE, -1, "partition not added to the transaction"
                result = await self._append(topic, data.index, batch, conn, txn)
                if base_offset < 0 and result.base_offset is not None:
                    base_offset = result.base_offset
            return wire.NONE, base_offset, None
        except RaytxnError as e:
            log.info("produce to %s-%d refused: %r", topic, data.index, e)
            code = mapping.error_code(e)
            _count(self.batch_stats["refused"], wire.ERROR_NAMES.get(code, str(code)))
            return code, -1, str(e)

    async def _append(self, topic: str, partition: int, batch: Any, conn: Connection, txn: Any) -> Any:
        messages = batch.records
        if batch.producer_id >= 0:  # idempotent: Kafka's sequence numbers are raytxn's
            first = batch.base_sequence
            if first < 0:
                raise InvalidArgument(f"producer {batch.producer_id} sent a batch without a sequence")
            producer, previous = mapping.producer_name(batch.producer_id, batch.producer_epoch), first - 1
        else:
            producer = conn.anonymous_producer
            first = conn.sequences.get((topic, partition), 0)
            previous = -1
        result = await self._call(topic, partition, "append", producer, first, messages, txn, previous)
        if batch.producer_id < 0:
            conn.sequences[(topic, partition)] = first + len(messages)
        return result

    # --- fetch ---------------------------------------------------------------------------------

    async def fetch(self, request: Any, version: int) -> dict[str, Any]:
        """Kafka's wait rule: answer once the partitions hold ``min_bytes`` (at least 1 byte: an
        empty fetch waits, a ready one returns at once) or ``max_wait_ms`` passed."""
        committed = request.isolation_level == 1
        wanted = [(t.topic, p) for t in request.topics for p in t.partitions]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        min_bytes = max(getattr(request, "min_bytes", 1), 1)
        reads = await self._fetch_all(wanted, committed, 0.0)
        for _ in range(MAX_FETCH_WAITS):  # bounded: each turn waits for new data or the deadline
            left = deadline - loop.time()
            if left <= 0 or _stored_bytes(reads) >= min_bytes:
                break
            if not await self._data_arrived(wanted, reads, committed, left):
                break
            reads = await self._fetch_all(wanted, committed, 0.0)
        by_topic: dict[str, list[Any]] = {}
        for (topic, part), read in zip(wanted, reads, strict=True):
            by_topic.setdefault(topic, []).append(self._partition_data(topic, part, read, committed))
        responses = [FetchResponse.FetchableTopicResponse(topic=t, partitions=ps) for t, ps in by_topic.items()]
        return {"throttle_time_ms": 0, "error_code": wire.NONE, "session_id": 0, "responses": responses}

    async def _data_arrived(self, wanted: list[tuple[str, Any]], reads: list[dict[str, Any]], committed: bool,
                            wait_s: float) -> bool:
        """Wait up to ``wait_s`` for any readable partition to hold more than it did at ``reads``
        (a read at its end offset waits for the end to move; a partition watched as idle, on its
        watch); False if none did."""
        waits, calls = [], 0
        for (topic, part), read in zip(wanted, reads, strict=True):
            if "error" in read or read["out_of_range"]:
                continue
            end = read["last_stable"] if committed else read["high_watermark"]
            moved = None if self.idle is None else self.idle.moved(topic, part.partition, end, committed)
            if moved is None:
                moved = asyncio.ensure_future(self._call(topic, part.partition, "kafka_read", end, 1, committed,
                                                         wait_s))
                calls += 1
            waits.append(moved)
        if not waits:
            return False
        # A call answers by itself once ``wait_s`` passed (the margin is for its way back); a
        # watch's future is done only when the end moves, so with none but those, ``wait_s`` it is.
        done, pending = await asyncio.wait(waits, timeout=wait_s + (1 if calls else 0),
                                           return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()
        return any(not w.cancelled() and w.exception() is None and (w.result() is True or w.result()["entries"])
                   for w in done)

    async def _fetch_all(self, wanted: list[tuple[str, Any]], committed: bool, wait_s: float) -> list[dict]:
        return list(await asyncio.gather(*(self._read(t, p, committed, wait_s) for t, p in wanted)))

    async def _read(self, topic: str, part: Any, committed: bool, wait_s: float) -> dict[str, Any]:
        error = await self._partition_error(topic, part.partition)
        if error != wire.NONE:
            return {"error": error}
        read = None if self.idle is None else self.idle.answer(topic, part.partition, part.fetch_offset, committed)
        if read is None:
            try:
                read = await self._call(topic, part.partition, "kafka_read", part.fetch_offset, FETCH_ENTRIES,
                                        committed, wait_s, max(1, part.partition_max_bytes))
            except RaytxnError as e:
                return {"error": mapping.error_code(e)}
            if self.idle is not None:
                self.idle.learn(topic, part.partition, part.fetch_offset, committed, read)
        read["max_bytes"] = part.partition_max_bytes
        return read

    def _partition_data(self, topic: str, part: Any, read: dict[str, Any], committed: bool) -> Any:
        data = FetchResponse.FetchableTopicResponse.PartitionData
        if "error" in read or read["out_of_range"]:
            error = read.get("error", wire.OFFSET_OUT_OF_RANGE)
            return data(partition_index=part.partition, error_code=error, high_watermark=-1,
                        last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                        preferred_read_replica=-1, records=b"")
        encoded = itertools.chain(  # lazily: encoding stops at max_bytes
            (encode_compacted_run(run) for run in read.get("compacted", ())),  # below a compacted live ledger
            (self.encoded.batch(topic, part.partition, base, entry) for base, entry in read["entries"]))
        batches, size = [], 0
        for batch in encoded:
            if batches and size + len(batch) > read["max_bytes"]:
                break
            batches.append(batch)
            size += len(batch)
        aborted = None
        if committed:
            aborted = [data.AbortedTransaction(producer_id=mapping.txn_producer_id(txn), first_offset=first)
                       for txn, first in read["aborted"]]
        return data(partition_index=part.partition, error_code=wire.NONE, high_watermark=read["high_watermark"],
                    last_stable_offset=read["last_stable"], log_start_offset=read["log_start"],
                    aborted_transactions=aborted, preferred_read_replica=-1, records=b"".join(batches))
