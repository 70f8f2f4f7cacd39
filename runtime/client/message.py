"""Message ids and received messages, close to pulsar-client's Python API."""

from __future__ import annotations

from typing import Any

import msgspec

from raytxn.errors import InvalidArgument
from raytxn.ids import Position
from raytxn.protocol.entry_format import MessageRecord, decode_message


class MessageId(msgspec.Struct, frozen=True, order=True, array_like=True):
    """Where a message is: ``(topic, partition, ledger_id, entry_id, batch_index)``. Hashable,
    ordered within a partition (append order), and round-trips through bytes."""

    topic: str
    partition: int
    ledger_id: int
    entry_id: int
    batch_index: int = 0

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)

    def serialize(self) -> bytes:
        return _encoder.encode(self)

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        try:
            return _decoder.decode(data)
        except msgspec.DecodeError as e:
            raise InvalidArgument(f"not a serialized MessageId: {e}") from e

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}:{self.ledger_id}:{self.entry_id}:{self.batch_index}"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(MessageId)


class Message:
    """A received message."""

    __slots__ = ("_batch_size", "_id", "_publish_time_ms", "_record", "_redelivery_count")

    def __init__(self, message_id: MessageId, record: MessageRecord | bytes, publish_time_ms: int,
                 redelivery_count: int = 0, batch_size: int = 1) -> None:
        self._id = message_id
        self._record = record  # the encoded record until a field is asked for (decoded lazily)
        self._publish_time_ms = publish_time_ms
        self._redelivery_count = redelivery_count
        self._batch_size = batch_size

    @property
    def _decoded(self) -> MessageRecord:
        record = self._record
        if type(record) is bytes:
            record = self._record = decode_message(record, str(self._id))
        return record  # type: ignore[return-value]

    def value(self) -> bytes:
        return self._decoded.value

    def data(self) -> bytes:
        return self._decoded.value

    def key(self) -> str | None:
        return self._decoded.key

    def partition_key(self) -> str | None:
        return self._decoded.key

    def properties(self) -> dict[str, str]:
        return dict(self._decoded.properties)

    def message_id(self) -> MessageId:
        return self._id

    def topic_name(self) -> str:
        return self._id.topic

    def event_time(self) -> int | None:
        """Event time in ms since the epoch, as the producer set it (None if not set)."""
        return self._decoded.event_time_ms

    def publish_time(self) -> int:
        """When the partition stored the message, ms since the epoch."""
        return self._publish_time_ms

    def redelivery_count(self) -> int:
        return self._redelivery_count

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def __repr__(self) -> str:
        return f"Message({self._id}, key={self.key()!r}, {len(self.value())} bytes)"

    def __reduce__(self) -> Any:
        return (Message, (self._id, self._record, self._publish_time_ms, self._redelivery_count, self._batch_size))
