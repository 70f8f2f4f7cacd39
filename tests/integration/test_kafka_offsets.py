"""Dense Kafka offsets on a real partition actor (local Ray, file:// storage): every entry carries
its base offset, and offsets, the log start offset, the last stable offset and the high watermark
are the same after a restart (full replay, then snapshot + replay) and after trimming."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.errors import InvalidArgument
from raytxn.ids import Position, partition_actor_name
from raytxn.protocol.entry_format import decode_entry
from tests.engine import engine_client, new_topic, partition_ref, restart_actor

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    # Offsets are counted exactly here, markers included, with chained begins on (the default):
    # an unused chained txn is released without writing a marker (an offset) anywhere.
    yield from engine_client(tmp_path_factory)


def offsets(topic: str) -> list[tuple[int, list[bytes]]]:
    """(base offset, values) of every visible entry, read through the partition actor."""
    out, position = [], Position(0, 0)
    while True:
        result = partition_ref(topic).call("read", position, 1000)
        for _pos, records in result["entries"]:
            header, messages = decode_entry(records)
            out.append((header.base_offset, [m.value for m in messages]))
        if result["next"] == position:
            return out
        position = result["next"]


def marks(topic: str) -> dict[str, int]:
    return partition_ref(topic).call("kafka_offsets")


def test_offsets_survive_restarts_and_trimming(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    producer.send(b"a")                                   # 0
    with client.transaction() as txn:
        producer.send(b"b", txn=txn)                      # 1
        producer.send(b"c", txn=txn)                      # 2, commit marker 3
    aborted = client.new_transaction()
    producer.send(b"x", txn=aborted)                      # 4, abort marker 5
    aborted.abort()
    producer.send(b"d")                                   # 6
    open_txn = client.new_transaction()
    producer.send(b"o", txn=open_txn)                     # 7, open: the last stable offset
    producer.send(b"e")                                   # 8, held back behind it
    seen = offsets(topic)
    assert seen == [(0, [b"a"]), (1, [b"b"]), (2, [b"c"]), (6, [b"d"])]
    assert marks(topic) == {"log_start": 0, "last_stable": 7, "high_watermark": 9}

    info = restart_actor(partition_actor_name(topic, 0))  # full replay
    assert info["recovered_from_snapshot"] is None
    assert offsets(topic) == seen and marks(topic) == {"log_start": 0, "last_stable": 7, "high_watermark": 9}
    partition_ref(topic).call("snapshot")
    info = restart_actor(partition_actor_name(topic, 0))  # snapshot + replay
    assert info["recovered_from_snapshot"] is not None
    assert offsets(topic) == seen and marks(topic)["high_watermark"] == 9

    open_txn.commit()                                     # marker 9
    producer.send(b"f")                                   # 10
    assert offsets(topic) == [*seen, (7, [b"o"]), (8, [b"e"]), (10, [b"f"])]
    assert marks(topic) == {"log_start": 0, "last_stable": 11, "high_watermark": 11}

    restart_actor(partition_actor_name(topic, 0))         # the next incarnation writes a new ledger
    producer.send(b"g")                                   # 11, at entry 0 of it
    current = max(partition_ref(topic).call("stats")["ledgers"])
    assert partition_ref(topic).call("locate_offset", 11) == Position(current, 0)
    partition_ref(topic).call("trim", Position(current, 0))
    assert offsets(topic) == [(11, [b"g"])]
    assert marks(topic) == {"log_start": 11, "last_stable": 12, "high_watermark": 12}
    assert partition_ref(topic).call("locate_offset", 10) is None  # trimmed
    restart_actor(partition_actor_name(topic, 0))
    assert offsets(topic) == [(11, [b"g"])]
    assert marks(topic) == {"log_start": 11, "last_stable": 12, "high_watermark": 12}
    producer.send(b"h")
    assert offsets(topic)[-1] == (12, [b"h"])


def test_offsets_map_to_messages_and_back_across_ledgers_and_trims(client: rt.Client) -> None:
    """What a Kafka group's commit and fetch use: every offset in [log start, high watermark]
    names a message (entry position, index) and that message maps back to the offset, also
    across a ledger boundary, markers and batches; below the log start an offset is out of range
    and a position is the log start."""
    topic = new_topic(client)
    producer = client.create_producer(topic)
    producer.send_batch([b"a", b"b", b"c"]).result()       # 0-2, one entry
    with client.transaction() as txn:
        producer.send(b"d", txn=txn)                        # 3, marker 4
    restart_actor(partition_actor_name(topic, 0))           # the next entries go to a new ledger
    producer.send_batch([b"e", b"f"]).result()              # 5-6
    ref = partition_ref(topic)

    def round_trip() -> list[int]:
        marks = ref.call("kafka_offsets")
        out = []
        for offset in range(marks["log_start"], marks["high_watermark"] + 1):
            where = ref.call("kafka_locate", offset)
            out.append(ref.call("kafka_offset_of", where["position"], where["index"]))
        return out

    assert round_trip() == list(range(8))
    assert [ref.call("kafka_locate", o)["index"] for o in (0, 1, 2, 3, 4)] == [0, 1, 2, 0, 0]
    end = ref.call("kafka_locate", 7)
    assert (end["index"], end["size"]) == (0, None)         # the high watermark: past the last entry
    assert ref.call("kafka_locate", 8) is None and ref.call("kafka_locate", -1) is None
    assert ref.call("kafka_offset_of", Position(0, 0), 0) == 0   # before every entry: the log start
    current = max(ref.call("stats")["ledgers"])
    ref.call("trim", Position(current, 0))
    assert ref.call("kafka_offsets")["log_start"] == 5
    assert round_trip() == [5, 6, 7]
    assert ref.call("kafka_locate", 4) is None                   # trimmed
    assert ref.call("kafka_offset_of", Position(0, 0), 0) == 5   # a cursor before the trim point


def test_offsets_by_time_follow_event_times_the_last_stable_offset_and_trims(client: rt.Client) -> None:
    """ListOffsets by time on a partition actor: the first offset whose timestamp (event time,
    else append time) is at or after the time; read_committed stops at the last stable offset;
    trimmed entries are not found; bad input is refused."""
    topic = new_topic(client)
    producer = client.create_producer(topic)
    producer.send(b"a", event_time=1_000)                     # 0
    producer.send(b"b", event_time=3_000)                     # 1
    with client.transaction() as txn:
        producer.send(b"c", event_time=2_000, txn=txn)        # 2 (an earlier time at a later offset), marker 3
    restart_actor(partition_actor_name(topic, 0))             # what follows goes to a new ledger
    open_txn = client.new_transaction()
    producer.send(b"o", event_time=5_000, txn=open_txn)       # 4, open: the last stable offset
    before_d = int(time.time() * 1000)
    producer.send(b"d")                                       # 5, no event time: its append time
    ref = partition_ref(topic)

    def lookup(timestamp_ms: int, committed: bool = True) -> tuple[int, int] | None:
        found = ref.call("kafka_offset_for_time", timestamp_ms, committed)
        return None if found is None else tuple(found)

    assert lookup(0) == (0, 1_000) and lookup(1_000) == (0, 1_000)
    assert lookup(1_001) == (1, 3_000) and lookup(2_000) == (1, 3_000)  # offset 1 comes first
    assert lookup(3_001) is None                                # only offset 4 on is that late: not stable
    assert lookup(3_001, committed=False) == (4, 5_000)
    after = lookup(5_001, committed=False)
    assert after is not None and after[0] == 5 and after[1] >= before_d  # its append time, ms since the epoch

    def latest(committed: bool = True) -> tuple[int, int] | None:  # ListOffsets MAX_TIMESTAMP
        found = ref.call("kafka_offset_of_max_time", committed)
        return None if found is None else tuple(found)

    assert latest() == (1, 3_000)                               # the largest time below the stable offset
    assert latest(committed=False) == after                     # d's append time beats every event time
    open_txn.commit()                                           # marker 6
    assert lookup(3_001) == (4, 5_000)
    assert latest() == after
    current = max(ref.call("stats")["ledgers"])
    ref.call("trim", Position(current, 0))                      # offsets 0-3 go
    assert lookup(0) == (4, 5_000)
    assert latest() == after
    tie = new_topic(client)
    assert partition_ref(tie).call("kafka_offset_of_max_time") is None  # nothing yet
    tied = client.create_producer(tie)
    for value, event_time in ((b"x", 7_000), (b"y", 9_000), (b"z", 9_000), (b"w", 8_000)):
        tied.send(value, event_time=event_time)
    assert tuple(partition_ref(tie).call("kafka_offset_of_max_time")) == (1, 9_000)  # the first of a tie
    for bad in (-5, "1000", 1.5):
        with pytest.raises(InvalidArgument):
            ref.call("kafka_offset_for_time", bad)
