"""Every producer codec through the Kafka gateway, and requests it cannot serve, with real Kafka
clients (confluent-kafka, kafka-python, kcat) and raw sockets; no mocks. One local Ray, one
engine on file:// storage, one gateway actor on a free port of 127.0.0.1.

What each codec test checks: the producer's batches reached the gateway compressed with that
codec (the gateway's per-codec batch counts), every message is delivered without error, a
read_committed consumer reads exactly those values back, and raytxn's own read path sees the
same. What the malformed-request test checks: each bad request gets its Kafka error or a clean
close, nothing lands, and a producer on another connection keeps producing meanwhile."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.kafka import codecs, wire
from raytxn.kafka.gateway import start_gateway
from tests.engine import engine_client, new_topic, visible_values
from tests.kafka_clients import poll_values

pytestmark = pytest.mark.ray

CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def gateway(client: rt.Client) -> Iterator[dict[str, Any]]:
    address = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1")
    try:
        yield address
    finally:
        ray.kill(address["actor"], no_restart=True)


def stats(gateway: dict[str, Any]) -> dict[str, Any]:
    return ray.get(gateway["actor"].stats.remote())


def codec_counts(gateway: dict[str, Any]) -> dict[str, int]:
    return dict(stats(gateway)["batches"]["codecs"])


def values_for(tag: str, count: int) -> list[bytes]:
    """Compressible values: producers send a batch plain when compressing would not shrink it."""
    return [f"{tag}-{i:04d}-".encode() + b"compressible " * 40 for i in range(count)]


def read_committed(bootstrap: str, topic: str, count: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        return [m.value() for m in poll_values(consumer, count, quiet_s=1.0)]
    finally:
        consumer.close()


def delivered_without_error(producer: Any, topic: str, values: list[bytes]) -> list[Any]:
    reports: list[Any] = []
    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=lambda e, m: reports.append((e, m.offset())))
    assert producer.flush(60) == 0
    return reports


@pytest.mark.parametrize("codec", CODEC_NAMES)
def test_confluent_producers_of_every_codec_are_read_back_exactly(client: rt.Client, gateway: dict[str, Any],
                                                                  codec: str) -> None:
    """An idempotent producer, then a transactional one (one aborted transaction, one committed),
    each with ``compression.type`` ``codec``: its batches arrive in that codec (zstd too: the
    gateway advertises Produce v7+, which librdkafka wants for zstd), nothing fails, and a
    read_committed consumer and raytxn read the idempotent and committed values, in order."""
    from confluent_kafka import Producer

    bootstrap, topic = gateway["bootstrap"], new_topic(client)
    before = codec_counts(gateway).get(codec, 0)
    idempotent = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                           "compression.type": codec})
    plain = values_for(f"idem-{codec}", 60)
    reports = delivered_without_error(idempotent, topic, plain)
    assert reports == [(None, i) for i in range(60)]
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{codec}-{topic}",
                              "compression.type": codec, "linger.ms": 20, "transaction.timeout.ms": 60000})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    delivered_without_error(transactional, topic, values_for(f"aborted-{codec}", 20))
    transactional.abort_transaction(30)
    transactional.begin_transaction()
    committed = values_for(f"txn-{codec}", 40)
    delivered_without_error(transactional, topic, committed)
    transactional.commit_transaction(30)

    assert codec_counts(gateway).get(codec, 0) - before >= 3   # the batches came in this codec
    expected = plain + committed
    assert read_committed(bootstrap, topic, len(expected)) == expected
    assert visible_values(topic) == expected


@pytest.mark.parametrize("codec", ("gzip", "snappy", "lz4", "zstd"))
def test_kcat_produces_every_codec(client: rt.Client, gateway: dict[str, Any], codec: str) -> None:
    """kcat links an older librdkafka (Debian's: 2.0), which compresses only when Produce v0 is
    advertised (KAFKA-18659, librdkafka #4956): it sends ``-z codec`` batches, not plain ones."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian package kcat; .ci/run installs it)")
    topic = new_topic(client)
    before = codec_counts(gateway).get(codec, 0)
    values = values_for(f"kcat-{codec}", 30)
    subprocess.run([kcat, "-P", "-b", gateway["bootstrap"], "-t", topic, "-p", "0", "-z", codec,
                    "-X", "linger.ms=50"], input=b"\n".join(values) + b"\n", timeout=60, check=True)
    assert codec_counts(gateway).get(codec, 0) > before
    assert visible_values(topic) == values
    assert read_committed(gateway["bootstrap"], topic, len(values)) == values


@pytest.mark.parametrize("codec", ("gzip", "snappy", "lz4", "zstd"))
def test_kafka_python_produces_every_codec(client: rt.Client, gateway: dict[str, Any], codec: str) -> None:
    """kafka-python writes with its own codec libraries: snappy in the Java client's xerial
    framing, lz4 frames with the lz4 package, zstd with zstandard."""
    from kafka import KafkaProducer

    topic = new_topic(client)
    before = codec_counts(gateway).get(codec, 0)
    producer = KafkaProducer(bootstrap_servers=gateway["bootstrap"], compression_type=codec, linger_ms=20,
                             acks="all")
    values = values_for(f"kp-{codec}", 30)
    futures = [producer.send(topic, value=v, partition=0) for v in values]
    assert [f.get(timeout=30).offset for f in futures] == list(range(30))
    producer.close()
    assert codec_counts(gateway).get(codec, 0) > before
    assert visible_values(topic) == values


# --- requests the gateway cannot serve --------------------------------------------------------


def recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    """``size`` bytes, or None when the gateway closed the connection first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def exchange(host: str, port: int, frame: bytes) -> bytes | None:
    """Send one frame on a new connection: the response's payload, or None for a close."""
    with socket.create_connection((host, port), timeout=30) as sock:
        return request_on(sock, frame)


def request_on(sock: socket.socket, frame: bytes) -> bytes | None:
    sock.sendall(frame)
    prefix = recv_exactly(sock, 4)
    return None if prefix is None else recv_exactly(sock, struct.unpack(">i", prefix)[0])


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def produce_frame(topic: str, records: bytes, correlation_id: int = 1) -> bytes:
    from kafka.protocol.producer import ProduceRequest

    request = ProduceRequest[7](transactional_id=None, acks=-1, timeout_ms=10000,
                                topic_data=[(topic, [(0, records)])])
    request.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(request.encode(header=True, framed=True))


def produce_errors(payload: bytes | None) -> list[int]:
    from kafka.protocol.producer import ProduceResponse

    assert payload is not None, "the gateway closed the connection instead of answering"
    response = ProduceResponse[7].decode(payload, header=True)
    return [p.error_code for t in response.responses for p in t.partition_responses]


def record_batch(codec: int, values: list[bytes]) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    for i, value in enumerate(values):
        builder.append(i, 1000 + i, None, value, [])
    return bytes(builder.build())


def with_codec_and_crc(data: bytes, codec: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.util import calc_crc32c

    out = bytearray(data)
    struct.pack_into(">h", out, DefaultRecordBatch.ATTRIBUTES_OFFSET, codec)
    struct.pack_into(">I", out, DefaultRecordBatch.CRC_OFFSET,
                     calc_crc32c(memoryview(out)[DefaultRecordBatch.ATTRIBUTES_OFFSET:]))
    return bytes(out)


def rebuilt(batch: bytes, records: bytes, codec: int) -> bytes:
    """``batch``'s header over other records (maybe compressed), its length and CRC made right."""
    out = bytearray(batch[:61] + records)
    struct.pack_into(">i", out, 8, len(out) - 12)
    return with_codec_and_crc(bytes(out), codec)


def zip_bomb() -> bytes:
    """A gzip batch of one 32 MiB record of zeros: ~32 KiB on the wire, past the 8 MiB bound."""
    plain = record_batch(codecs.NONE, [bytes(32 << 20)])
    return rebuilt(plain, codecs.compress(codecs.GZIP, plain[61:]), codecs.GZIP)


class BackgroundProducer:
    """A confluent-kafka producer on its own connections, producing until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic, self.sent, self.reports = topic, [], []
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.sent) < 5000:
            value = f"live-{len(self.sent)}".encode()
            self.sent.append(value)
            self.producer.produce(self.topic, value=value, partition=0,
                                  on_delivery=lambda e, m: self.reports.append(e))
            self.producer.poll(0.01)

    def delivered(self) -> int:
        return sum(1 for e in list(self.reports) if e is None)

    def wait_delivered(self, more_than: int, timeout_s: float = 60) -> int:
        """The count delivered, once past ``more_than`` (within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.delivered() <= more_than and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.delivered()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.producer.flush(60) == 0


def gateway_log_lines(gateway: dict[str, Any]) -> list[str]:
    """The gateway actor's worker log (this local Ray's session: ``worker-*-<pid>.err/.out``)."""
    pid = ray.get(gateway["actor"].__ray_call__.remote(lambda self: os.getpid()))
    logs_dir = ray._private.worker.global_worker.node.get_logs_dir_path()
    files = glob.glob(os.path.join(logs_dir, f"worker-*-{pid}.err")) + glob.glob(
        os.path.join(logs_dir, f"worker-*-{pid}.out"))
    assert files, f"no worker log of pid {pid} in {logs_dir}"
    lines: list[str] = []
    for path in files:
        with open(path, errors="replace") as f:
            lines += f.read().splitlines()
    return lines


def test_malformed_requests_get_their_error_or_a_clean_close_while_others_produce(
        client: rt.Client, gateway: dict[str, Any]) -> None:
    from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest

    host, port = gateway["bootstrap"].rsplit(":", 1)
    port_number = int(port)
    target, live = new_topic(client), new_topic(client)
    before = stats(gateway)
    background = BackgroundProducer(gateway["bootstrap"], live)
    try:
        delivered_before = background.wait_delivered(0)   # producing, before the bad requests
        assert delivered_before > 0
        # Closed: what cannot be parsed or is not served (Kafka brokers close these too).
        metadata = MetadataRequest[4](topics=[MetadataRequest.MetadataRequestTopic(name=target)],
                                      allow_auto_topic_creation=False)
        metadata.with_header(correlation_id=3, client_id="raw")
        body = bytes(metadata.encode(header=True, framed=False))
        closes = {
            "truncated body": framed(body[:len(body) - len(target) // 2]),
            "unknown api key": framed(struct.pack(">hhih", 999, 0, 4, 3) + b"raw"),
            "unknown Produce version": framed(struct.pack(">hhih", 0, 99, 5, 3) + b"raw" + b"\x00" * 20),
            "Produce v0 (advertised, refused)": framed(struct.pack(">hhih", 0, 0, 5, 3) + b"raw" + b"\x00" * 20),
            "garbage bytes": framed(bytes.fromhex("7fee0c0dfeedfacecafebabe0123456789") * 3),
            "header too short": framed(b"\x00\x03\x00"),
            "oversized frame prefix": struct.pack(">i", wire.MAX_FRAME_BYTES + 1) + b"\x00" * 16,
            "negative frame prefix": struct.pack(">i", -8) + b"\x00" * 16,
        }
        for what, frame in closes.items():
            assert exchange(host, port_number, frame) is None, what

        # ApiVersions of a version past the served ones, with a body of that unknown version:
        # a v0 answer, UNSUPPORTED_VERSION and the versions served (KIP-511).
        answer = exchange(host, port_number, framed(struct.pack(">hhih", 18, 77, 9, 3) + b"raw" + b"\xff" * 12))
        assert answer is not None
        versions = ApiVersionsResponse[0].decode(answer, header=True)
        assert versions.error_code == wire.UNSUPPORTED_VERSION
        assert {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}[0] == (0, 9)

        # Answered per partition, on one connection that stays open: nothing of them lands.
        good = record_batch(codecs.NONE, [b"never-lands"])
        flipped = bytearray(good)
        flipped[20] ^= 0x01                                      # a byte of the CRC
        refusals = {"flipped CRC": (bytes(flipped), wire.CORRUPT_MESSAGE),
                    "codec id 7": (with_codec_and_crc(good, 7), wire.UNSUPPORTED_COMPRESSION_TYPE),
                    "zip bomb": (zip_bomb(), wire.MESSAGE_TOO_LARGE),
                    "good then truncated": (good + good[:30], wire.CORRUPT_MESSAGE),
                    "garbage records": (rebuilt(good, b"\xff" * 9, codecs.NONE), wire.CORRUPT_MESSAGE),
                    "garbage lz4 records": (rebuilt(good, b"\x04\x22\x4d\x18garbage", codecs.LZ4),
                                            wire.CORRUPT_MESSAGE)}
        with socket.create_connection((host, port_number), timeout=30) as sock:
            for i, (what, (records, code)) in enumerate(refusals.items()):
                assert produce_errors(request_on(sock, produce_frame(target, records, i))) == [code], what
        assert background.wait_delivered(delivered_before, timeout_s=30) > delivered_before  # and went on
    finally:
        background.stop()

    assert visible_values(target) == []               # nothing landed: the native client sees no entry
    assert client.topic_stats(target)["partition_stats"][0]["kafka_offsets"]["high_watermark"] == 0
    assert all(e is None for e in background.reports) and len(background.reports) == len(background.sent)
    assert visible_values(live) == background.sent    # every live message, once, in order

    after = stats(gateway)
    closed = {r: after[f"closed_{r}"] - before[f"closed_{r}"] for r in wire.CLOSE_REASONS}
    assert closed["malformed"] >= 2 and closed["unsupported"] >= 3 and closed["oversized"] >= 2, closed
    assert closed["internal_error"] == 0, closed
    refused = after["batches"]["refused"]
    assert refused.get("CORRUPT_MESSAGE", 0) >= 3 and refused.get("UNSUPPORTED_COMPRESSION_TYPE", 0) >= 1
    assert refused.get("MESSAGE_TOO_LARGE", 0) >= 1
    lines = gateway_log_lines(gateway)  # one line per close, and no traceback
    assert sum("closing Kafka connection" in line for line in lines) >= len(closes)
    assert not any("Traceback" in line for line in lines), [line for line in lines if "Traceback" in line]


def test_idempotent_produce_requests_are_served_while_earlier_ones_append_and_answered_in_order(
        client: rt.Client, gateway: dict[str, Any]) -> None:
    """librdkafka keeps up to 5 Produce requests in flight on a connection; the gateway appends
    them at once and answers in their order (librdkafka and kafka-python both check it), and each
    partition still holds every message once, in the order sent."""
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    topic = new_topic(client, partitions=2)
    before = stats(gateway)
    producer = Producer({"bootstrap.servers": gateway["bootstrap"], "enable.idempotence": True,
                         "batch.num.messages": 50, "linger.ms": 0, "max.in.flight": 5})
    delivered: list[Any] = []
    for i in range(3000):
        producer.produce(topic, value=f"c{i}".encode(), partition=i % 2, on_delivery=lambda e, m: delivered.append(
            (e, m.partition(), m.offset(), m.value())))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert all(e is None for e, _, _, _ in delivered) and len(delivered) == 3000
    kp = KafkaProducer(bootstrap_servers=gateway["bootstrap"], enable_idempotence=True, batch_size=200,
                       linger_ms=0, max_in_flight_requests_per_connection=5)
    for i in range(600):
        kp.send(topic, value=f"k{i}".encode(), partition=0)
    kp.flush(60)
    kp.close()
    after = stats(gateway)
    assert after["produces_pipelined"] - before["produces_pipelined"] >= 60  # every one of them, in fact
    assert after["produces_in_flight_max"] >= 2, after  # some were appending together
    for partition in (0, 1):
        offsets = sorted((offset, value) for _, p, offset, value in delivered if p == partition)
        assert [o for o, _ in offsets] == list(range(1500))  # dense: nothing lost, nothing twice
        assert [v for _, v in offsets] == [f"c{i}".encode() for i in range(partition, 3000, 2)]
    values = visible_values(topic, (0,))
    assert values[:1500] == [f"c{i}".encode() for i in range(0, 3000, 2)]
    assert values[1500:] == [f"k{i}".encode() for i in range(600)]
