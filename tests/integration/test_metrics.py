"""The engine's metrics as an operator sees them: traffic on a real engine (produce, consume, commit,
abort, a timeout, an actor restart), then Ray's Prometheus endpoint of the local node is scraped
over HTTP and the raytxn series are checked against what the test did.

Ray exports on a timer (about every 10 s by default), so every check polls the endpoint until the
expectation holds or a deadline passes. Counters are compared as deltas per series against a scrape
taken before the traffic: other modules of the session share this Ray, and a dead worker's series
may vanish from the export at any time (a vanished series then drops out of the delta instead of
lowering it). Topic-tagged series are exact, because every topic here has a fresh name."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.cluster import stop_actor
from raytxn.errors import ParticipantEndFailed
from raytxn.ids import NAMESPACE, partition_actor_name
from raytxn.tools.testing import start_participant
from tests.engine import engine_client
from tests.prometheus import Scrape, delta, scrape, select, total, wait_for_metrics

pytestmark = pytest.mark.ray

SUBSCRIPTION = "metrics-sub"


@dataclass
class Traffic:
    """What the module fixture did, for the tests to compare the metrics with."""

    baseline: Scrape
    topic: str                  # 2 partitions: plain sends, committed, aborted and timed-out txns
    appended_messages: int      # every message the partitions stored (aborted ones too)
    appended_value_bytes: int   # their payload bytes
    consumed_messages: int
    consumed_value_bytes: int
    begun: int
    committed: int
    aborted: int                # by the client; the timed-out one comes on top
    timed_out: int


SLOW_TXN_MS = 1000  # this module's engine counts a transaction as slow after a second


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, slow_txn_threshold_ms=SLOW_TXN_MS)


@pytest.fixture(scope="module")
def traffic(client: rt.Client) -> Traffic:
    baseline = scrape()
    topic = f"metrics-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=2)
    producer = client.create_producer(topic)
    values: list[bytes] = []

    def send(value: bytes, txn: rt.Transaction | None = None) -> None:
        producer.send(value, key=f"k{len(values)}", txn=txn)
        values.append(value)

    for i in range(20):
        send(f"plain-{i}".encode())
    visible_bytes = sum(map(len, values))
    for i in range(3):
        with client.transaction(timeout=30) as txn:
            send(f"committed-{i}-a".encode(), txn)
            send(f"committed-{i}-b".encode(), txn)
            visible_bytes += len(values[-1]) + len(values[-2])
    for i in range(2):
        txn = client.new_transaction(timeout=30)
        send(f"aborted-{i}".encode(), txn)
        txn.abort()
    doomed = client.new_transaction(timeout=0.3)  # left open: the coordinator times it out
    send(b"timed-out", doomed)

    consumer = client.subscribe(topic, SUBSCRIPTION, initial_position="earliest")
    visible = 20 + 3 * 2
    with client.transaction(timeout=30) as txn:
        for _ in range(visible):
            consumer.acknowledge(consumer.receive(timeout=10), txn=txn)
    consumer.close()
    return Traffic(baseline, topic, appended_messages=len(values), appended_value_bytes=sum(map(len, values)),
                   consumed_messages=visible, consumed_value_bytes=visible_bytes,
                   begun=3 + 2 + 1 + 1, committed=3 + 1, aborted=2, timed_out=1)


def test_transaction_counters_and_commit_latency(traffic: Traffic) -> None:
    before = traffic.baseline

    def grown(samples: Scrape) -> bool:
        return (delta(samples, before, "ray_raytxn_txns_begun_total") >= traffic.begun
                and delta(samples, before, "ray_raytxn_txns_committed_total") >= traffic.committed
                and delta(samples, before, "ray_raytxn_txns_aborted_total") >= traffic.aborted + traffic.timed_out
                and delta(samples, before, "ray_raytxn_txns_timed_out_total") >= traffic.timed_out
                and delta(samples, before, "ray_raytxn_commit_latency_ms_count") >= traffic.committed)

    samples = wait_for_metrics(grown, "the module's transactions")
    # Tagged by coordinator: both default coordinators appear among the series.
    assert {dict(key)["tc_id"] for key in select(samples, "ray_raytxn_txns_begun_total")} >= {"0", "1"}
    buckets = select(samples, "ray_raytxn_commit_latency_ms_bucket")
    assert buckets and {dict(key)["le"] for key in buckets} >= {"1.0", "100.0", "+Inf"}
    assert total(samples, "ray_raytxn_commit_latency_ms_sum") > 0


def test_append_and_dispatch_per_topic(traffic: Traffic) -> None:
    topic = traffic.topic

    def complete(samples: Scrape) -> bool:
        return (total(samples, "ray_raytxn_append_messages_total", topic=topic) >= traffic.appended_messages
                and total(samples, "ray_raytxn_dispatch_messages_total", topic=topic) >= traffic.consumed_messages)

    samples = wait_for_metrics(complete, f"appends and dispatches of {topic}")
    # Exact: retried sends are deduplicated, and aborted data is appended like any other.
    assert total(samples, "ray_raytxn_append_messages_total", topic=topic) == traffic.appended_messages
    assert {dict(key)["partition"] for key in select(samples, "ray_raytxn_append_messages_total", topic=topic)} \
        == {"0", "1"}
    # Bytes are the encoded messages: the payload plus a few bytes of framing and key each.
    appended_bytes = total(samples, "ray_raytxn_append_bytes_total", topic=topic)
    assert traffic.appended_value_bytes < appended_bytes <= traffic.appended_value_bytes \
        + 32 * traffic.appended_messages
    dispatch = select(samples, "ray_raytxn_dispatch_messages_total", topic=topic)
    assert {dict(key)["subscription"] for key in dispatch} == {SUBSCRIPTION}
    assert sum(dispatch.values()) >= traffic.consumed_messages  # redeliveries would add to it
    assert total(samples, "ray_raytxn_dispatch_bytes_total", topic=topic) > traffic.consumed_value_bytes


@pytest.mark.extended  # the suite's budget (23 s); the gauges' other tests stay
def test_max_read_lag_and_pending_ack_gauges(client: rt.Client) -> None:
    """An open txn holds back readers and holds an ack: the gauges show it, and drop to 0 once it
    commits."""
    topic = f"metrics-gauges-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    producer = client.create_producer(topic)
    producer.send(b"before")
    consumer = client.subscribe(topic, SUBSCRIPTION, initial_position="earliest")
    message = consumer.receive(timeout=10)
    txn = client.new_transaction(timeout=120)
    for i in range(3):
        producer.send(f"held-{i}".encode(), txn=txn)
    consumer.acknowledge(message, txn=txn)

    def gauge(samples: Scrape, name: str) -> float | None:
        series = select(samples, name, topic=topic)
        return max(series.values()) if series else None

    wait_for_metrics(lambda s: (gauge(s, "ray_raytxn_max_read_lag_entries") or 0) >= 3
                     and gauge(s, "ray_raytxn_pending_ack_txns") == 1
                     and gauge(s, "ray_raytxn_pending_ack_positions") == 1,
                     f"the open txn's lag and pending ack on {topic}")
    txn.commit()
    wait_for_metrics(lambda s: gauge(s, "ray_raytxn_max_read_lag_entries") == 0
                     and gauge(s, "ray_raytxn_pending_ack_txns") == 0
                     and gauge(s, "ray_raytxn_pending_ack_positions") == 0,
                     f"no lag and no pending ack on {topic} after the commit")
    assert [m.value() for m in (consumer.receive(timeout=10) for _ in range(3))] == [b"held-0", b"held-1", b"held-2"]
    consumer.close()


@pytest.mark.extended  # the suite's budget (30 s); the gauges' other tests stay
def test_slow_transactions_gauge_per_coordinator(client: rt.Client) -> None:
    """A transaction left open past the threshold counts on its coordinator's gauge until it
    ends. Its series is the one that rose (a dead worker of an earlier module may still export
    an old value under the same tc_id)."""
    topic = f"metrics-slow-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    before = scrape()
    txn = client.new_transaction(timeout=120)
    client.create_producer(topic).send(b"held", txn=txn)
    tc_id = str(txn.id.tc_id)

    def rose(samples: Scrape) -> set[tuple[tuple[str, str], ...]]:
        return {key for key, value in select(samples, "ray_raytxn_slow_txns", tc_id=tc_id).items()
                if value >= 1 and before.get(("ray_raytxn_slow_txns", key), 0.0) < 1}

    series = rose(wait_for_metrics(lambda s: bool(rose(s)), f"the slow transaction on coordinator {tc_id}"))
    assert client.coordinator_stats()[txn.id.tc_id]["slow_txns"] >= 1
    assert [row["txn"] for row in client.list_transactions(older_than=SLOW_TXN_MS / 1000)] == [str(txn.id)]
    txn.abort()
    wait_for_metrics(lambda s: all(s.get(("ray_raytxn_slow_txns", key)) == 0 for key in series),
                     f"no slow transaction on coordinator {tc_id} after the abort")


def test_ledger_put_latency_and_recoveries(traffic: Traffic) -> None:
    before = traffic.baseline

    def recorded(samples: Scrape) -> bool:
        kinds = ("coordinator", "partition", "subscription")
        return (all(delta(samples, before, "ray_raytxn_ledger_put_latency_ms_count", stream_kind=kind) > 0
                    for kind in ("coordinator_log", "partition", "subscription"))
                and total(samples, "ray_raytxn_recoveries_total", actor_kind="coordinator") >= 2
                and delta(samples, before, "ray_raytxn_recoveries_total", actor_kind="partition") >= 2
                and delta(samples, before, "ray_raytxn_recoveries_total", actor_kind="subscription") >= 2
                # each recovery is also timed (the two are recorded together, exported together soon)
                and all(total(samples, "ray_raytxn_recovery_duration_ms_count", actor_kind=kind)
                        == total(samples, "ray_raytxn_recoveries_total", actor_kind=kind) for kind in kinds))

    wait_for_metrics(recorded, "ledger puts of every stream kind and the actors' recoveries")
    # (The supervisor's catalog is a stream property, written by compare-and-set: no entry puts.)


def test_restarted_partition_reports_its_recovery(client: rt.Client) -> None:
    """A partition killed and restarted by Ray recovers in a new worker process, which reports
    its recovery (the gauge, set at every recovery, tells which worker serves the topic)."""
    topic = f"metrics-restart-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    partition = ActorRef(partition_actor_name(topic, 0))
    old = partition.call("ready")["incarnation"]

    def workers(samples: Scrape) -> set[str]:
        return {dict(key)["WorkerId"] for key in select(samples, "ray_raytxn_max_read_lag_entries", topic=topic)}

    first = wait_for_metrics(lambda s: bool(workers(s)), f"the lag gauge of {topic}")
    ray.kill(ray.get_actor(partition_actor_name(topic, 0), namespace=NAMESPACE), no_restart=False)
    deadline = time.monotonic() + 30
    while partition.call("ready")["incarnation"] <= old:  # the kill lands asynchronously
        assert time.monotonic() < deadline, "the partition did not restart"
        time.sleep(0.05)

    def recovered_in_new_worker(samples: Scrape) -> bool:
        new = workers(samples) - workers(first)
        recovered = {dict(key)["WorkerId"]
                     for key in select(samples, "ray_raytxn_recoveries_total", actor_kind="partition")}
        return bool(new & recovered)

    wait_for_metrics(recovered_in_new_worker, f"the recovery of {topic}'s restarted partition")


def test_refused_end_is_counted_by_error_kind(client: rt.Client) -> None:
    """A participant refusing an end with a non-retriable error shows in the end-failure counter,
    tagged by the error's kind; the txn commits once it is driven again and the end is taken."""
    topic = f"metrics-refused-{uuid.uuid4().hex[:8]}"  # no such topic: a stand-in under its partition's name
    name = partition_actor_name(topic, 0)
    refusing = start_participant(name)
    try:
        ray.get(refusing.fail_next.remote(1, refuse=True))
        txn = client.new_transaction(timeout=60)
        client.coordinators.add_partitions(txn.id, [(topic, 0)])
        before = scrape()
        with pytest.raises(ParticipantEndFailed):
            txn.commit()
        tc_id = str(txn.id.tc_id)
        wait_for_metrics(lambda s: delta(s, before, "ray_raytxn_txn_end_failures_total", tc_id=tc_id,
                                         error="InvalidTxnState") == 1,
                         "the refused end in the end-failure counter")
        assert client.coordinators.end_txn(txn.id, "COMMIT") == "COMMITTED"  # driven again: taken
        assert ray.get(refusing.attempts.remote()) == 2
    finally:
        stop_actor(name)
