"""A per-key dedup window kept as exactly-once state (issue 58 item 4): of the events carrying the
same key (an event id), one passes; a repeat within ``window_ms`` of the key's last occurrence is a
duplicate and is dropped; a key not seen for longer than the window is forgotten, so a later repeat
passes again. The dedup of Kafka Streams' examples (a window store of seen ids) and of Flink's
keyed-state dedup, here on a compacted state topic, so the seen ids, the output and the input's
acks commit in one transaction: a batch tried again never drops an event as a duplicate of its own
aborted attempt, and never lets one through twice.

State: key -> ``b"<last event time>,<input partition>"``. Time is event time. Forgetting goes by
each input partition's stream time (the largest event time the batch holds of that partition), as
Kafka Streams' stream time is per task: an id lives in one partition (the key picks it) and a
partition's event times do not go back, so a forgotten id's next repeat is always more than the
window after its last occurrence, and would pass anyway. A forgotten id gets a tombstone, which
compaction removes, so the state holds about the ids of the last window.

Three forms of one rule: ``dedup_window_spark`` (``ExactlyOncePipeline(state_topic=)``),
``dedup_window`` (``raytxn.connectors.stateful.StatefulPipeline``) and ``expected_dedup``, the
same rule event by event in plain Python, the reference the examples and tests check against.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from raytxn.errors import InvalidArgument

__all__ = ["dedup_window", "dedup_window_spark", "expected_dedup", "passed_keys", "sample_events"]


def _is_new(event_time: int, last_seen: int | None, window_ms: int) -> bool:
    return last_seen is None or event_time - last_seen > window_ms


def expected_dedup(events: Iterable[tuple[str, int]], window_ms: int) -> Counter:
    """``(key, event_time)`` in log order (per key) -> how many times each key passes."""
    last: dict[str, int] = {}
    passed: Counter = Counter()
    for key, event_time in events:
        if _is_new(event_time, last.get(key), window_ms):
            passed[key] += 1
        last[key] = event_time
    return passed


def sample_events(n: int, window_ms: int, start_ms: int = 1_700_000_000_000) -> list[tuple[str, int]]:
    """``n`` events ``(id, event_time)``, one every ``window_ms / 20``: most ids are new, every
    fourth event repeats the one before it (a duplicate, within the window), and every ninth from
    the 60th on repeats the id of 60 events before (three windows later, so it passes again)."""
    step = max(1, window_ms // 20)
    keys: list[str] = []
    for i in range(n):
        if i % 4 == 1:
            keys.append(keys[i - 1])
        elif i % 9 == 0 and i >= 60:
            keys.append(keys[i - 60])
        else:
            keys.append(f"event-{i}")
    return [(key, start_ms + i * step) for i, key in enumerate(keys)]


def passed_keys(client: Any, topic: str, subscription: str, idle_s: float = 3.0) -> Counter:
    """How many times each key is in ``topic``'s committed messages, read from the start (the
    dedup's output, to set beside ``expected_dedup``)."""
    import raytxn as rt

    consumer = client.subscribe(topic, subscription, initial_position=rt.InitialPosition.Earliest)
    keys: Counter = Counter()
    try:
        while True:
            try:
                keys[consumer.receive(timeout=idle_s).key()] += 1
            except rt.errors.Timeout:
                return keys
    finally:
        consumer.close()


def _decode(value: bytes) -> tuple[int, int]:
    last, partition = value.decode().split(",")
    return int(last), int(partition)


def dedup_window(window_ms: int) -> Callable[[list[dict[str, Any]], Mapping[str, bytes]],
                                             tuple[list[tuple[str, bytes]], dict[str, bytes | None]]]:
    """The transform of a ``StatefulPipeline``: passes the batch's rows that are not repeats."""
    if window_ms <= 0:
        raise InvalidArgument(f"window_ms must be positive, got {window_ms}")

    def transform(rows: list[dict[str, Any]], state: Mapping[str, bytes]) -> tuple[list, dict]:
        last: dict[str, tuple[int, int]] = {}
        stream_time: dict[int, int] = {}
        passed: list[tuple[str, bytes]] = []
        for row in sorted(rows, key=lambda r: (r["partition"], r["event_time"])):
            key, event_time = row["key"], int(row["event_time"])
            seen = last.get(key) or (_decode(state[key]) if key in state else None)
            if _is_new(event_time, seen[0] if seen else None, window_ms):
                passed.append((key, row["value"]))
            last[key] = (event_time, row["partition"])
            stream_time[row["partition"]] = max(stream_time.get(row["partition"], event_time), event_time)
        updates: dict[str, bytes | None] = {k: f"{t},{p}".encode() for k, (t, p) in last.items()}
        for key in state:
            if key not in last:
                seen_at, partition = _decode(state[key])
                if partition in stream_time and seen_at < stream_time[partition] - window_ms:
                    updates[key] = None  # forgotten: a tombstone
        return passed, updates

    return transform


def dedup_window_spark(window_ms: int) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The transform of ``ExactlyOncePipeline(state_topic=)``: ``(batch_df, state_df) ->
    (passed rows (key, value), state updates (key, value; null forgets the key))``."""
    if window_ms <= 0:
        raise InvalidArgument(f"window_ms must be positive, got {window_ms}")

    def transform(df: Any, state: Any) -> tuple[Any, Any]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        events = df.select("key", "value", "event_time", "partition")
        parts = F.split(F.col("value").cast("string"), ",")
        seen = state.select("key", parts.getItem(0).cast("long").alias("seen_at"),
                            parts.getItem(1).cast("int").alias("seen_partition"))
        by_key = Window.partitionBy("key").orderBy("event_time")
        # A row's previous occurrence: the one before it in this batch, else the state's.
        prior = F.coalesce(F.lag("event_time").over(by_key), F.col("seen_at"))
        passed = (events.join(seen.select("key", "seen_at"), "key", "left").withColumn("prior", prior)
                  .where(F.col("prior").isNull() | (F.col("event_time") - F.col("prior") > F.lit(window_ms)))
                  .select("key", "value"))
        last = events.groupBy("key").agg(F.max_by("partition", "event_time").alias("partition"),
                                         F.max("event_time").alias("last"))
        touched = last.select("key", F.concat_ws(",", F.col("last").cast("string"),
                                                 F.col("partition").cast("string")).cast("binary").alias("value"))
        stream_time = events.groupBy("partition").agg(F.max("event_time").alias("stream_time"))
        forgotten = (seen.join(last.select("key"), "key", "left_anti")
                     .join(stream_time, F.col("seen_partition") == F.col("partition"))
                     .where(F.col("seen_at") < F.col("stream_time") - F.lit(window_ms))
                     .select("key", F.lit(None).cast("binary").alias("value")))
        return passed, touched.unionByName(forgotten)

    return transform
