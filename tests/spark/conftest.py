"""One Spark session (Spark on the test session's Ray, through RayDP) for the whole spark package.

The session has Spark's own Kafka connector (spark-sql-kafka-0-10 at the pyspark version, from
``raytxn.tools.peers``' cache, fetched on first use) on its classpath, for the tests of Spark's
Kafka source on the gateway and on a real broker; where the connector cannot be fetched the
session starts without it and only those tests skip, saying why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raytxn.connectors import spark as sc
from raytxn.tools.peers import PeerUnavailable, spark_kafka_jars

# Why the session has no Kafka connector ("" when it has one).
KAFKA_CONNECTOR_MISSING: list[str] = []


def _connector_configs() -> dict[str, str]:
    KAFKA_CONNECTOR_MISSING.clear()
    try:
        return {"spark.jars": ",".join(spark_kafka_jars())}
    except PeerUnavailable as exc:
        KAFKA_CONNECTOR_MISSING.append(str(exc))
        return {}


@pytest.fixture(scope="package")
def spark(ray_session: object) -> Iterator[object]:
    session = sc.init_spark("raytxn-tests", num_executors=1, executor_cores=1, executor_memory="1g",
                            **{"spark.sql.shuffle.partitions": "3", **_connector_configs()})
    assert sc.init_spark("again") is session  # idempotent
    try:
        yield session
    finally:
        sc.stop_spark()
        sc.stop_spark()  # idempotent


@pytest.fixture
def spark_kafka(spark: object) -> object:
    """The package's session, which has Spark's Kafka connector (or the test skips, saying why)."""
    if KAFKA_CONNECTOR_MISSING:
        pytest.skip(f"Spark's Kafka connector is not on this session: {KAFKA_CONNECTOR_MISSING[0]}")
    return spark
