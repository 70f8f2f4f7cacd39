"""Reading a deterministic batch of a subscription, shared by the Spark and Ray Data connectors.

``read_messages`` attaches an Exclusive consumer to the subscription, which starts at the
subscription's cursor, and takes up to ``max_messages`` (or everything available): per partition
a contiguous range from the first unacknowledged message. It returns them as rows (dicts with the
columns of ``BATCH_ARROW_SCHEMA``) and a ``BatchHandle`` that acknowledges exactly that range,
cumulatively per partition, inside a transaction. The consumer stays attached until the handle is
closed, so nobody else takes the range meanwhile; an aborted batch is read again, in order, from
the same cursor.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from raytxn.client.message import Message
from raytxn.errors import NotAllowed, RaytxnError, Timeout

FIRST_DELIVERY_PATIENCE_S = 10.0


def batch_arrow_schema() -> Any:
    """The batch's columns. ``properties`` is a JSON object in a string column: map columns do not
    survive RayDP's Ray -> Spark conversion with pandas 3 (pyspark's convert_map asserts dict values)."""
    import pyarrow as pa

    return pa.schema([
        ("key", pa.string()), ("value", pa.binary()), ("properties", pa.string()),
        ("event_time", pa.int64()), ("publish_time", pa.int64()), ("topic", pa.string()),
        ("partition", pa.int32()), ("message_id", pa.string())])


@dataclass
class BatchHandle:
    """The messages of one batch, and how to acknowledge exactly them in a transaction."""

    consumer: Any
    last_per_partition: dict[int, Message]
    count: int

    def acknowledge(self, txn: Any) -> None:
        """Cumulatively acknowledge each partition's range inside ``txn`` (``None``: plain acks)."""
        for message in self.last_per_partition.values():
            self.consumer.acknowledge_cumulative(message, txn=txn)

    def close(self) -> None:
        self.consumer.close()


def attach(client: Any, topic: str, subscription: str, name: str, deadline_s: float) -> Any:
    """An Exclusive consumer. While a dead driver's consumer is still attached the subscription
    refuses a second one; keep trying until the dead one is dropped (``consumer_timeout_s``)."""
    import raytxn as rt

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return client.subscribe(topic, subscription, consumer_type=rt.ConsumerType.Exclusive,
                                    initial_position=rt.InitialPosition.Earliest, consumer_name=name,
                                    receiver_queue_size=1000)
        except NotAllowed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def read_messages(client: Any, topic: str, subscription: str, max_messages: int | None = 1000,
                  until_caught_up: bool = False, idle_timeout_s: float = 1.0, consumer_name: str | None = None,
                  attach_deadline_s: float = 120.0) -> tuple[list[dict[str, Any]], BatchHandle]:
    """The next messages of ``subscription`` as rows, in delivery order, and the handle acknowledging them."""
    if max_messages is None and not until_caught_up:
        raise ValueError("give max_messages, or until_caught_up=True")
    consumer = attach(client, topic, subscription, consumer_name or f"batch-{subscription}", attach_deadline_s)
    messages: list[Message] = []
    # A fresh consumer may wait a while for its first delivery (the subscription rewinds what a
    # previous consumer had prefetched); nothing within idle_timeout_s is then no proof of an
    # empty input. While the subscription reports a backlog, keep waiting, within a bound (a
    # backlog of entries that are never delivered, e.g. aborted ones, must not block forever).
    patience = time.monotonic() + max(idle_timeout_s, FIRST_DELIVERY_PATIENCE_S)
    try:
        while until_caught_up or len(messages) < (max_messages or 0):
            want = 1000 if max_messages is None else min(1000, max_messages - len(messages))
            got = consumer.batch_receive(want, timeout=idle_timeout_s)
            if not got:
                if not messages and time.monotonic() < patience and _has_backlog(consumer):
                    continue
                break  # caught up
            messages.extend(got)
    except (RaytxnError, Timeout):
        consumer.close()
        raise
    last: dict[int, Message] = {}
    for message in messages:
        partition = message.message_id().partition
        if partition not in last or message.message_id() > last[partition].message_id():
            last[partition] = message
    rows = [{"key": m.key(), "value": m.value(), "properties": json.dumps(m.properties()), "event_time": m.event_time(),
             "publish_time": m.publish_time(), "topic": m.message_id().topic,
             "partition": m.message_id().partition, "message_id": str(m.message_id())} for m in messages]
    return rows, BatchHandle(consumer, last, len(messages))


def _has_backlog(consumer: Any) -> bool:
    return any(stats.get("backlog_entries", 0) > 0 for stats in consumer.stats())


def to_arrow(rows: list[dict[str, Any]]) -> Any:
    """The rows as one Arrow table with the batch's schema (also when there are none)."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=batch_arrow_schema())
