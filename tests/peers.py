"""The real peers for tests: a Kafka broker started from ``raytxn.tools.peers`` (fetched into its
cache on first use), or a skip that says why it cannot run here."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from raytxn.tools.peers import BrokerDidNotStart, KafkaBroker, PeerUnavailable, spark_kafka_jars

# Two JVM starts (the storage format, the broker): ~10 s on an idle machine, over a minute on a
# loaded one; the first use also fetches the jars (about a minute).
BROKER_START_S = 240.0


def running_broker() -> Iterator[KafkaBroker]:
    """A started broker for a fixture to yield (stopped after), or skip with the peer's reason
    when it cannot run here (no java, no mvn, a refused fetch). A broker that has all it needs
    and still does not start fails the test: that is a fault, not a missing peer."""
    broker = KafkaBroker()
    started = time.monotonic()
    try:
        broker.start(timeout_s=BROKER_START_S)
    except BrokerDidNotStart as exc:
        pytest.fail(f"the Kafka broker did not start: {exc}")
    except PeerUnavailable as exc:
        pytest.skip(f"no real Kafka broker here: {exc}")
    print(f"Kafka {broker.version} at {broker.bootstrap} (pid {broker.pid}) in {time.monotonic() - started:.1f} s")
    try:
        yield broker
    finally:
        broker.stop()


def spark_kafka_jars_or_skip() -> list[str]:
    try:
        return spark_kafka_jars()
    except PeerUnavailable as exc:
        pytest.skip(f"no Spark Kafka connector here: {exc}")


def create_kafka_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60) -> None:
    """CreateTopics through Kafka's AdminClient, then wait until every partition has a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions and all(
                p.leader >= 0 for p in found.partitions.values()):
            return
        assert time.monotonic() < deadline, f"{topic} never had {partitions} partitions with leaders"
        time.sleep(0.1)
