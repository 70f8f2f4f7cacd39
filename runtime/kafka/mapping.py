"""How Kafka's names and ids map onto raytxn's (pure: no Ray, no I/O).

Topics: a Kafka topic name is the raytxn topic of the same name. Kafka allows 1-249 of
``[A-Za-z0-9._-]``; raytxn 1-200 of the same alphabet, starting with a letter or digit and without
``..`` (names end up in actor names and object keys). A Kafka name outside raytxn's rules gets
INVALID_TOPIC_EXCEPTION; a valid name of no raytxn topic gets UNKNOWN_TOPIC_OR_PARTITION (the
gateway creates topics only when asked, by CreateTopics: ``topic_admin``).

Producers: an idempotent Kafka producer (producer id and epoch from InitProducerId) writes as the
raytxn producer ``kafka-<id>-<epoch>``, its per-partition Kafka sequence numbers being raytxn's
sequence ids, so raytxn's dedup drops its retries; a new epoch starts sequences at 0, hence a new
name. A Kafka producer without id writes as one raytxn producer per connection with sequences
counted by the gateway (Kafka's at-least-once for such producers).

Consumer groups: a Kafka group G's committed offsets on topic T are the raytxn subscription named
G on T (``raytxn_subscription``), so a group id must also be a raytxn name (else INVALID_GROUP_ID).

Fetched transactions: raytxn transactions are not Kafka producers, so a transaction's batches and
its marker are fetched under a producer id standing for the transaction (``txn_producer_id``),
which is what read_committed clients use to match data to markers and aborted-transaction lists.
"""

from __future__ import annotations

import re

from raytxn.errors import (
    InvalidArgument,
    InvalidTopicName,
    MessageTooLarge,
    NotAuthorized,
    OutOfOrderSequence,
    RaytxnError,
    Timeout,
    TopicNotFound,
)
from raytxn.ids import TxnID, check_name
from raytxn.kafka import wire

_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")
_TXN_PRODUCER_BASE = 1 << 62


def raytxn_topic(kafka_topic: object) -> str:
    """The raytxn topic for a Kafka topic name; ``InvalidTopicName`` when there can be none."""
    if not isinstance(kafka_topic, str) or not _KAFKA_TOPIC.match(kafka_topic):
        raise InvalidTopicName(f"{kafka_topic!r} is not a Kafka topic name")
    return check_name(kafka_topic)


def raytxn_subscription(group_id: object) -> str:
    """The raytxn subscription holding a Kafka group's offsets; ``InvalidTopicName`` when the
    group id cannot name one."""
    return check_name(group_id, "subscription (the Kafka group id)")


def txn_producer_id(txn: TxnID) -> int:
    """The Kafka producer id under which ``txn``'s batches and marker are fetched (distinct per
    transaction, and from the ids InitProducerId hands out, which stay below 2**62)."""
    if not (0 <= txn.tc_id < 1 << 21 and 0 <= txn.sequence < 1 << 40):
        raise InvalidArgument(f"{txn} has no Kafka producer id")
    return _TXN_PRODUCER_BASE | txn.tc_id << 40 | txn.sequence


def producer_name(producer_id: int, epoch: int) -> str:
    """The raytxn producer an idempotent Kafka producer writes as."""
    return f"kafka-{producer_id}-{epoch}"


def error_code(error: BaseException) -> int:
    """The Kafka error code for a raytxn error met while serving a partition."""
    code = getattr(error, "kafka_error", None)  # an error that names its code (``codecs``)
    if isinstance(code, int):
        return code
    if isinstance(error, InvalidTopicName):
        return wire.INVALID_TOPIC_EXCEPTION
    if isinstance(error, TopicNotFound):
        return wire.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, MessageTooLarge):
        return wire.MESSAGE_TOO_LARGE
    if isinstance(error, OutOfOrderSequence):
        return wire.OUT_OF_ORDER_SEQUENCE_NUMBER
    if isinstance(error, NotAuthorized):
        return wire.TOPIC_AUTHORIZATION_FAILED
    if isinstance(error, InvalidArgument):
        return wire.INVALID_RECORD
    if isinstance(error, Timeout):
        return wire.REQUEST_TIMED_OUT
    if isinstance(error, RaytxnError) and error.retriable:
        return wire.NOT_ENOUGH_REPLICAS  # retriable for every Kafka client
    return wire.UNKNOWN_SERVER_ERROR
