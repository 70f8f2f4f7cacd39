"""The client: ``raytxn.connect()`` and what hangs off it.

    import raytxn as rt
    client = rt.connect()                                  # local Ray, file://./.raytxn-data
    client.create_topic("orders", partitions=4)
    producer = client.create_producer("orders")
    with client.transaction(timeout=60) as txn:            # commit on exit, abort on exception
        producer.send(b"payload", key="k1", txn=txn)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import time
import uuid
import weakref
from collections.abc import Coroutine, Iterator
from dataclasses import fields, replace
from typing import Any

import ray

from raytxn.auth import AuthConfig
from raytxn.client import restarts
from raytxn.client.consumer import Consumer, ConsumerType, InitialPosition, check_receiver_queue
from raytxn.client.coordinator_client import CoordinatorClient
from raytxn.client.faults import Faults
from raytxn.client.leases import LeaseSet, lease_partitions
from raytxn.client.loop import BackgroundLoop
from raytxn.client.producer import Producer
from raytxn.client.reader import CompactedReader
from raytxn.client.rpc import ActorRef, _forget_supervisor
from raytxn.client.table_view import TableView
from raytxn.client.transaction import Transaction
from raytxn.client.txn_chain import TxnChain
from raytxn.config import CoordinatorConfig, EngineConfig, parse_duration
from raytxn.errors import InvalidArgument, TopicAlreadyExists, TopicNotFound, TransactionNotFound
from raytxn.gc_freeze import freeze_startup_objects
from raytxn.ids import (
    NAMESPACE,
    SUPERVISOR_NAME,
    TxnID,
    parse_txn_id,
    partition_actor_name,
    subscription_actor_name,
)
from raytxn.ledger.formats import DEFAULT_WRITE_FORMAT, WRITE_FORMAT_OPTION, check_write_format
from raytxn.ledger.storage import DEFAULT_URL
from raytxn.protocol.compaction import DEFAULT_DELETE_RETENTION_MS
from raytxn.protocol.coordinator_rules import check_timeout_ms

log = logging.getLogger(__name__)

# The clients of this process not closed yet (weakly: a client nobody holds is no one's to close).
_open_clients: weakref.WeakSet[Client] = weakref.WeakSet()


def connect(storage: str | None = None, address: str | None = None, *, owner: str | None = None,
            storage_options: dict[str, Any] | None = None, deadline_s: float = 60.0, token: str | None = None,
            auth_secret: str | None = None, **config: Any) -> Client:
    """Join (or start) a Ray cluster and the raytxn engine on it, and return a client.

    With nothing given, starts a local Ray (or joins the one running in this process) and stores
    everything under ``file://./.raytxn-data``. ``address`` joins an existing cluster (``"auto"``
    or ``ray://host:port``). Starts the supervisor and coordinators unless they already run, in
    which case it attaches to them (and their storage wins). ``config`` overrides EngineConfig
    and CoordinatorConfig fields for a new engine, e.g. ``num_coordinators=3``.

    Auth (runtime/auth.py): a new engine enforces tokens and permissions when ``auth_secret`` (or
    the ``RAYTXN_AUTH_SECRET`` environment variable) is set; ``superusers=(...)`` names its
    superusers. ``token`` (or ``RAYTXN_TOKEN``) is what this client presents (given the secret and
    no token, it acts as the first superuser); a bad token fails here with ``AuthenticationFailed``."""
    token = token if token is not None else os.environ.get("RAYTXN_TOKEN") or None
    auth_secret = auth_secret if auth_secret is not None else os.environ.get("RAYTXN_AUTH_SECRET") or None
    engine = _engine_config(storage, storage_options or {}, config, auth_secret)  # bad options: before Ray
    started_ray = False
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, include_dashboard=False, logging_level=logging.WARNING,
                 configure_logging=True)
        started_ray = address is None
    if token is None and auth_secret is not None:
        # Whoever holds the secret can mint any token: act as the first superuser.
        from raytxn.auth import create_token

        token = create_token(auth_secret, engine.auth.superusers[0])
    from raytxn.actors.supervisor import SupervisorActor

    supervisor = SupervisorActor.options(name=SUPERVISOR_NAME, namespace=NAMESPACE, lifetime="detached",
                                         get_if_exists=True, resources=engine.actor_resources).remote(engine)
    ready = ray.get(supervisor.ready.remote())
    client = Client(ready["config"], owner=owner, deadline_s=deadline_s, token=token)
    client._started_ray = started_ray
    if client.config.auth.enabled:
        client.whoami()  # a missing, forged or expired token fails now rather than at first use
    return client


def _engine_config(storage: str | None, storage_options: dict[str, Any], overrides: dict[str, Any],
                   auth_secret: str | None = None) -> EngineConfig:
    engine = EngineConfig(storage_url=storage or DEFAULT_URL, storage_options=storage_options)
    superusers = overrides.pop("superusers", None)
    if auth_secret is not None or superusers is not None:
        engine.auth = (AuthConfig(secret=auth_secret) if superusers is None
                       else AuthConfig(secret=auth_secret, superusers=tuple(superusers)))
    if storage and storage.startswith("file://") and not storage.startswith("file:///"):
        # a relative path must mean the same directory to every actor: make it absolute
        engine.storage_url = "file://" + os.path.abspath(storage[len("file://"):])
    elif not storage:
        engine.storage_url = "file://" + os.path.abspath(DEFAULT_URL[len("file://"):])
    coordinator = engine.coordinator
    for key, value in overrides.items():
        if key in _COORDINATOR_OPTIONS:  # e.g. num_coordinators=3, slow_txn_threshold_ms=30_000
            coordinator = replace(coordinator, **{key: value})
        elif hasattr(engine, key):
            setattr(engine, key, value)
        else:
            raise InvalidArgument(f"unknown config option {key!r}")
    engine.coordinator = coordinator
    # Checked here too, not only where actors open the storage: a format this release cannot
    # write is refused before anything starts.
    check_write_format(engine.storage_options.get(WRITE_FORMAT_OPTION, DEFAULT_WRITE_FORMAT))
    return engine


_COORDINATOR_OPTIONS = frozenset(field.name for field in fields(CoordinatorConfig))


def _initial_position(initial_position: InitialPosition | str) -> InitialPosition:
    try:
        return InitialPosition(initial_position)
    except ValueError:
        raise InvalidArgument(f"initial_position must be latest or earliest, got {initial_position!r}") from None


def _timeout_ms(timeout: float) -> int:
    if timeout <= 0:
        raise InvalidArgument(f"timeout must be > 0, got {timeout!r}")
    return int(timeout * 1000)


def shutdown(token: str | None = None) -> None:
    """Stop the engine's actors (supervisor, coordinators, partitions, subscriptions) and the
    local Ray this process started. Data stays in the storage. With auth on, ``token`` (or
    ``RAYTXN_TOKEN``) must be a superuser's."""
    if not ray.is_initialized():
        return
    from raytxn.cluster import stop_engine

    # This process's clients first, while their actors still answer: a consumer's fetch loops
    # left running would meet a Ray that is gone and print its errors (an object "whose owner is
    # unknown") from the background.
    for client in list(_open_clients):
        try:
            client.close()
        except Exception:  # shutting down goes on; the log has why the close failed
            log.debug("closing %s at shutdown failed", client.owner, exc_info=True)
    stop_engine(token if token is not None else os.environ.get("RAYTXN_TOKEN") or None)
    _forget_supervisor()  # its handle is dead: a later connect's engine has a supervisor of its own
    ray.shutdown()


class Client:
    def __init__(self, config: EngineConfig, owner: str | None = None, deadline_s: float = 60.0,
                 token: str | None = None) -> None:
        self.config = config
        self.owner = owner or f"client-{uuid.uuid4().hex[:12]}"
        self.deadline_s = deadline_s
        self.token = token
        self.loop = BackgroundLoop()
        self.supervisor = ActorRef(SUPERVISOR_NAME, token)
        self.coordinators = CoordinatorClient(config.coordinator.num_coordinators, self.owner, deadline_s, token)
        self.faults = Faults(self.supervisor, deadline_s)
        self.txn_chain = TxnChain(self, config.coordinator.chain_begin)
        self._producers: list[Producer] = []
        self._consumers: list[Any] = []
        self._started_ray = False
        _open_clients.add(self)  # shutdown() closes it, if it is still open then
        freeze_startup_objects()  # the imports and Ray's state: out of the cyclic collector's walks

    # --- admin -------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, retention_bytes: int | None = None,
                     retention_s: float | None = None, compacted: bool = False,
                     compaction_threshold_bytes: int | None = None) -> dict[str, Any]:
        """Create the topic. Data every subscription acked is deleted, unless ``retention_bytes``
        / ``retention_s`` keep it (a partition keeps at least that many bytes, or data younger
        than that; either limit lets older data go); without subscriptions data stays unless one
        of them is set.

        ``compacted``: a compacted topic (Kafka's ``cleanup.policy=compact``) takes only keyed
        messages (``KeylessMessage`` otherwise), and each partition compacts itself once
        ``compaction_threshold_bytes`` (64 MiB unless given) of live data lie above its last
        compaction; retention trims its live ledger only below that horizon, and a
        ``read_compacted`` read or a table view from the start sees the latest value of every key.

        A retry after the supervisor died mid-call that finds the topic with
        these partitions means the first attempt made it (the supervisor's recovery finishes a
        create it began): success, not ``TopicAlreadyExists``."""
        retries: list[None] = []
        try:
            return self.supervisor.call("create_topic", name, partitions, retention_bytes, retention_s, compacted,
                                        compaction_threshold_bytes, deadline_s=self.deadline_s,
                                        on_retry=lambda: retries.append(None))
        except TopicAlreadyExists:
            if not retries:
                raise
            try:
                wanted = {"partitions": partitions, "retention_bytes": retention_bytes, "retention_s": retention_s,
                          "compacted": compacted}
                if compaction_threshold_bytes is not None:
                    wanted["compaction_threshold_bytes"] = compaction_threshold_bytes
                found = self.get_topic(name)
                made = all(found[key] == value for key, value in wanted.items())
            except TopicNotFound:
                made = False  # being deleted
            if not made:
                raise
            # the answer a first attempt gives: the settings as the supervisor saved them
            return {"name": name, **{key: found[key] for key in ("partitions", "retention_bytes", "retention_s",
                                                                 "compacted", "compaction_threshold_bytes")}}

    def delete_topic(self, name: str) -> None:
        """Delete the topic. A retry after the supervisor died mid-call that finds no topic means
        the first attempt deleted it (its reply was lost): success, not ``TopicNotFound``.

        This client's producers and consumers of the topic are closed first, while its actors
        still answer: closed afterwards, each would wait out its call deadline on actors that are
        gone (the demo's close took 19 s that way). So is this client's chained txn, when it was
        begun with the topic's partitions or subscriptions (``TxnChain.drop_topics``)."""
        for handle in [*self._consumers, *self._producers]:
            if handle.topic == name:
                handle.close()
        self.txn_chain.drop_topics({name})
        retries: list[None] = []
        try:
            self.supervisor.call("delete_topic", name, deadline_s=self.deadline_s,
                                 on_retry=lambda: retries.append(None))
        except TopicNotFound:
            if not retries:
                raise

    def create_topics(self, names: list[str], partitions: int = 1, subscriptions: list[str] | None = None,
                      initial_position: str = "earliest", retention_bytes: int | None = None,
                      retention_s: float | None = None, compacted: bool = False,
                      compaction_threshold_bytes: int | None = None) -> list[dict[str, Any]]:
        """Create many topics (each with ``subscriptions``) in one catalog write, all or none:
        fast at any number. Their actors start on first use. As ``create_topic``, a retry after
        the supervisor died mid-call that finds every topic made with these partitions means the
        first attempt made them: success, not ``TopicAlreadyExists``."""
        names, subscriptions = list(names), list(subscriptions or [])
        retries: list[None] = []
        try:
            return self.supervisor.call("create_topics", names, partitions, subscriptions, initial_position,
                                        retention_bytes, retention_s, compacted, compaction_threshold_bytes,
                                        deadline_s=self.deadline_s,
                                        on_retry=lambda: retries.append(None))
        except TopicAlreadyExists:
            if not retries:
                raise
            found = {t["name"]: t for t in self.list_topics()}
            if not all(name in found and found[name]["partitions"] == partitions for name in names):
                raise
            return [{"name": name, "partitions": partitions, "subscriptions": sorted(subscriptions)} for name in names]

    def delete_topics(self, names: list[str]) -> None:
        """Delete many topics (this client's producers and consumers of them, and a chained txn
        naming them, closed first). As ``delete_topic``, a retry after the supervisor died
        mid-call finishes what is left."""
        doomed = set(names)
        for handle in [*self._consumers, *self._producers]:
            if handle.topic in doomed:
                handle.close()
        self.txn_chain.drop_topics(doomed)
        retries: list[None] = []
        try:
            self.supervisor.call("delete_topics", list(names), deadline_s=self.deadline_s,
                                 on_retry=lambda: retries.append(None))
        except TopicNotFound:
            if not retries:
                raise
            left = doomed & {t["name"] for t in self.list_topics()}
            if left:  # the first attempt deleted some, its reply lost: delete the rest
                self.supervisor.call("delete_topics", sorted(left), deadline_s=self.deadline_s)

    def list_topics(self) -> list[dict[str, Any]]:
        return self.supervisor.call("list_topics", deadline_s=self.deadline_s)

    def get_topic(self, name: str) -> dict[str, Any]:
        return self.supervisor.call("get_topic", name, deadline_s=self.deadline_s)

    def topic_stats(self, name: str) -> dict[str, Any]:
        info = self.get_topic(name)
        partitions = [ActorRef(partition_actor_name(name, p), self.token).call("stats", deadline_s=self.deadline_s)
                      for p in range(info["partitions"])]
        return {**info, "partition_stats": partitions}

    def subscription_stats(self, topic: str, subscription: str, backlog: bool = True) -> list[dict[str, Any]]:
        """Each partition's stats of ``subscription`` (cursor, consumers, leases, pending acks);
        with ``backlog``, ``backlog_messages``: the messages it has still to consume, markers
        and aborted messages not counted (``backlog_exact`` False: a lower bound, the count
        stopped after a bounded read)."""
        partitions = self.get_topic(topic)["partitions"]
        return [{"partition": p, **ActorRef(subscription_actor_name(topic, p, subscription), self.token).call(
            "stats", backlog=backlog, deadline_s=self.deadline_s)} for p in range(partitions)]

    def browse(self, topic: str, partition: int = 0, offset: int | None = None,
               max_messages: int = 50) -> dict[str, Any]:
        """A page of a partition's messages from Kafka offset ``offset`` (None: the last
        ``max_messages``), each ``committed``, ``aborted`` or ``pending`` (its txn still open) with
        its txn id, and the txns' COMMIT/ABORT markers as rows of their own (``kind``), with
        the log start offset and high watermark to page within. Needs consume permission on
        the topic (or a superuser)."""
        partitions = self.get_topic(topic)["partitions"]
        if type(partition) is not int or not 0 <= partition < partitions:
            raise InvalidArgument(f"{topic!r} has partitions 0..{partitions - 1}, not {partition!r}")
        return ActorRef(partition_actor_name(topic, partition), self.token).call(
            "browse", offset, max_messages, deadline_s=self.deadline_s)

    def whoami(self) -> dict[str, Any]:
        """This client's principal (None with auth off) and whether it is a superuser."""
        return self.supervisor.call("whoami", deadline_s=self.deadline_s)

    def grant_permission(self, topic: str, principal: str,
                         actions: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
        """Superusers: ``principal`` may do exactly ``actions`` ("produce", "consume") on ``topic``;
        enforced by every actor of the topic when this returns."""
        return self.supervisor.call("grant_permission", topic, principal, list(actions), deadline_s=self.deadline_s)

    def revoke_permission(self, topic: str, principal: str) -> dict[str, list[str]]:
        """Superusers: take every permission on ``topic`` from ``principal``."""
        return self.supervisor.call("revoke_permission", topic, principal, deadline_s=self.deadline_s)

    def permissions(self, topic: str) -> dict[str, list[str]]:
        """Superusers: principal -> actions granted on ``topic``."""
        return self.supervisor.call("topic_permissions", topic, deadline_s=self.deadline_s)["permissions"]

    def health(self) -> dict[str, Any]:
        """The supervisor's view of every actor (state, incarnation, restarts, recovery)."""
        return self.supervisor.call("health", deadline_s=self.deadline_s)

    def rolling_restart(self, drain_s: float = 10.0,
                        progress: restarts.RowCallback | None = None) -> list[dict[str, Any]]:
        """Superusers: restart every running engine actor, one at a time (partitions,
        subscriptions, coordinators, hosts, the supervisor last), each drained first: new calls
        wait and retry, the calls in flight finish (up to ``drain_s``), then its process is
        replaced and the next one goes once it serves again. What an upgrade needs: install the
        new release where the actors run, then call this (``raytxn restart --rolling``).
        Producers, consumers and transactions go on throughout. Returns a row per actor;
        ``progress`` gets each as it is done."""
        return restarts.rolling_restart(self.supervisor, self.deadline_s, drain_s, progress)

    def coordinator_stats(self) -> list[dict[str, Any]]:
        return self.coordinators.stats()

    # --- hanging transactions (Kafka's find-hanging, Pulsar's slow-transactions) ---------------

    def list_transactions(self, older_than: float | str = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Superusers: live transactions on every coordinator begun at least ``older_than`` ago
        (seconds, or a duration such as ``"30s"``, ``"5m"``, ``"1h"``), the oldest first, at most
        ``limit``: txn id, state, owner, ``age_ms``, deadline, and the participants (``partitions``
        as [topic, partition], ``subscriptions`` as [topic, partition, subscription])."""
        older_than_ms = round(parse_duration(older_than) * 1000)
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
        return self.coordinators.list_txns(older_than_ms, limit)

    def recent_transactions(self, limit: int = 100) -> list[dict[str, Any]]:
        """Superusers: how the transactions that finished last ended (COMMITTED, ABORTED,
        TIMED_OUT, FENCED), up to ``limit`` per coordinator, the latest of each first."""
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
        return [row for tc_id in range(self.coordinators.num_coordinators)
                for row in self.coordinators.ref(tc_id).call("recent_outcomes", limit, deadline_s=self.deadline_s)]

    def describe_transaction(self, txn: TxnID | str) -> dict[str, Any]:
        """One transaction as ``list_transactions`` shows it, or its outcome once it ended
        (``TransactionNotFound`` when its coordinator no longer remembers it). ``txn``: a TxnID,
        ``"txn(0,42)"`` or ``"0,42"``. With auth on, its owner or a superuser."""
        return self.coordinators.get_txn(self._known_txn(txn))

    def abort_transaction(self, txn: TxnID | str) -> str:
        """Superusers: abort a transaction whoever owns it (e.g. a hanging one whose client is
        gone); returns ``"ABORTED"`` once every participant has the abort. A committed one
        raises ``TransactionAlreadyCommitted``."""
        return self.coordinators.admin_abort(self._known_txn(txn))

    def _known_txn(self, txn: TxnID | str) -> TxnID:
        txn_id = parse_txn_id(txn)
        if not 0 <= txn_id.tc_id < self.coordinators.num_coordinators:
            raise TransactionNotFound(f"{txn_id}: there is no coordinator {txn_id.tc_id}")
        return txn_id

    # --- producers ---------------------------------------------------------------------------

    def create_producer(self, topic: str, producer_name: str | None = None, **options: Any) -> Producer:
        """A producer for ``topic``. Options: batching_max_messages, batching_max_bytes,
        batching_max_delay_ms, send_timeout_s, max_pending_messages, max_pending_bytes,
        max_in_flight (appends in flight per partition, 5 by default; see
        runtime/client/producer.py)."""
        info = self.get_topic(topic)
        options.setdefault("max_message_bytes", self.config.partition.max_message_bytes)
        producer = Producer(self, topic, info["partitions"], producer_name, **options)
        self._producers.append(producer)
        return producer

    # --- consumers ---------------------------------------------------------------------------

    def subscribe(self, topic: str, subscription: str, consumer_type: ConsumerType | str = ConsumerType.Exclusive,
                  initial_position: InitialPosition | str = InitialPosition.Latest, consumer_name: str | None = None,
                  receiver_queue_size: int | None = None, ack_timeout_s: float | None = None,
                  negative_ack_redelivery_delay_s: float = 1.0, receiver_queue_bytes: int | None = None,
                  read_compacted: bool = False) -> Consumer:
        """A consumer of ``subscription`` on every partition of ``topic``; the subscription is
        created (at ``initial_position``) unless it exists. ``NotAllowed`` when its type refuses
        another consumer (Exclusive, or a consumer of another type attached). The receive queue
        of each partition holds up to ``receiver_queue_size`` messages and about
        ``receiver_queue_bytes`` (None: the client's ``SubscriptionConfig``).

        ``read_compacted`` (Pulsar's ``readCompacted``, for a compacted topic): below the
        compaction horizon the consumer receives the compacted view, the latest committed value
        of each key (tombstones as empty values) with its original message id, and above it
        every message. What compaction folded away counts as consumed by the subscription. As in
        Pulsar, only an Exclusive or Failover consumer may ask for it."""
        if type(read_compacted) is not bool:
            raise InvalidArgument(f"read_compacted must be a bool, got {read_compacted!r}")
        if read_compacted and str(consumer_type) not in (ConsumerType.Exclusive, ConsumerType.Failover):
            raise InvalidArgument(f"read_compacted needs an Exclusive or Failover consumer, not {consumer_type}")
        if read_compacted and not self.get_topic(topic).get("compacted"):
            raise InvalidArgument(f"read_compacted reads a compacted topic's compacted view; {topic!r} is not "
                                  "compacted (create it with compacted=True)")
        try:
            position = InitialPosition(initial_position)
        except ValueError:
            raise InvalidArgument(f"initial_position must be latest or earliest, got {initial_position!r}") from None
        defaults = self.config.subscription
        queue_size = defaults.receiver_queue_size if receiver_queue_size is None else receiver_queue_size
        queue_bytes = defaults.receiver_queue_bytes if receiver_queue_bytes is None else receiver_queue_bytes
        check_receiver_queue(queue_size, queue_bytes)  # before the subscription is created
        info = self.supervisor.call("create_subscription", topic, subscription, str(position),
                                    deadline_s=self.deadline_s)
        consumer = Consumer(self, topic, subscription, info["partitions"], consumer_type, consumer_name,
                            queue_size, ack_timeout_s, negative_ack_redelivery_delay_s, queue_bytes,
                            read_compacted=read_compacted)
        self._consumers.append(consumer)
        return consumer

    def create_subscription(self, topic: str, subscription: str,
                            initial_position: InitialPosition | str = InitialPosition.Latest) -> dict[str, Any]:
        """Create ``subscription`` on every partition of ``topic`` at ``initial_position`` (a no-op
        when it exists), without attaching anything; returns the topic's facts."""
        return self.supervisor.call("create_subscription", topic, subscription,
                                    str(_initial_position(initial_position)), deadline_s=self.deadline_s)

    def lease_ranges(self, topic: str, subscription: str, holder: str, epoch: int = 0, *,
                     max_entries: int = 10_000, max_messages: int | None = None, max_bytes: int | None = None,
                     timeout_s: float = 60.0,
                     initial_position: InitialPosition | str = InitialPosition.Earliest) -> LeaseSet:
        """Lease the next committed range of every partition of ``subscription`` (created at
        ``initial_position`` unless it exists) to ``holder``: the bulk path (see
        ``raytxn.client.leases``). ``max_messages`` and ``max_bytes`` bound the whole set: split
        evenly over the partitions, each range ending at a whole entry, then the set filled
        toward them with the entries the shares left out (``fill_plan``), and ranges whose
        first entries alone passed them given back (``trim_plan``): a range holds at least one
        entry, so only a single entry larger than the bounds passes them. ``max_entries`` bounds
        each partition's range. Partitions with
        nothing readable, or another holder's lease standing, are left out. A subscription with
        consumers attached refuses leases (``NotAllowed``)."""
        return self.loop.run(self._lease(topic, subscription, holder, epoch, max_entries, max_messages, max_bytes,
                                         timeout_s, initial_position))

    def lease_ranges_async(self, topic: str, subscription: str, holder: str, epoch: int = 0, *,
                           max_entries: int = 10_000, max_messages: int | None = None,
                           max_bytes: int | None = None, timeout_s: float = 60.0,
                           initial_position: InitialPosition | str = InitialPosition.Earliest,
                           ) -> concurrent.futures.Future[LeaseSet]:
        """``lease_ranges`` without waiting: a future of the ``LeaseSet`` (bad bounds raise here,
        before anything is asked)."""
        return self.loop.submit(self._lease(topic, subscription, holder, epoch, max_entries, max_messages,
                                            max_bytes, timeout_s, initial_position))

    def _lease(self, topic: str, subscription: str, holder: str, epoch: int, max_entries: int,
               max_messages: int | None, max_bytes: int | None, timeout_s: float,
               initial_position: InitialPosition | str) -> Coroutine[Any, Any, LeaseSet]:
        """The leasing, checked at once (before the subscription is created), run on the loop."""
        for bound in (max_messages, max_bytes):  # checked before the subscription is created
            if bound is not None and (type(bound) is not int or bound < 1):
                raise InvalidArgument(f"max_messages and max_bytes must be positive ints, got {bound!r}")
        if type(max_entries) is not int or max_entries < 1 or not 0 < timeout_s:
            raise InvalidArgument(f"max_entries must be a positive int and timeout_s > 0, got {max_entries!r}, "
                                  f"{timeout_s!r}")
        position = _initial_position(initial_position)

        async def lease() -> LeaseSet:
            facts = await self.supervisor.call_async("create_subscription", topic, subscription, str(position),
                                                     deadline_s=self.deadline_s)
            leases = await lease_partitions(self, topic, subscription, facts["partitions"], holder, epoch,
                                            max_entries, max_messages, max_bytes, timeout_s)
            return LeaseSet(self, topic, subscription, holder, epoch, leases)

        return lease()

    # --- compaction --------------------------------------------------------------------------

    def compact(self, topic: str, partition: int | None = None, *,
                delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS) -> list[dict[str, Any]]:
        """Compact ``topic`` (every partition, or one) up to what is committed now: below the
        new horizon only the latest committed value of each key stays, tombstones (empty
        values) until ``delete_retention_ms`` after the first compaction that kept them. Open
        and aborted data never enter a compacted ledger; offsets stay the original ones. A row
        per partition (``raytxn.client.compaction``)."""
        from raytxn.client.compaction import compact_topic

        return self.loop.run(compact_topic(self, topic, partition, delete_retention_ms=delete_retention_ms))

    def read_compacted(self, topic: str, partition: int = 0, from_offset: int = 0) -> list[dict[str, Any]]:
        """The compacted view of a partition from ``from_offset``: each key's latest committed
        record below the horizon, then every committed keyed message after it, in offset order,
        as ``{"offset", "key", "value"}`` (``value`` None: a tombstone). ``CompactionReset``
        when a tombstone this reader had not reached was dropped: read from offset 0 again."""
        from raytxn.client.compaction import read_compacted_partition

        return self.loop.run(read_compacted_partition(self, topic, partition, from_offset))

    def compacted_reader(self, topic: str, partition: int = 0, from_offset: int = 0,
                         poll_interval_s: float = 0.2) -> CompactedReader:
        """A reader of the partition's compacted view from ``from_offset`` that goes on with what
        commits later (Pulsar's ``readCompacted`` reader, ``raytxn.client.reader``):
        ``read_next(timeout)``, ``has_message_available()``, ``read_available()``, ``seek`` and
        its ``position``; no subscription, so it acks nothing and holds no retention back."""
        return CompactedReader(self, topic, partition, from_offset, poll_interval_s)

    def table_view(self, topic: str, poll_interval_s: float = 0.2) -> TableView:
        """A table of ``topic``'s latest committed value per key: loaded from the compacted
        view, then kept up to date in the background (``raytxn.client.table_view``): ``get``,
        iteration, ``listen``, ``refresh()`` and the ``position`` it reflects."""
        return TableView(self, topic, poll_interval_s)

    # --- transactions ------------------------------------------------------------------------

    def new_transaction(self, timeout: float = 60.0, transactional_id: str | None = None,
                        epoch: int | None = None) -> Transaction:
        """Begin a transaction (``timeout`` in seconds). Without a transactional id this makes no
        call: the transaction begins at a coordinator with its first send or ack (Kafka's
        ``beginTransaction``). With a ``transactional_id``, pass the ``epoch`` that
        ``register_transactional_id`` returned (older epochs are fenced): it begins here."""
        timeout_ms = self._txn_timeout_ms(timeout)
        began_at = time.monotonic()  # before the coordinator's start: the client's deadline is never later
        if transactional_id is None and epoch is None:
            return self._chained_or_lazy(timeout, began_at)
        txn_id = self.coordinators.new_txn(timeout_ms, transactional_id, epoch)
        return Transaction(self, txn_id, timeout, transactional_id, epoch, began_at)

    def new_transaction_async(self, timeout: float = 60.0, transactional_id: str | None = None,
                              epoch: int | None = None) -> concurrent.futures.Future[Transaction]:
        """``new_transaction`` without waiting (Pulsar's ``newTransaction()`` future): begin the
        next transaction while the current one still sends, so the coordinator round trip is off
        the sender's path. Errors (``Fenced``, an unreachable coordinator) come through the future."""
        timeout_ms = self._txn_timeout_ms(timeout)

        async def begin() -> Transaction:
            began_at = time.monotonic()
            if transactional_id is None and epoch is None:
                return self._chained_or_lazy(timeout, began_at)
            txn_id = await self.coordinators.new_txn_async(timeout_ms, transactional_id, epoch)
            return Transaction(self, txn_id, timeout, transactional_id, epoch, began_at)

        return self.loop.submit(begin())

    def _chained_or_lazy(self, timeout: float, began_at: float) -> Transaction:
        """The txn the last commit began (runtime/client/txn_chain.py) if it fits, else a lazy
        one, which begins with its first send or ack."""
        chained = self.txn_chain.take(timeout)
        if chained is None:
            return Transaction(self, None, timeout, None, None, began_at)
        return Transaction(self, chained.txn_id, timeout, None, None, chained.began_at,
                           registered=[*(("partition", p) for p in chained.partitions),
                                       *(("subscription", s) for s in chained.subscriptions)])

    def _txn_timeout_ms(self, timeout: float) -> int:
        """``timeout`` (s) in ms, checked here as the coordinator checks it: a lazy transaction
        reaches its coordinator only with its first send."""
        return check_timeout_ms(_timeout_ms(timeout), self.config.coordinator.max_timeout_ms)

    @contextlib.contextmanager
    def transaction(self, timeout: float = 60.0, transactional_id: str | None = None,
                    epoch: int | None = None) -> Iterator[Transaction]:
        """``with client.transaction() as txn:`` commits on normal exit, aborts on an exception
        (which is re-raised)."""
        txn = self.new_transaction(timeout, transactional_id, epoch)
        with txn:
            yield txn

    def register_transactional_id(self, transactional_id: str) -> int:
        """Start a new incarnation of ``transactional_id``: bumps its epoch, aborts its open
        transaction, and fences every older epoch (Kafka's initTransactions)."""
        return self.coordinators.register_transactional_id(transactional_id)

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Flush producers, close consumers, abort the txn the last commit began if nobody took
        it; the cluster keeps running."""
        for producer in self._producers:
            producer.close()
        for consumer in self._consumers:
            consumer.close()
        self.txn_chain.close()
        self.loop.stop()
        _open_clients.discard(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
