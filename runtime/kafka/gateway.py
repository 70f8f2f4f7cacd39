"""The gateway actor: an asyncio TCP server inside a Ray actor, speaking the Kafka protocol.

Why an actor: it runs on the Ray cluster next to the partition actors it calls, is found by name
(``kafka-gateway-<port>``), and outlives the driver that started it (detached), like the
engine's own actors. It advertises the address Kafka clients should connect to: the node's IP
(or ``advertised_host``) and the port it bound.

Each connection's requests are handled one at a time, in order, as a Kafka broker does: a
producer's batches to a partition arrive in the order it sent them, which its sequence numbers
rely on. Consumer-group membership is this actor's memory (``group_membership``, ticked every
``TICK_S``); committed offsets are raytxn subscriptions (``group_offsets``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from raytxn.client.rpc import ActorRef
from raytxn.errors import InvalidArgument, RaytxnError
from raytxn.hashing import coordinator_for
from raytxn.ids import (
    NAMESPACE,
    SUPERVISOR_NAME,
    TxnID,
    coordinator_actor_name,
    partition_actor_name,
    subscription_actor_name,
)
from raytxn.kafka import wire
from raytxn.kafka.broker import Broker, Connection
from raytxn.kafka.group_admin import GroupAdmin
from raytxn.kafka.group_membership import TICK_S, GroupMembership
from raytxn.kafka.group_offsets import Engine, GroupOffsets
from raytxn.kafka.groups import INITIAL_REBALANCE_DELAY_MS, GroupTable, check_initial_delay
from raytxn.kafka.mapping import raytxn_subscription, raytxn_topic
from raytxn.kafka.transactions import KafkaTransactions
from raytxn.kafka.txn_admin import TransactionAdmin

log = logging.getLogger(__name__)
CALL_DEADLINE_S = 30.0
MAX_ACTOR_REFS = 10_000


def gateway_actor_name(port: int) -> str:
    return f"kafka-gateway-{port}"


class KafkaGateway:
    def __init__(self, port: int = 9092, bind_host: str = "0.0.0.0", advertised_host: str | None = None,
                 token: str | None = None, num_coordinators: int = 2, call_deadline_s: float = CALL_DEADLINE_S,
                 initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS) -> None:
        self.port, self.bind_host, self.token = port, bind_host, token
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.call_deadline_s = call_deadline_s  # how long one Kafka request waits on an engine call
        self._coordinators = [ActorRef(coordinator_actor_name(i), token) for i in range(num_coordinators)]
        self.advertised_host = advertised_host or ray.util.get_node_ip_address()
        self._server: asyncio.base_events.Server | None = None
        self._refs: dict[str, ActorRef] = {}
        self._supervisor = ActorRef(SUPERVISOR_NAME, token)
        self.broker: Broker | None = None
        self.groups: GroupMembership | None = None
        self.offsets: GroupOffsets | None = None
        self.admin: GroupAdmin | None = None
        self.txn_admin: TransactionAdmin | None = None
        self._ticker: asyncio.Task | None = None
        # Connections closed, by why (``wire.CLOSE_REASONS``): each with one log line, no traceback.
        self.served = {"connections": 0, "requests": 0, **{f"closed_{r}": 0 for r in wire.CLOSE_REASONS}}
        self.versions: dict[str, int] = {}  # "api_key/version" -> requests (served ones only: bounded)

    async def start(self) -> dict[str, Any]:
        """Bind and serve (idempotent); returns the advertised address."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.bind_host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]  # the port bound, also for port 0
            transactions = KafkaTransactions(f"kafka-gateway-{self.advertised_host}-{self.port}",
                                             self._home_call, self._txn_call)
            self.broker = Broker(self.advertised_host, self.port, self._topic_partitions, self._call,
                                 self._topic_names, transactions)
            self.groups = GroupMembership(GroupTable(initial_rebalance_delay_ms=self.initial_rebalance_delay_ms))
            engine = Engine(self.broker.partitions, self._call, self._subscription_call, self._subscription_names,
                            self._create_subscription, self._topic_rows)
            self.offsets = GroupOffsets(engine, self.groups, transactions)
            self.admin = GroupAdmin(self.groups, self._topic_rows, self._delete_subscription)
            self.txn_admin = TransactionAdmin(len(self._coordinators), self._describe_tids, self.broker.partitions,
                                              self._call, transactions, lambda: int(time.time() * 1000))
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self.address()

    async def _tick(self) -> None:
        """Time drives consumer groups too: sessions expire, rebalance timeouts pass."""
        assert self.groups is not None
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.groups.tick()
            except Exception:  # a bug in one tick must not stop the next
                log.exception("consumer group tick failed")

    def address(self) -> dict[str, Any]:
        return {"host": self.advertised_host, "port": self.port,
                "bootstrap": f"{self.advertised_host}:{self.port}", **self.served}

    # --- raytxn side ---------------------------------------------------------------------------

    async def _topic_partitions(self, topic: str) -> int:
        info = await self._supervisor.call_async("get_topic", topic, deadline_s=self.call_deadline_s)
        return int(info["partitions"])

    async def _topic_names(self) -> list[str]:
        return [t["name"] for t in await self._topic_rows()]

    async def _topic_rows(self) -> list[dict[str, Any]]:
        return await self._supervisor.call_async("list_topics", deadline_s=self.call_deadline_s)

    async def _subscription_names(self, kafka_topic: str) -> list[str]:
        info = await self._supervisor.call_async("get_topic", raytxn_topic(kafka_topic),
                                                 deadline_s=self.call_deadline_s)
        return list(info["subscriptions"])

    async def _create_subscription(self, kafka_topic: str, group: str) -> Any:
        return await self._supervisor.call_async("create_subscription", raytxn_topic(kafka_topic),
                                                 raytxn_subscription(group), "earliest",
                                                 deadline_s=self.call_deadline_s)

    async def _delete_subscription(self, topic: str, name: str) -> Any:
        return await self._supervisor.call_async("delete_subscription", topic, name, deadline_s=self.call_deadline_s)

    async def _call(self, kafka_topic: str, partition: int, method: str, *args: Any) -> Any:
        return await self._actor_call(partition_actor_name(raytxn_topic(kafka_topic), partition), method, *args)

    async def _subscription_call(self, kafka_topic: str, partition: int, group: str, method: str, *args: Any) -> Any:
        name = subscription_actor_name(raytxn_topic(kafka_topic), partition, raytxn_subscription(group))
        return await self._actor_call(name, method, *args)

    async def _actor_call(self, name: str, method: str, *args: Any) -> Any:
        ref = self._refs.get(name)
        if ref is None:
            if len(self._refs) >= MAX_ACTOR_REFS:
                self._refs.clear()  # a lookup again is cheap; the table stays bounded
            ref = self._refs[name] = ActorRef(name, self.token)
        return await ref.call_async(method, *args, deadline_s=self.call_deadline_s)

    async def _home_call(self, transactional_id: str, method: str, *args: Any) -> Any:
        home = self._coordinators[coordinator_for(transactional_id, len(self._coordinators))]
        return await home.call_async(method, *args, deadline_s=self.call_deadline_s)

    async def _describe_tids(self, tc_id: int, transactional_ids: list[str] | None) -> list[dict[str, Any]]:
        return await self._coordinators[tc_id].call_async("describe_transactional_ids", transactional_ids,
                                                          deadline_s=self.call_deadline_s)

    async def _txn_call(self, txn: TxnID, method: str, *args: Any) -> Any:
        return await self._coordinators[txn.tc_id].call_async(method, *args, deadline_s=self.call_deadline_s)

    # --- Kafka side ----------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.broker is not None
        conn = self.broker.connection()
        peer = writer.get_extra_info("peername")
        conn.client_host = f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""
        self.served["connections"] += 1
        try:
            while True:
                try:
                    prefix = await reader.readexactly(4)
                    payload = await reader.readexactly(wire.frame_size(prefix))
                except asyncio.IncompleteReadError:
                    return  # the client closed
                response = await self._respond(payload, conn)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
        except Exception as e:  # noqa: BLE001 - whatever ends this connection, the others go on
            reason = wire.close_reason(e)
            self.served[f"closed_{reason}"] += 1
            log.warning("closing Kafka connection from %s (%s): %s: %s", writer.get_extra_info("peername"),
                        reason, type(e).__name__, e)
        finally:
            writer.close()

    async def _respond(self, payload: bytes, conn: Connection) -> bytes | None:
        assert self.broker is not None
        header = wire.peek_header(payload)
        self.served["requests"] += 1
        if header.api_key == wire.API_VERSIONS:
            return wire.api_versions(header)
        request = wire.decode_request(header, payload)
        broker, groups, offsets, version = self.broker, self.groups, self.offsets, header.api_version
        admin, txn_admin = self.admin, self.txn_admin
        assert groups is not None and offsets is not None and admin is not None and txn_admin is not None
        seen = f"{header.api_key}/{version}"
        self.versions[seen] = self.versions.get(seen, 0) + 1
        handlers = {3: broker.metadata, 10: broker.find_coordinator, 2: broker.list_offsets,
                    1: broker.fetch, 22: broker.init_producer_id, 24: broker.add_partitions_to_txn,
                    26: broker.end_txn, 14: groups.sync_group, 12: groups.heartbeat, 13: groups.leave_group,
                    8: offsets.offset_commit, 9: offsets.offset_fetch, 25: offsets.add_offsets_to_txn,
                    28: offsets.txn_offset_commit, 16: admin.list_groups, 15: admin.describe_groups,
                    42: admin.delete_groups, 47: offsets.offset_delete, 61: txn_admin.describe_producers,
                    65: txn_admin.describe_transactions, 66: txn_admin.list_transactions}
        try:
            if header.api_key == 0:
                fields = await broker.produce(request, version, conn)
                if fields is None:
                    return None
            elif header.api_key == 11:
                fields = await groups.join_group(request, version, request.header.client_id, conn.client_host)
            else:
                fields = await handlers[header.api_key](request, version)
        except RaytxnError as e:  # a bug or an outage past every retry: the client reconnects
            raise ConnectionError(f"{type(request).__name__} failed: {e!r}") from e
        return wire.encode_response(header, **fields)

    async def stats(self) -> dict[str, Any]:
        """The address, request counts, the API versions clients used and the consumer groups."""
        groups = {} if self.groups is None else {
            g.group_id: {"state": str(g.state), "generation": g.generation, "members": len(g.members)}
            for g in self.groups.table.groups.values()}
        batches = {} if self.broker is None else self.broker.batch_stats
        return {**self.address(), "versions": dict(self.versions), "groups": groups, "batches": batches}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None


# Not restarted by Ray: a restarted actor would not serve until start() is called again; `raytxn
# kafka` (or start_gateway) with the same port starts it again.
KafkaGatewayActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=10_000)(KafkaGateway)


def start_gateway(port: int = 9092, *, bind_host: str = "0.0.0.0", advertised_host: str | None = None,
                  token: str | None = None, num_coordinators: int = 2,
                  call_deadline_s: float = CALL_DEADLINE_S,
                  initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS) -> dict[str, Any]:
    """Start a Kafka gateway actor on the Ray cluster this driver is connected to (after
    ``raytxn.connect``), serving ``port`` (0: any free port); returns its advertised address,
    ``bootstrap`` being what Kafka clients take as ``bootstrap.servers``. Idempotent per port.
    ``num_coordinators``: the engine's (``client.config.coordinator.num_coordinators``);
    ``call_deadline_s``: how long a request waits on an engine call before it answers a
    retriable error (the client then sends it again); ``initial_rebalance_delay_ms``: how long
    the first rebalance of a group waits for more members (Kafka's
    ``group.initial.rebalance.delay.ms``, 3 s by default; 0 for none)."""
    if type(port) is not int or not 0 <= port < 65536:
        raise InvalidArgument(f"port must be an int in 0..65535, got {port!r}")
    check_initial_delay(initial_rebalance_delay_ms)
    name = gateway_actor_name(port) if port else None
    options: dict[str, Any] = {"namespace": NAMESPACE, "lifetime": "detached"}
    if name is not None:
        options.update(name=name, get_if_exists=True)
    actor = KafkaGatewayActor.options(**options).remote(port, bind_host, advertised_host, token, num_coordinators,
                                                        call_deadline_s, initial_rebalance_delay_ms)
    address = ray.get(actor.start.remote())
    address["actor"] = actor
    return address
