"""One Spark session (Spark on the test session's Ray, through RayDP) for the whole spark package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raytxn.connectors import spark as sc


@pytest.fixture(scope="package")
def spark(ray_session: object) -> Iterator[object]:
    session = sc.init_spark("raytxn-tests", num_executors=1, executor_cores=1, executor_memory="1g",
                            **{"spark.sql.shuffle.partitions": "3"})
    assert sc.init_spark("again") is session  # idempotent
    try:
        yield session
    finally:
        sc.stop_spark()
        sc.stop_spark()  # idempotent
