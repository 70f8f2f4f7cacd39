"""The real-client tests of one gateway, run again on a peer group of two (``start_gateways``).

Every test here is one of ``test_kafka_gateway.py`` or ``test_kafka_groups.py``, imported whole:
pytest collects it here, where ``bootstrap`` is the two gateways' bootstrap list. The clients
(kafka-python, confluent-kafka, kcat) then spread their partitions over both gateways, find each
group's coordinator at one of them, and send a transaction's requests to both, so each test
checks with two gateways what it checks with one. Left out are the tests that reach one gateway
by itself (its actor, its stats, a raw connection, its restart, the one port Metadata names).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.kafka.gateway import start_gateways, stop_gateways
from tests.engine import engine_client, wait_for
from tests.integration.test_kafka_gateway import (
    test_confluent_idempotent_producer_and_read_committed_consumer,
    test_confluent_transactional_producer_commit_abort_and_fencing,
    test_kafka_python_produces_and_consumes_in_assign_mode,
    test_kcat_lists_metadata_and_consumes,
    test_mixed_use_kafka_and_raytxn_clients,
    test_offsets_for_times_with_confluent_kafka,
)
from tests.integration.test_kafka_groups import (
    test_a_group_consumer_commits_and_the_next_one_resumes_after_it,
    test_admin_lists_describes_and_deletes_groups,
    test_commit_metadata_is_kept_durably_and_with_transactions,
    test_exactly_once_consume_transform_produce_with_an_aborted_round,
    test_exactly_once_under_actor_kills,
    test_offset_delete_forgets_a_partitions_committed_offset,
    test_two_consumers_of_a_group_split_the_partitions,
)

pytestmark = pytest.mark.ray
GROUP = "two-gateways"

ON_TWO_GATEWAYS = (  # collected here, on the fixtures below (and named, so ruff keeps the imports)
    test_confluent_idempotent_producer_and_read_committed_consumer,
    test_confluent_transactional_producer_commit_abort_and_fencing,
    test_kafka_python_produces_and_consumes_in_assign_mode,
    test_kcat_lists_metadata_and_consumes,
    test_mixed_use_kafka_and_raytxn_clients,
    test_offsets_for_times_with_confluent_kafka,
    test_a_group_consumer_commits_and_the_next_one_resumes_after_it,
    test_admin_lists_describes_and_deletes_groups,
    test_commit_metadata_is_kept_durably_and_with_transactions,
    test_exactly_once_consume_transform_produce_with_an_aborted_round,
    test_exactly_once_under_actor_kills,
    test_offset_delete_forgets_a_partitions_committed_offset,
    test_two_consumers_of_a_group_split_the_partitions,
)


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def gateways(client: rt.Client) -> Iterator[list[dict[str, Any]]]:
    addresses = start_gateways(2, 0, peer_group=GROUP, bind_host="127.0.0.1", advertised_host="127.0.0.1",
                               initial_rebalance_delay_ms=0)
    try:
        wait_for(lambda: all(ray.get(a["actor"].stats.remote())["peers"] == [0, 1] for a in addresses),
                 what="each gateway lists both")
        yield addresses
    finally:
        stop_gateways(GROUP)


@pytest.fixture
def bootstrap(gateways: list[dict[str, Any]]) -> str:
    return ",".join(a["bootstrap"] for a in gateways)


def test_both_gateways_served_the_tests_before(gateways: list[dict[str, Any]]) -> None:
    """Runs last (the file's order): the tests above did reach both gateways, each with produce,
    fetch and group requests, so none of them ran on one gateway alone."""
    for address in gateways:
        versions = ray.get(address["actor"].stats.remote())["versions"]
        served = {int(key.split("/")[0]) for key, n in versions.items() if n > 0}
        assert {0, 1, 3} <= served, (address["node_id"], sorted(served))  # Produce, Fetch, Metadata
    assert any(11 in {int(k.split("/")[0]) for k in ray.get(a["actor"].stats.remote())["versions"]}
               for a in gateways)  # JoinGroup, at a group's coordinator
