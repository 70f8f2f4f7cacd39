"""The engine's metrics, through ``ray.util.metrics``: Ray's metrics agent exports them on each
node's Prometheus endpoint (``ray.nodes()[i]["MetricsExportPort"]``) and the dashboard shows them.

Ray prefixes every name with ``ray_`` and counters get a ``_total`` suffix, so the counter
``raytxn_txns_committed`` is scraped as ``ray_raytxn_txns_committed_total``. Ray also adds its own
labels (``WorkerId``, ``NodeAddress``, ``SessionName``...). Histogram sums are approximate: Ray's
exporter rebuilds them from bucket midpoints.

The Ray metric objects are created on first use and cached per process (one actor per process,
but one set serves any number of actors or ledgers in it). Where Ray is not initialized (pure
unit tests drive the actors' building blocks without Ray) every call is a no-op costing one
attribute check. Actors and ledgers hold a small scope object with their tags built once, and
record once per batch or entry, never per message.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Milliseconds: a local put takes about one, a stalled storage or a slow participant up to a minute.
LATENCY_BOUNDARIES_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000]
RECOVERY_BOUNDARIES_MS = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000, 120_000, 300_000]

PARTITION_TAGS = ("topic", "partition")
SUBSCRIPTION_TAGS = ("topic", "partition", "subscription")

# Ledger streams by the first part of their name (see the actors' *_stream functions), so the put
# latency is reported per kind of stream rather than per stream (bounded label values).
STREAM_KINDS = {"coordinator": "coordinator_log", "topics": "partition", "subscriptions": "subscription"}


def stream_kind(stream: str) -> str:
    """The stream kind label of a ledger stream name: ``topics/orders/0`` -> ``partition``."""
    first = stream.split("/", 1)[0]
    return STREAM_KINDS.get(first, first)


class EngineMetrics:
    """Every metric of the engine, created in this process's Ray core worker."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge, Histogram

        self.txns_begun = Counter("raytxn_txns_begun", "Transactions begun (new_txn logged).",
                                  tag_keys=("tc_id",))
        self.txns_committed = Counter("raytxn_txns_committed", "Transactions that reached COMMITTED.",
                                      tag_keys=("tc_id",))
        self.txns_aborted = Counter("raytxn_txns_aborted",
                                    "Transactions that reached ABORTED (by the client, a timeout or fencing).",
                                    tag_keys=("tc_id",))
        self.txns_timed_out = Counter("raytxn_txns_timed_out", "Transactions aborted by their timeout.",
                                      tag_keys=("tc_id",))
        self.txn_end_failures = Counter(
            "raytxn_txn_end_failures",
            "Ends a participant refused with a non-retriable error, by its kind: the transaction stays "
            "COMMITTING/ABORTING until driven again (the coordinator's restart, or the next end_txn).",
            tag_keys=("tc_id", "error"))
        self.open_txns = Gauge(
            "raytxn_open_txns", "Live transactions of a coordinator (open, or still committing/aborting).",
            tag_keys=("tc_id",))
        self.slow_txns = Gauge(
            "raytxn_slow_txns",
            "Live transactions (open, or still committing/aborting) begun longer ago than the coordinator's "
            "slow_txn_threshold_ms: hanging ones holding back readers.", tag_keys=("tc_id",))
        self.commit_latency_ms = Histogram(
            "raytxn_commit_latency_ms", "From an end_txn(COMMIT) request to the transaction's final state, in ms.",
            boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("tc_id",))
        self.append_messages = Counter("raytxn_append_messages", "Messages appended to a partition (not duplicates).",
                                       tag_keys=PARTITION_TAGS)
        self.append_bytes = Counter("raytxn_append_bytes", "Bytes of encoded messages appended to a partition.",
                                    tag_keys=PARTITION_TAGS)
        self.dispatch_messages = Counter("raytxn_dispatch_messages",
                                         "Messages handed to consumers of a subscription (redeliveries too).",
                                         tag_keys=SUBSCRIPTION_TAGS)
        self.dispatch_bytes = Counter("raytxn_dispatch_bytes",
                                      "Bytes of encoded messages handed to consumers of a subscription.",
                                      tag_keys=SUBSCRIPTION_TAGS)
        self.max_read_lag_entries = Gauge(
            "raytxn_max_read_lag_entries",
            "Partition entries after max_read_position: held back from readers by the oldest open txn.",
            tag_keys=PARTITION_TAGS)
        self.subscription_backlog_messages = Gauge(
            "raytxn_subscription_backlog_messages",
            "Messages a subscription has still to consume up to the readable end (unacked; markers and aborted "
            "messages not counted): counted while it has consumers or a lease, and on stats(backlog=True).",
            tag_keys=SUBSCRIPTION_TAGS)
        self.pending_ack_txns = Gauge("raytxn_pending_ack_txns", "Transactions with acks pending in a subscription.",
                                      tag_keys=SUBSCRIPTION_TAGS)
        self.pending_ack_positions = Gauge("raytxn_pending_ack_positions",
                                           "Entries with a transactional ack pending in a subscription.",
                                           tag_keys=SUBSCRIPTION_TAGS)
        self.ledger_put_latency_ms = Histogram(
            "raytxn_ledger_put_latency_ms", "One ledger object put until durable (storage retries included), in ms.",
            boundaries=LATENCY_BOUNDARIES_MS, tag_keys=("stream_kind",))
        self.recoveries = Counter("raytxn_recoveries", "Actor recoveries completed (every incarnation's start).",
                                  tag_keys=("actor_kind",))
        self.recovery_duration_ms = Histogram(
            "raytxn_recovery_duration_ms", "An incarnation's recovery (open its ledgers, restore, replay), in ms.",
            boundaries=RECOVERY_BOUNDARIES_MS, tag_keys=("actor_kind",))
        self.actors = Gauge("raytxn_actors", "Partition and subscription actors by state: active (a live process) "
                            "or dormant (passivated or never started; the next call activates it).",
                            tag_keys=("actor_kind", "state"))
        self.actor_restarts = Counter(
            "raytxn_actor_restarts", "Actor restarts the supervisor saw (a new incarnation of a live actor: "
            "a crash Ray restarted, or a coordinator created again).", tag_keys=("actor_kind",))
        self.passivations = Counter("raytxn_passivations", "Idle actors passivated by the supervisor.",
                                    tag_keys=("actor_kind",))
        self.activations = Counter("raytxn_activations", "Dormant actors activated on a call.",
                                   tag_keys=("actor_kind",))
        self.kafka_refusals = Counter(
            "raytxn_kafka_refusals",
            "Kafka gateway requests refused by its security: unauthenticated, unauthorized, failed logins, "
            "sessions past their token's expiry; by reason (the Kafka error's name).",
            tag_keys=("reason",))


_engine_metrics: EngineMetrics | None = None
_creation_lock = threading.Lock()


_off = False  # set by ``not_recorded``: the simulator runs actors in a process without a Ray


@contextmanager
def not_recorded() -> Iterator[None]:
    """Record nothing meanwhile, without asking Ray whether it is there on each call: the
    simulator runs the actors' code where Ray is imported but never started, and every metric
    call asked it (a twentieth of a simulated run's time)."""
    global _off
    before, _off = _off, True
    try:
        yield
    finally:
        _off = before


def engine_metrics() -> EngineMetrics | None:
    """This process's metrics, created on first call; None when Ray is not initialized here
    (then nothing is recorded). Never imports Ray: a process that did not import it has no Ray."""
    global _engine_metrics
    if _engine_metrics is not None:
        return _engine_metrics
    if _off:
        return None
    ray: Any = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or _is_ray_client():
        return None
    with _creation_lock:
        if _engine_metrics is None:
            _engine_metrics = EngineMetrics()
    return _engine_metrics


def _is_ray_client() -> bool:
    """A driver connected through ``ray://`` has no core worker to record in."""
    client = sys.modules.get("ray.util.client")
    return client is not None and client.ray.is_connected()


class _Scope:
    """Tags of one actor or ledger, built once; the metrics are looked up until Ray is there."""

    __slots__ = ("_metrics", "_tags")

    def __init__(self, tags: dict[str, str]) -> None:
        self._tags = tags
        self._metrics: EngineMetrics | None = None

    def _get(self) -> EngineMetrics | None:
        if self._metrics is None:
            self._metrics = engine_metrics()
        return self._metrics


class CoordinatorMetrics(_Scope):
    def __init__(self, tc_id: int) -> None:
        super().__init__({"tc_id": str(tc_id)})

    def txn_begun(self) -> None:
        if (m := self._get()) is not None:
            m.txns_begun.inc(1, self._tags)

    def txn_ended(self, committed: bool) -> None:
        if (m := self._get()) is not None:
            (m.txns_committed if committed else m.txns_aborted).inc(1, self._tags)

    def txn_timed_out(self) -> None:
        if (m := self._get()) is not None:
            m.txns_timed_out.inc(1, self._tags)

    def end_failed(self, error_kind: str) -> None:
        """A participant refused an end with a non-retriable error (``error_kind``: its class name)."""
        if (m := self._get()) is not None:
            m.txn_end_failures.inc(1, {**self._tags, "error": error_kind})

    def commit_latency(self, latency_ms: float) -> None:
        if (m := self._get()) is not None:
            m.commit_latency_ms.observe(latency_ms, self._tags)

    def slow_txns(self, count: int) -> None:
        if (m := self._get()) is not None:
            m.slow_txns.set(count, self._tags)

    def open_txns(self, count: int) -> None:
        if (m := self._get()) is not None:
            m.open_txns.set(count, self._tags)


class PartitionMetrics(_Scope):
    def __init__(self, topic: str, partition: int) -> None:
        super().__init__({"topic": topic, "partition": str(partition)})

    def appended(self, messages: int, size_bytes: int) -> None:
        if (m := self._get()) is not None:
            m.append_messages.inc(messages, self._tags)
            if size_bytes > 0:  # Ray counters refuse increments of 0
                m.append_bytes.inc(size_bytes, self._tags)

    def max_read_lag(self, entries: int) -> None:
        if (m := self._get()) is not None:
            m.max_read_lag_entries.set(entries, self._tags)


class SubscriptionMetrics(_Scope):
    def __init__(self, topic: str, partition: int, subscription: str) -> None:
        super().__init__({"topic": topic, "partition": str(partition), "subscription": subscription})

    def dispatched(self, messages: int, size_bytes: int) -> None:
        if messages and (m := self._get()) is not None:
            m.dispatch_messages.inc(messages, self._tags)
            if size_bytes > 0:
                m.dispatch_bytes.inc(size_bytes, self._tags)

    def backlog(self, messages: int) -> None:
        if (m := self._get()) is not None:
            m.subscription_backlog_messages.set(messages, self._tags)

    def pending_ack(self, txns: int, positions: int) -> None:
        if (m := self._get()) is not None:
            m.pending_ack_txns.set(txns, self._tags)
            m.pending_ack_positions.set(positions, self._tags)


class LedgerMetrics(_Scope):
    def __init__(self, stream: str) -> None:
        super().__init__({"stream_kind": stream_kind(stream)})

    def put_latency(self, latency_ms: float) -> None:
        if (m := self._get()) is not None:
            m.ledger_put_latency_ms.observe(latency_ms, self._tags)


def recovered(actor_kind: str, duration_ms: float) -> None:
    """One completed recovery of an actor of ``actor_kind`` (coordinator, partition, subscription)."""
    if (m := engine_metrics()) is not None:
        tags = {"actor_kind": actor_kind}
        m.recoveries.inc(1, tags)
        m.recovery_duration_ms.observe(duration_ms, tags)


def actor_states(counts: dict[tuple[str, str], int]) -> None:
    """How many actors of each (kind, state) there are now (the supervisor's watcher)."""
    if (m := engine_metrics()) is not None:
        for (kind, state), count in counts.items():
            m.actors.set(count, {"actor_kind": kind, "state": state})


def restarted(actor_kind: str) -> None:
    """The supervisor saw a new incarnation of a live actor of ``actor_kind``."""
    if (m := engine_metrics()) is not None:
        m.actor_restarts.inc(1, {"actor_kind": actor_kind})


def passivated(actor_kind: str) -> None:
    if (m := engine_metrics()) is not None:
        m.passivations.inc(1, {"actor_kind": actor_kind})


def activated(actor_kind: str) -> None:
    if (m := engine_metrics()) is not None:
        m.activations.inc(1, {"actor_kind": actor_kind})


def kafka_refused(reason: str) -> None:
    """A Kafka gateway refused a request or a login (``reason``: a bounded set of names)."""
    if (m := engine_metrics()) is not None:
        m.kafka_refusals.inc(1, {"reason": reason})
