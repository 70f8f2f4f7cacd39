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

import raytxn as rt
from tests.engine import engine_client
from tests.integration.test_kafka_gateway import (  # noqa: F401 - collected here, on the fixtures below
    test_confluent_idempotent_producer_and_read_committed_consumer,
    test_confluent_transactional_producer_commit_abort_and_fencing,
    test_kafka_python_produces_and_consumes_in_assign_mode,
    test_kcat_lists_metadata_and_consumes,
    test_mixed_use_kafka_and_raytxn_clients,
    test_offsets_for_times_with_confluent_kafka,
)
from tests.integration.test_kafka_groups import (  # noqa: F401 - as above
    test_a_group_consumer_commits_and_the_next_one_resumes_after_it,
    test_admin_lists_describes_and_deletes_groups,
    test_commit_metadata_is_kept_durably_and_with_transactions,
    test_exactly_once_consume_transform_produce_with_an_aborted_round,
    test_exactly_once_under_actor_kills,
    test_offset_delete_forgets_a_partitions_committed_offset,
    test_two_consumers_of_a_group_split_the_partitions,
)
from tests.kafka_clients import peer_group_addresses, served_api_keys

pytestmark = pytest.mark.ray
GROUP = "two-gateways"


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def gateways(client: rt.Client) -> Iterator[list[dict[str, Any]]]:
    yield from peer_group_addresses(GROUP)


@pytest.fixture
def bootstrap(gateways: list[dict[str, Any]]) -> str:
    return ",".join(a["bootstrap"] for a in gateways)


def test_both_gateways_served_the_tests_before(gateways: list[dict[str, Any]]) -> None:
    """Runs last (the file's order): the tests above did reach both gateways, each with produce,
    fetch and group requests, so none of them ran on one gateway alone."""
    served = [served_api_keys(address) for address in gateways]
    for address, keys in zip(gateways, served, strict=True):
        assert {0, 1, 3} <= keys, (address["node_id"], sorted(keys))  # Produce, Fetch, Metadata
    assert any(11 in keys for keys in served)  # JoinGroup, at a group's coordinator
