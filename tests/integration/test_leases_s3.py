"""The bulk path on SeaweedFS S3: an engine on S3, a lease planned by the driver, its chunks read
straight from the bucket by Ray tasks and by Ray Data's read tasks, acknowledged in a txn."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.connectors.ray_data import read_topic
from raytxn.tools.seaweedfs import SeaweedFS
from tests.conftest import TEST_BUCKET

pytestmark = [pytest.mark.ray, pytest.mark.s3]


@pytest.fixture(scope="module")
def s3_client(ray_session: object, seaweedfs: SeaweedFS) -> Iterator[rt.Client]:
    stop_engine()
    url = seaweedfs.url(TEST_BUCKET, f"leases-{uuid.uuid4().hex[:8]}")
    client = rt.connect(storage=url, storage_options=seaweedfs.storage_options(), deadline_s=120)
    try:
        yield client
    finally:
        client.close()
        stop_engine()


@ray.remote(num_cpus=0)
def read_values(chunk: rt.RangeChunk) -> list[bytes]:
    return chunk.read(columns=["value"]).column("value").to_pylist()


def test_chunks_of_a_lease_are_read_from_the_bucket_by_ray_tasks(s3_client: rt.Client) -> None:
    client = s3_client
    topic = f"s3-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2)
    producer = client.create_producer(topic, batching_max_messages=7)
    committed = client.new_transaction()
    for i in range(100):
        producer.send(f"c{i}".encode(), key=str(i), txn=committed)
    aborted = client.new_transaction()
    producer.send(b"aborted", key="0", txn=aborted)
    producer.flush()
    aborted.abort()
    committed.commit()
    leases = client.lease_ranges(topic, "bulk", "reader")
    chunks = leases.chunks(max_entries=3)
    assert len(chunks) > 2 and all(chunk.storage_url.startswith("s3://") for chunk in chunks)
    read = [value for values in ray.get([read_values.remote(c) for c in chunks]) for value in values]
    assert sorted(read) == sorted(f"c{i}".encode() for i in range(100))
    txn = client.new_transaction()
    leases.acknowledge(txn)
    txn.commit()
    assert not client.lease_ranges(topic, "bulk", "reader")


def test_ray_data_reads_a_topic_on_s3(s3_client: rt.Client) -> None:
    client = s3_client
    topic = f"s3rd-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 3)
    producer = client.create_producer(topic)
    for i in range(300):
        producer.send_async(f"r{i}".encode(), key=str(i))
    producer.flush()
    ds, handle = read_topic(client, topic, "rd", min_chunks=4)
    try:
        assert sorted(row["value"] for row in ds.take_all()) == sorted(f"r{i}".encode() for i in range(300))
    finally:
        handle.close()
