"""What the console's pages show, and what it costs the engine.

Every call is made with the token of the user whose request it serves (the context variable
``REQUEST_TOKEN``, set per request from the session; the Kafka gateway's rule): the console has
no rights of its own, so a user sees exactly what the engine lets that user see, and a refusal
is the engine's.

Cost. A page makes a bounded number of calls, whatever the number of topics:

* direct calls, with the user's token: the catalog (``list_topics``, one supervisor call), a
  coordinator call per coordinator for the transactions page, one partition call for a page of
  the message browser, one supervisor call for health;
* the **stats snapshot**: the stats of every *live* partition and subscription, the
  coordinators' and the Kafka gateways', taken in the background and shared by every page and
  user. A request finding it older than ``refresh_s`` starts a new one (with its own token) and
  is served the last; only the first request of all waits. No request, no refresh: an idle
  console costs the engine nothing. Dormant actors (passivated, or never used) are never called
  (a call would activate them): their rows say dormant. The stats calls are not traffic to the
  actors (``shell.UNCOUNTED_CALLS``), so watching an idle actor does not keep it from passivating.

What the snapshot holds is what any authenticated principal may read (the stats calls need no
more), so one user's refresh may serve another user's page.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

import ray

from raytxn.client.rpc import ActorRef, HostedHandle, unwrap
from raytxn.errors import AuthenticationFailed, InvalidArgument, TopicNotFound, TransactionNotFound
from raytxn.ids import (
    NAMESPACE,
    SUPERVISOR_NAME,
    TxnID,
    coordinator_actor_name,
    partition_actor_name,
    subscription_actor_name,
)

log = logging.getLogger(__name__)

REQUEST_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("raytxn_console_token", default=None)
CALL_DEADLINE_S = 10.0        # a page's direct call gives up (a 503 page) after this
STATS_TIMEOUT_S = 5.0         # a live actor's stats call in a refresh, before its row says "no answer"
STATS_IN_FLIGHT = 32          # stats calls a refresh keeps going at once
MAX_TXNS_LISTED = 1000        # open transactions fetched per coordinator for the transactions page
RECENT_OUTCOMES = 20          # recent outcomes shown per coordinator
GATEWAY_PREFIXES = ("kafka-gateway-", "kafka-gateways-")


def request_token() -> str | None:
    return REQUEST_TOKEN.get()


@dataclass
class Rate:
    """Per-second rates from two readings of a counter of one actor incarnation."""

    counters: dict[str, tuple[Any, float, float]] = field(default_factory=dict)  # key -> (incarnation, value, at)

    def per_s(self, key: str, incarnation: Any, value: float, at: float) -> float | None:
        """The rate since the last reading of ``key``; None at its first reading, after a
        restart (a new incarnation counts from 0) or when the readings are too close."""
        previous = self.counters.get(key)
        self.counters[key] = (incarnation, value, at)
        if previous is None or previous[0] != incarnation or value < previous[1] or at - previous[2] < 0.05:
            return None
        return (value - previous[1]) / (at - previous[2])

    def forget_except(self, keys: set[str]) -> None:
        self.counters = {k: v for k, v in self.counters.items() if k in keys}


@dataclass
class Snapshot:
    """The stats of every live actor at ``taken_ms`` (rows keyed by actor name), per-topic sums,
    and what the refresh cost."""

    taken_ms: int = 0
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    health: dict[str, dict[str, Any]] = field(default_factory=dict)  # actor name -> health row
    coordinators: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # Kafka group -> members, state
    rates: dict[str, float] = field(default_factory=dict)  # "in/<partition actor>", "out/<subscription actor>"
    unstarted: set[str] = field(default_factory=set)  # subscription actors that never started: no cursor yet
    calls: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def state_of(self, name: str) -> str:
        row = self.health.get(name)
        return "UNKNOWN" if row is None else row["state"]

    def why_not_counted(self, subscription: str, partition: str) -> str:
        """Why a subscription's row has no stats."""
        if subscription in self.unstarted:
            return "never started: it has no cursor yet"
        if self.state_of(partition) != "ALIVE":
            return "its partition is dormant: not counted (asking would start it)"
        return "no answer this time"


class LiveHandles:
    """Handles of live actors, looked up without activating anyone (``ActorRef`` asks the
    supervisor to start an actor it does not find; a console watching must not)."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}

    async def get(self, name: str, host: str | None) -> Any | None:
        key = f"{host}/{name}" if host else name
        handle = self._handles.get(key)
        if handle is None:
            try:
                found = await asyncio.to_thread(ray.get_actor, host or name, namespace=NAMESPACE)
            except ValueError:
                return None
            handle = self._handles[key] = HostedHandle(found, name) if host else found
        return handle

    def forget(self, name: str, host: str | None) -> None:
        self._handles.pop(f"{host}/{name}" if host else name, None)

    def keep_only(self, keys: Iterable[str]) -> None:
        wanted = set(keys)
        self._handles = {k: v for k, v in self._handles.items() if k.rsplit("/", 1)[-1] in wanted}


class ConsoleData:
    """The engine calls of the console's pages (every one with ``REQUEST_TOKEN``'s token)."""

    def __init__(self, num_coordinators: int, refresh_s: float = 2.0) -> None:
        self.num_coordinators = num_coordinators
        self.refresh_s = refresh_s
        self.supervisor = ActorRef(SUPERVISOR_NAME, request_token)
        self.coordinators = [ActorRef(coordinator_actor_name(i), request_token) for i in range(num_coordinators)]
        # Refs with no token of their own, for calls that pass one explicitly (a login's, a refresh's).
        self._plain_supervisor = ActorRef(SUPERVISOR_NAME)
        self._plain_coordinators = [ActorRef(coordinator_actor_name(i)) for i in range(num_coordinators)]
        self._refs: dict[str, ActorRef] = {}
        self._handles = LiveHandles()
        self._rates = Rate()
        self.snapshot: Snapshot | None = None
        self._refreshing: asyncio.Task | None = None

    def ref(self, name: str) -> ActorRef:
        """A ref presenting the request's token (kept: its handle lookup is the costly part)."""
        ref = self._refs.get(name)
        if ref is None:
            if len(self._refs) >= 10_000:
                self._refs.clear()
            ref = self._refs[name] = ActorRef(name, request_token)
        return ref

    async def call(self, ref: ActorRef, method: str, *args: Any, **kwargs: Any) -> Any:
        return await ref.call_async(method, *args, deadline_s=CALL_DEADLINE_S, **kwargs)

    # --- direct calls -------------------------------------------------------------------------

    async def whoami(self, token: str | None) -> dict[str, Any]:
        """Who ``token`` names, as the engine verifies it (a login)."""
        return await self._plain_supervisor.call_async("whoami", deadline_s=CALL_DEADLINE_S,
                                                       **({} if token is None else {"auth": token}))

    async def auth_enabled(self) -> bool:
        config = await self._plain_supervisor.call_async("engine_config", deadline_s=CALL_DEADLINE_S)
        return bool(config.auth.enabled)

    async def topics(self) -> list[dict[str, Any]]:
        return await self.call(self.supervisor, "list_topics")

    async def topic(self, name: str) -> dict[str, Any]:
        return await self.call(self.supervisor, "get_topic", name)

    async def health(self) -> dict[str, Any]:
        return await self.call(self.supervisor, "health")

    async def open_txns(self) -> list[dict[str, Any]]:
        """Live transactions of every coordinator, the oldest first (superusers)."""
        rows = [row for ref in self.coordinators for row in await self.call(ref, "list_txns", MAX_TXNS_LISTED, 0)]
        return sorted(rows, key=lambda row: (row["start_ms"], row["tc_id"], row["sequence"]))

    async def recent_outcomes(self) -> list[dict[str, Any]]:
        return [row for ref in self.coordinators for row in await self.call(ref, "recent_outcomes", RECENT_OUTCOMES)]

    async def transaction(self, txn: TxnID) -> dict[str, Any]:
        return await self.call(self._coordinator(txn), "get_txn", txn)

    async def abort(self, txn: TxnID) -> str:
        return await self.call(self._coordinator(txn), "admin_abort", txn)

    def _coordinator(self, txn: TxnID) -> ActorRef:
        if not 0 <= txn.tc_id < self.num_coordinators:
            raise TransactionNotFound(f"{txn}: there is no coordinator {txn.tc_id}")
        return self.coordinators[txn.tc_id]

    async def browse(self, topic: str, partition: int, offset: int | None, size: int) -> dict[str, Any]:
        info = await self.topic(topic)
        if not 0 <= partition < info["partitions"]:
            raise TopicNotFound(f"{topic!r} has partitions 0..{info['partitions'] - 1}, not {partition}")
        return await self.call(self.ref(partition_actor_name(topic, partition)), "browse", offset, size)

    async def group_offsets(self, topic: str, partition: int, group: str) -> int | None:
        """A Kafka group's committed offset on one partition (None: it committed none)."""
        committed = await self.call(self.ref(subscription_actor_name(topic, partition, group)), "kafka_committed")
        if committed["acked_nothing"]:
            return None
        return await self.call(self.ref(partition_actor_name(topic, partition)), "kafka_offset_of",
                               committed["position"], committed["index"])

    # --- the stats snapshot -----------------------------------------------------------------

    async def current(self) -> Snapshot:
        """The snapshot, refreshed in the background when older than ``refresh_s`` (awaited
        only when there is none yet)."""
        snapshot = self.snapshot
        stale = snapshot is None or time.time() * 1000 - snapshot.taken_ms >= self.refresh_s * 1000
        if stale and self._refreshing is None:
            # The task copies this request's context: its calls carry this user's token.
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
            self._refreshing.add_done_callback(self._refreshed)
        if snapshot is None:
            assert self._refreshing is not None
            await asyncio.shield(self._refreshing)
            assert self.snapshot is not None
            return self.snapshot
        return snapshot

    def _refreshed(self, task: asyncio.Task) -> None:
        self._refreshing = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("the console's stats refresh failed: %r", task.exception())

    async def _refresh(self) -> None:
        began = time.monotonic()
        token = request_token()
        topics, health = await asyncio.gather(self.topics(), self.health())
        snapshot = Snapshot(taken_ms=int(time.time() * 1000), calls=2,
                            health={row["name"]: row for row in health["actors"]})
        work: list[Awaitable[None]] = []
        for topic in topics:
            for p in range(topic["partitions"]):
                name = partition_actor_name(topic["name"], p)
                work.append(self._observe(snapshot, snapshot.partitions, name, token, storage=True))
                if snapshot.state_of(name) != "ALIVE":
                    continue  # a subscription's backlog is counted by its partition: not started for it
                for sub in topic["subscriptions"]:
                    sub_name = subscription_actor_name(topic["name"], p, sub)
                    if snapshot.state_of(sub_name) == "ALIVE":
                        work.append(self._observe(snapshot, snapshot.subscriptions, sub_name, token, backlog=True))
                    else:  # dormant: its stored cursor says where it is
                        work.append(self._stored_backlog(snapshot, name, sub_name, sub, token))
        work += [self._coordinator_stats(snapshot, token), self._gateway_groups(snapshot)]
        await _bounded_gather(work, STATS_IN_FLIGHT)
        self._summarize(snapshot, topics)
        snapshot.seconds = round(time.monotonic() - began, 3)
        self._handles.keep_only(snapshot.health)
        self.snapshot = snapshot

    async def _observe(self, snapshot: Snapshot, into: dict[str, dict[str, Any]], name: str, token: str | None,
                       **kwargs: Any) -> None:
        row = snapshot.health.get(name)
        if row is None or row["state"] != "ALIVE":
            return
        handle = await self._handles.get(name, row.get("host"))
        if handle is None:
            return
        snapshot.calls += 1
        try:
            into[name] = await asyncio.wait_for(handle.stats.remote(auth=token, **kwargs), STATS_TIMEOUT_S)
        except Exception as raw:  # noqa: BLE001 - one actor's failure is its row's, not the page's
            error = unwrap(raw)
            self._handles.forget(name, row.get("host"))
            if isinstance(error, AuthenticationFailed):
                raise error from None
            snapshot.errors.append(f"{name}: {type(error).__name__}")

    async def _stored_backlog(self, snapshot: Snapshot, partition: str, name: str, subscription: str,
                              token: str | None) -> None:
        """A dormant subscription's backlog, counted by its live partition from its stored cursor."""
        row = snapshot.health[partition]
        handle = await self._handles.get(partition, row.get("host"))
        if handle is None:
            return
        snapshot.calls += 1
        try:
            counted = await asyncio.wait_for(handle.stored_backlog.remote(subscription, auth=token), STATS_TIMEOUT_S)
        except Exception as raw:  # noqa: BLE001 - one actor's failure is its row's, not the page's
            error = unwrap(raw)
            if isinstance(error, AuthenticationFailed):
                raise error from None
            snapshot.errors.append(f"{partition}: {type(error).__name__}")
            return
        if counted is None:  # never started: its cursor is made (at its initial position) when it first starts
            snapshot.unstarted.add(name)
        else:
            snapshot.subscriptions[name] = {"backlog_messages": counted["messages"], "backlog_exact": counted["exact"],
                                            "stored_cursor": True, "consumers": [], "leases": []}

    async def _coordinator_stats(self, snapshot: Snapshot, token: str | None) -> None:
        snapshot.calls += self.num_coordinators
        snapshot.coordinators = [await ref.call_async("stats", deadline_s=STATS_TIMEOUT_S, auth=token)
                                 for ref in self._plain_coordinators]

    async def _gateway_groups(self, snapshot: Snapshot) -> None:
        """Kafka group membership lives in the gateways (each knows the groups it coordinates):
        their stats, which need no token, say each group's state and member count."""
        names = [a["name"] for a in await asyncio.to_thread(ray.util.list_named_actors, True)
                 if a["namespace"] == NAMESPACE and a["name"].startswith(GATEWAY_PREFIXES)]
        for name in names:
            handle = await self._handles.get(name, None)
            if handle is None:
                continue
            snapshot.calls += 1
            try:
                stats = await asyncio.wait_for(handle.stats.remote(), STATS_TIMEOUT_S)
            except Exception as raw:  # noqa: BLE001 - a gateway stopping: its groups are not shown
                snapshot.errors.append(f"{name}: {type(unwrap(raw)).__name__}")
                self._handles.forget(name, None)
                continue
            for group, facts in stats.get("groups", {}).items():
                seen = snapshot.groups.setdefault(group, {"members": 0, "states": [], "gateways": []})
                seen["members"] += facts["members"]
                seen["states"].append(facts["state"])
                seen["gateways"].append(name)

    def _summarize(self, snapshot: Snapshot, topics: list[dict[str, Any]]) -> None:
        """Per topic: rates in and out, stored bytes, open txns, and how many partitions are live."""
        now = time.monotonic()
        seen: set[str] = set()
        for topic in topics:
            name = topic["name"]
            summary: dict[str, Any] = {"live_partitions": 0, "rate_in": None, "rate_out": None, "storage_bytes": 0,
                                       "storage_partial": False, "ongoing_txns": 0, "lag_entries": 0}
            for p in range(topic["partitions"]):
                actor = partition_actor_name(name, p)
                stats = snapshot.partitions.get(actor)
                if stats is None:
                    summary["storage_partial"] = True
                    continue
                summary["live_partitions"] += 1
                summary["storage_bytes"] += stats.get("storage_bytes", 0)
                summary["ongoing_txns"] += stats.get("ongoing_txns", 0)
                summary["lag_entries"] += stats.get("lag_entries", 0)
                readings = [(f"in/{actor}", "rate_in", stats, "messages_in"),
                            (f"kout/{actor}", "rate_out", stats, "kafka_messages_out")]
                for sub in topic["subscriptions"]:
                    sub_actor = subscription_actor_name(name, p, sub)
                    if (sub_stats := snapshot.subscriptions.get(sub_actor)) is not None:
                        readings.append((f"out/{sub_actor}", "rate_out", sub_stats, "messages_out"))
                for key, total, counters, counter in readings:
                    seen.add(key)
                    rate = self._rates.per_s(key, counters.get("incarnation"), counters.get(counter, 0), now)
                    if rate is not None:
                        snapshot.rates[key] = rate
                        summary[total] = (summary[total] or 0.0) + rate
            snapshot.topics[name] = summary
        self._rates.forget_except(seen)


async def _bounded_gather(work: list[Awaitable[None]], in_flight: int) -> None:
    """Await every one of ``work``, at most ``in_flight`` at a time; the first error is raised
    once they are all done (an authentication failure fails the refresh: the old snapshot stays)."""
    gate = asyncio.Semaphore(in_flight)

    async def one(item: Awaitable[None]) -> None:
        async with gate:
            await item

    results = await asyncio.gather(*(one(item) for item in work), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def page_of(rows: list[Any], page: int, size: int) -> tuple[list[Any], int]:
    """Rows of 1-based ``page`` of ``size`` rows, and how many pages there are (at least 1);
    ``InvalidArgument`` for a page past the last."""
    pages = max(1, -(-len(rows) // size))
    if page > pages:
        raise InvalidArgument(f"page {page} is past the last page, {pages}")
    return rows[(page - 1) * size: page * size], pages

