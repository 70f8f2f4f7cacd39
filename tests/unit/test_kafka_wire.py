"""The Kafka gateway's pure layers (no Ray): the served-versions table and its ApiVersions
answer, request decoding and refusals, record batches to and from raytxn entries, and the
name/id/error mapping. Encodings are checked by decoding with kafka-python's own classes."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from raytxn.errors import (
    ActorUnavailable,
    InvalidArgument,
    InvalidTopicName,
    MessageTooLarge,
    OutOfOrderSequence,
    TopicNotFound,
)
from raytxn.ids import TxnID
from raytxn.kafka import mapping, wire
from raytxn.kafka.records import decode_batches, encode_entry
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, marker_header
from raytxn.protocol.entry_format import encode_entry as raytxn_entry
from raytxn.protocol.txnlog import EndAction

T = TxnID(1, 7)


def framed_payload(frame: bytes) -> bytes:
    assert wire.frame_size(frame[:4]) == len(frame) - 4
    return frame[4:]


def test_api_versions_lists_what_is_served() -> None:
    header = wire.RequestHeader(wire.API_VERSIONS, 3, 41)
    payload = framed_payload(wire.api_versions(header))
    response = ApiVersionsResponse[3].decode(payload, header=True)
    assert response.header.correlation_id == 41 and response.error_code == wire.NONE
    assert {(k.api_key, k.min_version, k.max_version) for k in response.api_keys} == {
        (a.key, 0 if a.key == 0 else a.min_version, a.max_version) for a in wire.SERVED.values()}


def test_produce_is_advertised_from_v0_and_v0_to_v2_are_refused() -> None:
    """KAFKA-18659: librdkafka before 2.8 compresses only when Produce v0 is advertised, so it is,
    as Kafka 4.0 does; v0-v2 (message sets of magic 0/1) are still refused when sent."""
    payload = framed_payload(wire.api_versions(wire.RequestHeader(wire.API_VERSIONS, 3, 1)))
    produce = [k for k in ApiVersionsResponse[3].decode(payload, header=True).api_keys if k.api_key == 0]
    assert [(k.min_version, k.max_version) for k in produce] == [(0, wire.SERVED[0].max_version)]
    for version in (0, 1, 2):
        with pytest.raises(wire.Unsupported, match=f"v{version} is not served"):
            wire.decode_request(wire.RequestHeader(0, version, 1), b"")


def test_api_versions_past_the_served_ones_is_unsupported_in_v0() -> None:
    payload = framed_payload(wire.api_versions(wire.RequestHeader(wire.API_VERSIONS, 9, 5)))
    response = ApiVersionsResponse[0].decode(payload, header=True)
    assert response.error_code == wire.UNSUPPORTED_VERSION and len(response.api_keys) == len(wire.SERVED)


def test_requests_decode_and_unserved_ones_are_refused() -> None:
    request = MetadataRequest[4](topics=[MetadataRequest.MetadataRequestTopic(name="orders")],
                                 allow_auto_topic_creation=False)
    request.with_header(correlation_id=9, client_id="c")
    payload = framed_payload(bytes(request.encode(header=True, framed=True)))
    header = wire.peek_header(payload)
    assert (header.api_key, header.api_version, header.correlation_id) == (3, 4, 9)
    assert [t.name for t in wire.decode_request(header, payload).topics] == ["orders"]
    with pytest.raises(wire.Unsupported, match="API key 37"):
        wire.decode_request(wire.RequestHeader(37, 0, 1), payload)  # CreatePartitions
    with pytest.raises(wire.Unsupported, match="v1 is not served"):
        wire.decode_request(wire.RequestHeader(19, 1, 1), payload)  # CreateTopics below Kafka 4's floor
    with pytest.raises(wire.Unsupported, match="v9 is not served"):
        wire.decode_request(wire.RequestHeader(8, 9, 1), payload)  # OffsetCommit v9 (KIP-848's)
    with pytest.raises(wire.Unsupported, match="v13 is not served"):
        wire.decode_request(wire.RequestHeader(FetchRequest.API_KEY, 13, 1), payload)
    with pytest.raises(InvalidArgument):
        wire.frame_size(struct.pack(">i", wire.MAX_FRAME_BYTES + 1))
    with pytest.raises(InvalidArgument):
        wire.peek_header(b"\x00\x01")


def read_batch(data: bytes) -> DefaultRecordBatch:
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc() and batch.size_in_bytes == len(data)
    return batch


def test_a_plain_entry_is_a_batch_at_its_base_offset() -> None:
    header = EntryHeader("data", None, "p", 0, 1, 2, 1000)
    records = raytxn_entry(header, [MessageRecord(b"a", "k", {"h": "v"}, 5), MessageRecord(b"b")])
    _, data = encode_entry(40, records)
    batch = read_batch(data)
    assert (batch.base_offset, batch.is_transactional, batch.is_control_batch, batch.producer_id) == (40, False,
                                                                                                        False, -1)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    assert got == [(40, 5, b"k", b"a", [("h", b"v")]), (41, 1000, None, b"b", [])]


def test_txn_data_and_its_marker_share_the_txns_producer_id() -> None:
    records = raytxn_entry(EntryHeader("data", T, "p", 0, 0, 1, 1), [MessageRecord(b"x")])
    data = read_batch(encode_entry(3, records)[1])
    assert data.is_transactional and data.producer_id == mapping.txn_producer_id(T)
    for action, commit in ((EndAction.COMMIT, True), (EndAction.ABORT, False)):
        marker = read_batch(encode_entry(4, raytxn_entry(marker_header(action, T, 2)))[1])
        assert marker.is_control_batch and marker.is_transactional and marker.producer_id == data.producer_id
        (control,) = list(marker)
        assert control.offset == 4 and control.commit is commit


def produced(key: bytes | None, headers: list, producer_id: int = -1, control: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, 0 if producer_id >= 0 else -1,
                                        3 if producer_id >= 0 else -1, 1 << 20)
    builder.append(0, 77, key, b"v0", headers)
    builder.append(1, 78, None, None, [])
    data = builder.build()
    if control:
        struct.pack_into(">h", data, DefaultRecordBatch.ATTRIBUTES_OFFSET, DefaultRecordBatch.CONTROL_MASK)
        struct.pack_into(">I", data, DefaultRecordBatch.CRC_OFFSET,
                         calc_crc32c(memoryview(data)[DefaultRecordBatch.ATTRIBUTES_OFFSET:]))
    return bytes(data)


def test_produced_batches_become_raytxn_messages() -> None:
    (batch,) = decode_batches(produced(b"key", [("h", b"v")], producer_id=12))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.transactional) == (12, 0, 3, False)
    assert batch.messages == [MessageRecord(b"v0", "key", {"h": "v"}, 77), MessageRecord(b"", None, {}, 78)]
    two = decode_batches(produced(None, []) + produced(None, []))
    assert len(two) == 2


def test_produced_batches_raytxn_cannot_hold_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="UTF-8"):
        decode_batches(produced(b"\xff", []))
    with pytest.raises(InvalidArgument, match="UTF-8"):
        decode_batches(produced(None, [("h", b"\xfe")]))
    with pytest.raises(InvalidArgument, match="control"):
        decode_batches(produced(None, [], control=True))
    damaged = bytearray(produced(None, []))
    damaged[-1] ^= 1
    with pytest.raises(InvalidArgument, match="CRC"):
        decode_batches(bytes(damaged))
    with pytest.raises(InvalidArgument, match="truncated"):
        decode_batches(b"\x00" * 10)


def test_topic_names_producer_ids_and_error_codes() -> None:
    assert mapping.raytxn_topic("orders.v1-eu_2") == "orders.v1-eu_2"
    for bad in ("__consumer_offsets", "a" * 201, "a..b", "", "a b", None):
        with pytest.raises(InvalidTopicName):
            mapping.raytxn_topic(bad)
    ids = {mapping.txn_producer_id(TxnID(tc, seq)) for tc in range(3) for seq in range(100)}
    assert len(ids) == 300 and all(1 << 62 <= i < 1 << 63 for i in ids)
    assert mapping.producer_name(5, 2) == "kafka-5-2"
    assert [mapping.error_code(e) for e in (TopicNotFound("t"), InvalidTopicName("t"), MessageTooLarge("m"),
                                            OutOfOrderSequence("o"), InvalidArgument("i"), ActorUnavailable("a"),
                                            RuntimeError("r"))] == [
        wire.UNKNOWN_TOPIC_OR_PARTITION, wire.INVALID_TOPIC_EXCEPTION, wire.MESSAGE_TOO_LARGE,
        wire.OUT_OF_ORDER_SEQUENCE_NUMBER, wire.INVALID_RECORD, wire.NOT_ENOUGH_REPLICAS, wire.UNKNOWN_SERVER_ERROR]


def test_transactional_ids_have_stable_producer_ids_apart_from_the_others() -> None:
    from raytxn.kafka.transactions import tid_producer_id

    ids = {tid_producer_id(f"tx-{i}") for i in range(500)}
    assert len(ids) == 500 and all(1 << 61 <= i < 1 << 62 for i in ids)
    assert tid_producer_id("orders") == tid_producer_id("orders")


def test_calls_under_an_unknown_id_or_an_old_epoch_are_refused() -> None:
    import asyncio

    from raytxn.kafka.transactions import INVALID_PRODUCER_ID_MAPPING, KafkaTransactions, TxnState

    async def register(tid: str, method: str, *args: object) -> object:
        if method == "describe_transactional_id":  # EndTxn asks what the coordinator has open: nothing
            return {"epoch": 4, "txn": None, "owner": None, "timeout_ms": None, "partitions": [],
                    "subscriptions": [], "last_txn": None, "last_owner": None, "last_outcome": None}
        assert method == "register_transactional_id"
        return 4

    async def never(*args: object) -> None:
        raise AssertionError("no call expected")

    txns = KafkaTransactions("gw", register, never)
    error, producer_id, epoch = asyncio.run(txns.init_producer_id("tx", 1000))
    assert (error, epoch) == (wire.NONE, 4)
    assert isinstance(txns.state("tx", producer_id, 4), TxnState)
    assert txns.state("tx", producer_id, 3) == wire.INVALID_PRODUCER_EPOCH
    assert txns.state("other", producer_id, 4) == INVALID_PRODUCER_ID_MAPPING
    assert txns.state("tx", producer_id + 1, 4) == INVALID_PRODUCER_ID_MAPPING
    state = txns.state("tx", producer_id, 4)
    assert isinstance(state, TxnState) and txns.txn_for(state, "t", 0) is None  # nothing added
    assert asyncio.run(txns.end(state, commit=True)) == wire.NONE  # nothing to end


def test_a_gateway_that_forgot_an_id_takes_it_up_from_its_coordinator() -> None:
    """``state_of`` for an id this gateway does not know: the coordinator's description gives the
    epoch and the open txn (with its owner and participants); an old epoch, an id the
    coordinator does not know, and a producer id not the id's are refused as before."""
    import asyncio

    from raytxn.ids import TxnID
    from raytxn.kafka.transactions import INVALID_PRODUCER_ID_MAPPING, KafkaTransactions, tid_producer_id

    txn = TxnID(1, 7)
    described = {"tx": {"epoch": 3, "txn": txn, "owner": "old-gateway", "timeout_ms": 9000,
                        "partitions": [("t", 0)], "subscriptions": [("s", 1, "g")]}}
    asked: list[str] = []

    async def home(tid: str, method: str, *args: object) -> object:
        assert method == "describe_transactional_id"
        asked.append(tid)
        return described.get(tid)

    async def never(*args: object) -> None:
        raise AssertionError("no call expected")

    txns = KafkaTransactions("new-gateway", home, never)
    pid = tid_producer_id("tx")
    assert asyncio.run(txns.state_of("tx", pid, 2)) == wire.INVALID_PRODUCER_EPOCH
    assert asyncio.run(txns.state_of("gone", tid_producer_id("gone"), 0)) == INVALID_PRODUCER_ID_MAPPING
    assert asyncio.run(txns.state_of("tx", pid + 1, 3)) == INVALID_PRODUCER_ID_MAPPING  # not the id's
    assert asyncio.run(txns.state_of(None, pid, 3)) == INVALID_PRODUCER_ID_MAPPING
    state = asyncio.run(txns.state_of("tx", pid, 3))
    assert asked == ["tx", "gone", "tx"]  # the wrong producer id and no id asked nothing
    assert (state.epoch, state.txn, state.owner, state.timeout_ms) == (3, txn, "old-gateway", 9000)
    assert txns.txn_for(state, "t", 0) == txn and txns.txn_for(state, "t", 1) is None
    assert txns.offsets_txn(state, "g") == txn and state.subscriptions == {("s", 1, "g")}
    assert asyncio.run(txns.state_of("tx", pid, 3)) is state and len(asked) == 3  # known now: not asked


def test_end_txn_ends_what_the_coordinator_has_open_or_answers_by_the_last_txn() -> None:
    """EndTxn asks the id's coordinator: it ends the txn open there even when this gateway cached
    none (another gateway began it), under that txn's owner; with none open it ends the id's
    last txn again, whose outcome answers (an abort after a commit is INVALID_TXN_STATE, not a
    silent success); an id that never began one has nothing to end; a newer epoch fences."""
    import asyncio

    from raytxn.errors import TransactionAlreadyCommitted
    from raytxn.ids import TxnID
    from raytxn.kafka.transactions import INVALID_TXN_STATE, PRODUCER_FENCED, KafkaTransactions, TxnState

    open_txn, ended = TxnID(0, 5), TxnID(0, 4)
    view: dict[str, object] = {"epoch": 2, "txn": open_txn, "owner": "other-gateway", "timeout_ms": 9000,
                               "partitions": [("t", 0)], "subscriptions": [], "last_txn": open_txn,
                               "last_owner": "other-gateway", "last_outcome": None}
    ends: list[tuple] = []

    async def home(tid: str, method: str, *args: object) -> object:
        assert method == "describe_transactional_id"
        return dict(view)

    async def txn_call(txn: TxnID, method: str, *args: object) -> None:
        assert method == "end_txn"
        ends.append((txn, args[1], args[2]))
        if txn == ended and args[1] == "ABORT":
            raise TransactionAlreadyCommitted(f"{txn} committed")

    txns = KafkaTransactions("this-gateway", home, txn_call)
    state = TxnState("tx", 99, 2, 1000)  # cached: no txn open
    assert asyncio.run(txns.end(state, commit=True)) == wire.NONE
    assert ends.pop() == (open_txn, "COMMIT", "other-gateway") and state.txn is None
    view.update(txn=None, owner=None, partitions=[], last_txn=ended, last_owner=None, last_outcome="COMMITTED")
    assert asyncio.run(txns.end(state, commit=True)) == wire.NONE                  # a repeat of the commit
    assert asyncio.run(txns.end(state, commit=False)) == INVALID_TXN_STATE         # not an abort now
    assert [e[:2] for e in ends] == [(ended, "COMMIT"), (ended, "ABORT")]
    view.update(last_txn=None, last_outcome=None)
    ends.clear()
    assert asyncio.run(txns.end(state, commit=False)) == wire.NONE and ends == []  # never began one
    view["epoch"] = 3
    assert asyncio.run(txns.end(state, commit=True)) == PRODUCER_FENCED and ends == []


def test_describe_producers_rows_name_kafka_producers_and_open_native_txns() -> None:
    from raytxn.ids import TxnID
    from raytxn.kafka import mapping
    from raytxn.kafka.txn_admin import producer_rows

    native_txn = TxnID(1, 3)
    rows = producer_rows([
        {"producer": "kafka-7-1", "last_sequence": 4, "last_timestamp_ms": 50, "txn": TxnID(0, 2),
         "txn_start_offset": 10, "txn_start_ms": 40},
        {"producer": "kafka-7-0", "last_sequence": 9, "last_timestamp_ms": 30, "txn": None,
         "txn_start_offset": None, "txn_start_ms": None},                   # the same id's older epoch
        {"producer": "kafka-8-0", "last_sequence": 2, "last_timestamp_ms": 20, "txn": None,
         "txn_start_offset": None, "txn_start_ms": None},
        {"producer": "orders-writer", "last_sequence": 5, "last_timestamp_ms": 10, "txn": None,
         "txn_start_offset": None, "txn_start_ms": None},                   # native, no txn: not a Kafka producer
        {"producer": "orders-writer-2", "last_sequence": 1, "last_timestamp_ms": 15, "txn": native_txn,
         "txn_start_offset": 3, "txn_start_ms": 12},
    ])
    got = [(r.producer_id, r.producer_epoch, r.last_sequence, r.last_timestamp, r.current_txn_start_offset)
           for r in rows]
    assert got == [(7, 1, 4, 50, 10), (8, 0, 2, 20, -1), (mapping.txn_producer_id(native_txn), 0, 1, 15, 3)]
