"""The gateway actor: an asyncio TCP server inside a Ray actor, speaking the Kafka protocol.

Why an actor: it runs on the Ray cluster next to the partition actors it calls, is found by name
(``kafka-gateway-<port>``), and outlives the driver that started it (detached), like the
engine's own actors. It advertises the address Kafka clients should connect to: the node's IP
(or ``advertised_host``) and the port it bound.

Each connection's requests are handled one at a time, in order, as a Kafka broker does: a
producer's batches to a partition arrive in the order it sent them, which its sequence numbers
rely on. Consumer-group membership is this actor's memory (``group_membership``, ticked every
``TICK_S``); committed offsets are raytxn subscriptions (``group_offsets``).

Security (when the engine has authentication on): each connection logs in with SASL PLAIN or
OAUTHBEARER carrying a raytxn token (``authentication``); until then it may only ask ApiVersions
and log in. Every engine call a request makes carries *that connection's* token, so the engine's
actors authorize it as that principal, exactly as the native client's calls; ``authorization``
checks first what no single actor sees whole. The gateway holds no secret and lends no token
of its own to anyone. The listener may speak TLS (``security.tls_context``), with client
certificates required when a client CA is given (mTLS).
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import logging
import os
import time
from pathlib import Path
from typing import Any

import ray

from raytxn.actors.shell import engine_actor_classes_imported, import_engine_actor_classes
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
from raytxn.kafka.authentication import Authenticator
from raytxn.kafka.authorization import RequestAuthorizer
from raytxn.kafka.broker import Broker, Connection
from raytxn.kafka.group_admin import GroupAdmin
from raytxn.kafka.group_membership import TICK_S, GroupMembership
from raytxn.kafka.group_offsets import Engine, GroupOffsets
from raytxn.kafka.groups import INITIAL_REBALANCE_DELAY_MS, GroupTable, check_initial_delay
from raytxn.kafka.mapping import raytxn_subscription, raytxn_topic
from raytxn.kafka.peers import NOT_COORDINATOR, REFRESH_S, Peer, PeerView
from raytxn.kafka.records import idempotent_only
from raytxn.kafka.security import (
    PRE_AUTH_APIS,
    REASONS,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    SESSION_EXPIRED,
    TOPIC_AUTHORIZATION_FAILED,
    UNAUTHENTICATED_CLOSED,
    Session,
    refusal_codes,
    refusal_fields,
    tls_context,
)
from raytxn.kafka.topic_admin import TopicAdmin, TopicSettings
from raytxn.kafka.transactions import KafkaTransactions
from raytxn.kafka.txn_admin import TransactionAdmin
from raytxn.metrics import kafka_refused

log = logging.getLogger(__name__)
CALL_DEADLINE_S = 30.0
MAX_ACTOR_REFS = 10_000
DEFAULT_BIND_HOST = "127.0.0.1"
MAX_PIPELINED_PRODUCES = 8  # a connection's Produce requests served at once (librdkafka sends up to 5)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
MAX_PEERS = 64  # gateways in one peer group
NODE_ZONE_LABEL = "ray.io/availability-zone"
# The group APIs only a group's coordinating gateway answers (it holds the membership that checks
# them): Join/Sync/Heartbeat/Leave, OffsetCommit and TxnOffsetCommit (generation checks),
# DescribeGroups, DeleteGroups, OffsetDelete. OffsetFetch is the engine's: any gateway reads it.
GROUP_COORDINATOR_APIS = frozenset({11, 12, 13, 14, 8, 28, 15, 42, 47})

# The session of the connection whose request is being served. Set in each connection's task
# (``_serve``); asyncio copies the context into every task and thread a request starts (the
# fetch waits, ``asyncio.to_thread`` lookups), so each engine call a request makes reads its own
# connection's token here, whatever else the gateway serves meanwhile. This is what keeps one
# client's rights from ever travelling with another's requests: no ref holds a token of its own.
_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar("kafka_gateway_session", default=None)


def _may_administer() -> bool:
    """Whether the connection being served may create and delete topics: a superuser's, or any
    when the engine has auth off (the supervisor checks again)."""
    session = _SESSION.get()
    return session is None or not session.auth_on or session.superuser


def _connection_token() -> str | None:
    session = _SESSION.get()
    return None if session is None else session.token


def _connection_caller() -> tuple[str | None, bool]:
    session = _SESSION.get()
    if session is None or not session.auth_on:
        return None, True
    return session.principal, session.superuser


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(bind_host: str, port: int) -> str:
    return (f"the Kafka gateway listens on {bind_host}:{port} with authentication OFF: anyone who reaches "
            f"that address can produce to and consume every topic of the engine, read and move any consumer "
            f"group's offsets and run transactions under any transactional id. Bind 127.0.0.1, or turn the "
            f"engine's authentication on (raytxn start --auth-secret ...)")


def gateway_actor_name(port: int) -> str:
    return f"kafka-gateway-{port}"


def peer_actor_prefix(peer_group: str) -> str:
    return f"kafka-gateways-{peer_group}-"


def peer_actor_name(peer_group: str, node_id: int) -> str:
    return f"{peer_actor_prefix(peer_group)}{node_id}"


class KafkaGateway:
    def __init__(self, port: int = 9092, bind_host: str = DEFAULT_BIND_HOST, advertised_host: str | None = None,
                 token: str | None = None, num_coordinators: int = 2, call_deadline_s: float = CALL_DEADLINE_S,
                 initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS,
                 tls: tuple[bytes, bytes, bytes | None] | None = None, node_id: int = 0,
                 peer_group: str | None = None, zone: str | None = None, watch_idle: bool = True) -> None:
        # ``token`` is not used for client requests: see ``start_gateway``.
        self.watch_idle = watch_idle  # see ``start_gateway``
        import_engine_actor_classes()  # else a client's first request to a partition imports them
        self.port, self.bind_host = port, bind_host
        # Gateways of one peer group (``gateways.start_gateways``) are one Kafka cluster (``peers``):
        # this one is broker ``node_id`` in it. None: a gateway alone, broker 0.
        if zone is None and peer_group is not None:  # the zone Ray knows the node by, if any
            labels = ray.get_runtime_context().get_node_labels() or {}
            zone = labels.get(NODE_ZONE_LABEL) or None
            zone = zone[0] if isinstance(zone, list) else zone
        self.node_id, self.peer_group, self.zone = node_id, peer_group, zone
        self.peers: PeerView | None = None
        self._peer_info: dict[str, Peer] = {}  # a peer's actor name -> its address (fixed for its life)
        self._peer_ticker: asyncio.Task | None = None
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.call_deadline_s = call_deadline_s  # how long one Kafka request waits on an engine call
        self._tls = tls  # (certificate chain, key, client CA or None) as PEM
        # Every ref presents the token of the connection being served (``_SESSION``), none its own.
        self._coordinators = [ActorRef(coordinator_actor_name(i), _connection_token)
                              for i in range(num_coordinators)]
        if advertised_host is None:  # a loopback listener is reached on loopback only
            advertised_host = "127.0.0.1" if is_loopback(bind_host) else ray.util.get_node_ip_address()
        self.advertised_host = advertised_host
        self._server: asyncio.base_events.Server | None = None
        self._refs: dict[str, ActorRef] = {}
        self._supervisor = ActorRef(SUPERVISOR_NAME, _connection_token)
        self._login_supervisor = ActorRef(SUPERVISOR_NAME)  # whoami with the token being checked
        self.auth_on = False
        self.authenticator = Authenticator(self._whoami, self._count_refusal)
        self.authorizer: RequestAuthorizer | None = None
        self.broker: Broker | None = None
        self.groups: GroupMembership | None = None
        self.offsets: GroupOffsets | None = None
        self.admin: GroupAdmin | None = None
        self.txn_admin: TransactionAdmin | None = None
        self.topic_admin: TopicAdmin | None = None
        self._ticker: asyncio.Task | None = None
        # Connections closed, by why (``wire.CLOSE_REASONS``): each with one log line, no traceback;
        # requests refused, by the Kafka error's name (``security.REASONS``).
        self.served: dict[str, Any] = {"connections": 0, "requests": 0,
                                       **{f"closed_{r}": 0 for r in wire.CLOSE_REASONS}, "refused": {},
                                       # Produce requests served while an earlier one appended, and
                                       # the most a connection had waiting for their answers at once
                                       "produces_pipelined": 0, "produces_in_flight_max": 0}
        self.warning: str | None = None
        self.versions: dict[str, int] = {}  # "api_key/version" -> requests (served ones only: bounded)
        # "api_key" -> [request bytes, response bytes] of the requests served (bounded as ``versions``)
        self.traffic: dict[str, list[int]] = {}

    async def start(self) -> dict[str, Any]:
        """Bind and serve (idempotent); returns the advertised address."""
        if self._server is None:
            # Public: whether to ask for logins is the engine's to say, and needs no token.
            config = await self._login_supervisor.call_async("engine_config", deadline_s=self.call_deadline_s)
            self.auth_on = bool(config.auth.enabled)
            ssl_context = None if self._tls is None else tls_context(*self._tls)
            self._server = await asyncio.start_server(
                self._serve, self.bind_host, self.port, ssl=ssl_context,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl_context else None)
            self.port = self._server.sockets[0].getsockname()[1]  # the port bound, also for port 0
            if not self.auth_on and not is_loopback(self.bind_host):
                self.warning = exposure_warning(self.bind_host, self.port)
                log.warning(self.warning)
            transactions = KafkaTransactions(f"kafka-gateway-{self.advertised_host}-{self.port}",
                                             self._home_call, self._txn_call, _connection_caller,
                                             shared=self.peer_group is not None)
            self.peers = PeerView(Peer(self.node_id, self.advertised_host, self.port, self.zone),
                                  joined_at=time.monotonic())
            self.broker = Broker(self.peers, self._topic_partitions, self._call, self._topic_names, transactions,
                                 watch_idle=self.watch_idle and not self.auth_on)
            self.groups = GroupMembership(GroupTable(initial_rebalance_delay_ms=self.initial_rebalance_delay_ms))
            engine = Engine(self.broker.partitions, self._call, self._subscription_call, self._subscription_names,
                            self._create_subscription, self._topic_rows)
            self.offsets = GroupOffsets(engine, self.groups, transactions)
            self.admin = GroupAdmin(self.groups, self._topic_rows, self._delete_subscription)
            self.txn_admin = TransactionAdmin(len(self._coordinators), self._describe_tids, self.broker.partitions,
                                              self._call, transactions, lambda: int(time.time() * 1000))
            self.topic_admin = TopicAdmin(self._create_topic, self._delete_topic, self._get_topic,
                                          self.broker.forget, _may_administer)
            self.authorizer = RequestAuthorizer(self._topic_actions, self.groups.table)
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
            if self.peer_group is not None:
                await self._refresh_peers()  # serve with the peers there are, not as one alone
                self._peer_ticker = asyncio.get_running_loop().create_task(self._tick_peers())
        return self.address()

    def peer(self) -> Peer | None:
        """This gateway as its peers list it (asked once per peer by each); None until it serves."""
        return None if self.peers is None else self.peers.me

    async def _tick_peers(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self._refresh_peers()
            except Exception:  # a GCS hiccup: the view stays as it was until the next refresh
                log.warning("listing the gateway's peers failed", exc_info=True)

    async def _refresh_peers(self) -> None:
        """The live gateways of this one's peer group, from Ray's named actors: a gateway that
        died (not restarted: ``max_restarts=0``) has no name any more, so it leaves every view at
        their next refresh, and its groups move (``peers``)."""
        assert self.peers is not None and self.peer_group is not None
        prefix = peer_actor_prefix(self.peer_group)
        named = await asyncio.to_thread(ray.util.list_named_actors, True)
        names = sorted(a["name"] for a in named if a["namespace"] == NAMESPACE and a["name"].startswith(prefix))
        live = []
        for name in names[:MAX_PEERS]:
            if name not in self._peer_info:
                try:
                    handle = ray.get_actor(name, namespace=NAMESPACE)
                    peer = await asyncio.wait_for(handle.peer.remote(), self.call_deadline_s)
                except (ValueError, TimeoutError, ray.exceptions.RayError) as e:  # just died: next refresh
                    log.info("gateway peer %s not listed: %r", name, e)
                    continue
                if peer is None:  # starting: listed once it serves
                    continue
                self._peer_info[name] = peer
            live.append(self._peer_info[name])
        for gone in set(self._peer_info) - set(names):
            del self._peer_info[gone]
        self.peers.refresh(live, time.monotonic())
        assert self.groups is not None
        for group_id in list(self.groups.table.groups):  # the groups another gateway took
            if self.peers.coordinator(group_id) != self.peers.me:
                self.groups.hand_off(group_id, NOT_COORDINATOR)

    def _not_coordinator(self, api_key: int, request: Any) -> int:
        """NONE, or the error a group request gets at a gateway that is not its group's
        coordinator now (``peers``); the client then asks FindCoordinator again."""
        if self.peer_group is None or api_key not in GROUP_COORDINATOR_APIS:
            return wire.NONE
        assert self.peers is not None
        if api_key == 15:
            group_ids = list(request.groups)
        elif api_key == 42:
            group_ids = list(request.groups_names)
        else:
            group_ids = [request.group_id]
        now = time.monotonic()
        return next((code for code in (self.peers.coordinates(g, now) for g in group_ids) if code), wire.NONE)

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
        return {"host": self.advertised_host, "port": self.port, "node_id": self.node_id, "pid": os.getpid(),
                "bootstrap": f"{self.advertised_host}:{self.port}", "auth": self.auth_on,
                "tls": self._tls is not None, "mtls": self._tls is not None and self._tls[2] is not None,
                "warning": self.warning, "watch_idle": self.broker is not None and self.broker.idle is not None,
                **self.served, "refused": dict(self.served["refused"])}

    def _count_refusal(self, reason: str) -> None:
        refused = self.served["refused"]
        refused[reason] = refused.get(reason, 0) + 1  # a bounded set of reasons (security.REASONS)
        kafka_refused(reason)

    async def _whoami(self, token: str) -> dict[str, Any]:
        return await self._login_supervisor.call_async("whoami", auth=token, deadline_s=self.call_deadline_s)

    async def _topic_actions(self, topics: list[str]) -> dict[str, list[str]]:
        return await self._supervisor.call_async("topic_actions", topics, deadline_s=self.call_deadline_s)

    # --- raytxn side ---------------------------------------------------------------------------

    async def _topic_partitions(self, topic: str) -> int:
        info = await self._supervisor.call_async("get_topic", topic, deadline_s=self.call_deadline_s)
        return int(info["partitions"])

    async def _get_topic(self, topic: str) -> dict[str, Any]:
        return await self._supervisor.call_async("get_topic", topic, deadline_s=self.call_deadline_s)

    async def _create_topic(self, topic: str, partitions: int, settings: TopicSettings) -> Any:
        return await self._supervisor.call_async(
            "create_topic", topic, partitions, settings.retention_bytes, settings.retention_s, settings.compacted,
            settings.compaction_threshold_bytes, deadline_s=self.call_deadline_s)

    async def _delete_topic(self, topic: str) -> Any:
        return await self._supervisor.call_async("delete_topic", topic, deadline_s=self.call_deadline_s)

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
            ref = self._refs[name] = ActorRef(name, _connection_token)
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
        session = Session(self.auth_on)
        _SESSION.set(session)  # this connection's task, and every task it starts (see _SESSION)
        # Answers in request order. A Produce of idempotent batches only is served while earlier
        # ones still append (librdkafka keeps up to 5 in flight: served one at a time, each waited
        # out its append's durable write, and the gateway sat idle); every other request waits
        # until everything before it was answered, as a Kafka broker serves a connection.
        answers: asyncio.Queue[asyncio.Future[bytes | None]] = asyncio.Queue(maxsize=MAX_PIPELINED_PRODUCES)
        answering = asyncio.get_running_loop().create_task(self._answer_in_order(answers, writer))
        try:
            while True:
                try:
                    prefix = await reader.readexactly(4)
                    payload = await reader.readexactly(wire.frame_size(prefix))
                except asyncio.IncompleteReadError:
                    return  # the client closed
                if answering.done():
                    return  # an answer failed and closed the connection
                if not session.raw_sasl and (produce := self._pipelined(payload)) is not None:
                    await answers.put(asyncio.ensure_future(self._respond(payload, conn, session, produce)))
                    self.served["produces_pipelined"] += 1
                    in_flight = answers.qsize() + 1  # those queued, and the one being answered
                    self.served["produces_in_flight_max"] = max(self.served["produces_in_flight_max"], in_flight)
                    continue
                await answers.join()  # every earlier answer written
                if answering.done():
                    return
                if session.raw_sasl:  # after a SaslHandshake v0: a bare SASL message
                    response: bytes | None = await self.authenticator.raw(payload, session)
                else:
                    response = await self._respond(payload, conn, session)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
        except Exception as e:  # noqa: BLE001 - whatever ends this connection, the others go on
            self._closing(writer, e)
        finally:
            answering.cancel()
            _cancel_waiting(answers)
            writer.close()

    def _closing(self, writer: asyncio.StreamWriter, e: BaseException) -> None:
        reason = wire.close_reason(e)
        self.served[f"closed_{reason}"] += 1
        log.warning("closing Kafka connection from %s (%s): %s: %s", writer.get_extra_info("peername"),
                    reason, type(e).__name__, e)

    @staticmethod
    def _pipelined(payload: bytes) -> Any:
        """The decoded request, if it is a Produce (api key 0) whose batches are all idempotent
        (``records.idempotent_only``); else None, and it is served in line."""
        try:
            header = wire.peek_header(payload)
            if header.api_key != 0:
                return None
            request = wire.decode_request(header, payload)
        except Exception:  # noqa: BLE001 - malformed: served in line, where its error is answered
            return None
        return request if idempotent_only(request) else None

    async def _answer_in_order(self, answers: asyncio.Queue[asyncio.Future[bytes | None]],
                               writer: asyncio.StreamWriter) -> None:
        """Write the pipelined answers in the order their requests came; a failed one closes the
        connection, as it would have served in line."""
        while True:  # until the connection's task cancels it
            answer = await answers.get()
            try:
                response = await answer
                if response is not None:
                    writer.write(response)
                    await writer.drain()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the connection closes; the others go on
                self._closing(writer, e)
                writer.close()
                _cancel_waiting(answers, mark_done=True)  # so nothing waits on them
                return
            finally:
                answers.task_done()

    async def _respond(self, payload: bytes, conn: Connection, session: Session,
                       decoded: Any = None) -> bytes | None:
        """The answer to one request (``decoded``: the request, when ``_pipelined`` decoded it)."""
        assert self.broker is not None and self.authorizer is not None
        header = wire.peek_header(payload)
        self.served["requests"] += 1
        if header.api_key == wire.API_VERSIONS:
            return wire.api_versions(header)
        request = decoded if decoded is not None else wire.decode_request(header, payload)
        if header.api_key == SASL_HANDSHAKE:
            return self.authenticator.handshake(header, request, session)
        if header.api_key == SASL_AUTHENTICATE:
            return await self.authenticator.authenticate(header, request, session)
        if session.auth_on:
            refused = await self._refused(header, request, session)
            if refused is not None:
                return refused or None  # b"": a refused acks=0 produce, which gets no answer
        not_coordinator = self._not_coordinator(header.api_key, request)
        if not_coordinator:
            fields = refusal_fields(header.api_key, request, header.api_version, not_coordinator,
                                    "this gateway does not coordinate the group now: ask FindCoordinator")
            assert fields is not None  # every group API has an error field
            return wire.encode_response(header, **fields)
        broker, groups, offsets, version = self.broker, self.groups, self.offsets, header.api_version
        admin, txn_admin, topic_admin = self.admin, self.txn_admin, self.topic_admin
        assert groups is not None and offsets is not None and admin is not None and txn_admin is not None
        assert topic_admin is not None
        seen = f"{header.api_key}/{version}"
        self.versions[seen] = self.versions.get(seen, 0) + 1
        handlers = {3: broker.metadata, 10: broker.find_coordinator, 2: broker.list_offsets,
                    1: broker.fetch, 22: broker.init_producer_id, 24: broker.add_partitions_to_txn,
                    26: broker.end_txn, 14: groups.sync_group, 12: groups.heartbeat, 13: groups.leave_group,
                    8: offsets.offset_commit, 9: offsets.offset_fetch, 25: offsets.add_offsets_to_txn,
                    28: offsets.txn_offset_commit, 16: admin.list_groups, 15: admin.describe_groups,
                    42: admin.delete_groups, 47: offsets.offset_delete, 61: txn_admin.describe_producers,
                    65: txn_admin.describe_transactions, 66: txn_admin.list_transactions,
                    19: topic_admin.create_topics, 20: topic_admin.delete_topics,
                    32: topic_admin.describe_configs}
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
        if session.auth_on and not session.superuser:
            for code in refusal_codes(fields):  # what the engine's actors refused inside the request
                self._count_refusal(REASONS[code])
        response = wire.encode_response(header, **fields)
        traffic = self.traffic.setdefault(str(header.api_key), [0, 0])
        traffic[0] += len(payload)
        traffic[1] += len(response)
        return response

    async def _refused(self, header: wire.RequestHeader, request: Any, session: Session) -> bytes | None:
        """The answer refusing a request of a connection that has not logged in, or is not
        authorized for it (``authorization``); None when it may be served. A connection on an
        expired token is closed (ConnectionError), as Kafka closes one that did not
        re-authenticate in time (KIP-368)."""
        assert self.authorizer is not None
        api_key, version = header.api_key, header.api_version
        if session.authenticated and session.expired(time.time()):
            self._count_refusal(SESSION_EXPIRED)
            raise ConnectionError(f"the session of {session.principal!r} ended: its token expired (log in again)")
        if not session.authenticated and api_key not in PRE_AUTH_APIS:
            code, message, topics = SASL_AUTHENTICATION_FAILED, (
                "authentication is on: log in with SASL PLAIN (username: your raytxn principal, password: "
                "its raytxn token) or OAUTHBEARER (a raytxn token)"), None
        else:
            refusal = await self.authorizer.check(api_key, request, version, session)
            if refusal is None:
                return None
            code, message, topics = refusal.code, refusal.message, refusal.topics
        # Metadata tells an unauthenticated client TOPIC_AUTHORIZATION_FAILED, Kafka's answer to its
        # anonymous principal: librdkafka fails the messages at once with it, where SASL's code
        # in Metadata made it wait out message.timeout.ms and say only "timed out".
        shown = TOPIC_AUTHORIZATION_FAILED if api_key == 3 and code == SASL_AUTHENTICATION_FAILED else code
        fields = refusal_fields(api_key, request, version, shown, message, topics)
        if fields is None:  # no error field to say it in: closed, with the reason in the log
            self._count_refusal(UNAUTHENTICATED_CLOSED if code == SASL_AUTHENTICATION_FAILED else REASONS[code])
            raise ConnectionError(f"API key {api_key} refused: {message}")
        self._count_refusal(REASONS[code])
        if api_key == 0 and request.acks == 0:
            return b""
        return wire.encode_response(header, **fields)

    async def stats(self) -> dict[str, Any]:
        """The address, request counts, the API versions clients used and the consumer groups."""
        groups = {} if self.groups is None else {
            g.group_id: {"state": str(g.state), "generation": g.generation, "members": len(g.members)}
            for g in self.groups.table.groups.values()}
        batches: dict[str, Any] = {} if self.broker is None else {**self.broker.batch_stats, "fetch_cache": {
            "hits": self.broker.encoded.hits, "misses": self.broker.encoded.misses,
            "held_bytes": self.broker.encoded.held_bytes}}
        idle = None if self.broker is None or self.broker.idle is None else self.broker.idle
        idle_stats = None if idle is None else {**idle.stats, "forgotten": dict(idle.stats["forgotten"]),
                                                "watched": len(idle)}
        peers = [] if self.peers is None else [p.node_id for p in self.peers.brokers()]
        return {**self.address(), "versions": dict(self.versions), "groups": groups, "batches": batches,
                "traffic": {key: list(pair) for key, pair in self.traffic.items()}, "idle_partitions": idle_stats,
                "node_id": self.node_id, "peer_group": self.peer_group, "peers": peers,
                "actor_classes_imported": engine_actor_classes_imported()}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in (self._ticker, self._peer_ticker):
            if task is not None:
                task.cancel()
        if self.broker is not None and self.broker.idle is not None:
            self.broker.idle.close()
        self._ticker = self._peer_ticker = None


def _cancel_waiting(answers: asyncio.Queue[asyncio.Future[bytes | None]], mark_done: bool = False) -> None:
    """Cancel the answers still queued (bounded by the queue's size); ``mark_done`` for a queue
    something may be joining."""
    while not answers.empty():
        answers.get_nowait().cancel()
        if mark_done:
            answers.task_done()


# Not restarted by Ray: a restarted actor would not serve until start() is called again; `raytxn
# kafka` (or start_gateway) with the same port starts it again.
KafkaGatewayActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=10_000)(KafkaGateway)


def start_gateway(port: int = 9092, *, bind_host: str = DEFAULT_BIND_HOST, advertised_host: str | None = None,
                  token: str | None = None, num_coordinators: int = 2,
                  call_deadline_s: float = CALL_DEADLINE_S,
                  initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS,
                  tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                  tls_client_ca: str | Path | None = None, watch_idle: bool = True) -> dict[str, Any]:
    """Start a Kafka gateway actor on the Ray cluster this driver is connected to (after
    ``raytxn.connect``), serving ``port`` (0: any free port); returns its advertised address,
    ``bootstrap`` being what Kafka clients take as ``bootstrap.servers``. Idempotent per port.
    ``bind_host``: the interface to listen on, loopback unless told otherwise (another one with
    the engine's authentication off logs a warning, also returned as ``warning``);
    ``advertised_host``: what clients are told to connect to (default: 127.0.0.1 for a loopback
    listener, else the node's IP). ``num_coordinators``: the engine's
    (``client.config.coordinator.num_coordinators``); ``call_deadline_s``: how long a request
    waits on an engine call before it answers a retriable error (the client then sends it
    again); ``initial_rebalance_delay_ms``: how long the first rebalance of a group waits for
    more members (Kafka's ``group.initial.rebalance.delay.ms``, 3 s by default; 0 for none).

    Security: with the engine's authentication on, every Kafka connection logs in (SASL PLAIN
    or OAUTHBEARER with a raytxn token) and acts as that principal only. ``token`` lends no
    rights to anyone: it is accepted for compatibility and not used (before, every client acted
    with it). ``tls_cert`` and ``tls_key`` (PEM files, read here, on the driver): the listener
    speaks TLS; with ``tls_client_ca`` too, clients must present a certificate that CA signed
    (mTLS). The certificate verifies the client; the principal it acts as is still the one its
    SASL login names when authentication is on.

    ``watch_idle``: answer a fetch of a partition known to hold nothing past the fetch offset from
    a watch of it instead of reading it (``kafka.idle_partitions``; with authentication off only);
    False reads every partition a Fetch names, every time."""
    if type(port) is not int or not 0 <= port < 65536:
        raise InvalidArgument(f"port must be an int in 0..65535, got {port!r}")
    check_initial_delay(initial_rebalance_delay_ms)
    tls = _read_tls(tls_cert, tls_key, tls_client_ca)
    if token is not None:
        log.info("start_gateway(token=...) is not used: each Kafka connection logs in with its own token")
    name = gateway_actor_name(port) if port else None
    options: dict[str, Any] = {"namespace": NAMESPACE, "lifetime": "detached"}
    if name is not None:
        options.update(name=name, get_if_exists=True)
    actor = KafkaGatewayActor.options(**options).remote(port, bind_host, advertised_host, None, num_coordinators,
                                                        call_deadline_s, initial_rebalance_delay_ms, tls,
                                                        watch_idle=watch_idle)
    address = ray.get(actor.start.remote())
    address["actor"] = actor
    return address


def start_gateways(count: int | None = None, port: int = 9092, *, peer_group: str = "default",
                   bind_host: str = DEFAULT_BIND_HOST, advertised_host: str | None = None,
                   num_coordinators: int = 2, call_deadline_s: float = CALL_DEADLINE_S,
                   initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS,
                   tls_cert: str | Path | None = None, tls_key: str | Path | None = None,
                   tls_client_ca: str | Path | None = None) -> list[dict[str, Any]]:
    """Start a peer group of gateways, one Kafka cluster to clients (``peers``): one per alive
    node (``count`` None) or ``count`` spread over the nodes in turn, the k-th on a node serving
    ``port + k`` (0: any free port). Gateway ``i`` is broker ``i``, in the zone its node's
    ``ray.io/availability-zone`` label names. Idempotent: a gateway of the group that is running
    is kept, one that died is started again under its broker id. Returns their addresses in broker
    order; any of them (or all, comma-separated) is a client's ``bootstrap.servers``. The other
    arguments are ``start_gateway``'s."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if type(port) is not int or not 0 <= port < 65536:
        raise InvalidArgument(f"port must be an int in 0..65535, got {port!r}")
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    count = len(nodes) if count is None else count
    if type(count) is not int or not 1 <= count <= MAX_PEERS:
        raise InvalidArgument(f"gateways: an int in 1..{MAX_PEERS}, got {count!r}")
    if not peer_group.replace("-", "").replace("_", "").isalnum() or len(peer_group) > 64:
        raise InvalidArgument(f"peer group {peer_group!r}: letters, digits, - and _ only (64 at most)")
    check_initial_delay(initial_rebalance_delay_ms)
    tls = _read_tls(tls_cert, tls_key, tls_client_ca)
    if port and count > len(nodes) and port + count // len(nodes) >= 65536:
        raise InvalidArgument(f"{count} gateways from port {port} run past 65535")
    actors = []
    for i in range(count):
        node, nth_on_node = nodes[i % len(nodes)], i // len(nodes)
        actors.append(KafkaGatewayActor.options(
            namespace=NAMESPACE, lifetime="detached", name=peer_actor_name(peer_group, i), get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(port + nth_on_node if port else 0, bind_host, advertised_host, None, num_coordinators,
                 call_deadline_s, initial_rebalance_delay_ms, tls, i, peer_group))
    addresses = ray.get([a.start.remote() for a in actors])
    for address, actor in zip(addresses, actors, strict=True):
        address["actor"] = actor
    return addresses


def stop_gateways(peer_group: str = "default") -> int:
    """End every gateway of a peer group (their clients' connections close); how many there were."""
    prefix = peer_actor_prefix(peer_group)
    names = [a["name"] for a in ray.util.list_named_actors(True)
             if a["namespace"] == NAMESPACE and a["name"].startswith(prefix)]
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        except ValueError:  # ended meanwhile
            pass
    return len(names)


def _read_tls(cert: str | Path | None, key: str | Path | None,
              client_ca: str | Path | None) -> tuple[bytes, bytes, bytes | None] | None:
    """The PEM contents of the TLS files (the gateway actor may run on another node than the
    driver that names them); ``InvalidArgument`` for half a configuration or a file not there."""
    if cert is None and key is None:
        if client_ca is not None:
            raise InvalidArgument("tls_client_ca needs tls_cert and tls_key (mTLS is TLS with client certificates)")
        return None
    if cert is None or key is None:
        raise InvalidArgument("TLS needs both tls_cert and tls_key")
    try:
        read = [Path(f).read_bytes() for f in (cert, key)]
        ca = None if client_ca is None else Path(client_ca).read_bytes()
    except OSError as e:
        raise InvalidArgument(f"cannot read a TLS file: {e}") from None
    try:
        tls_context(read[0], read[1], ca)  # a bad certificate or key is said here, not in the actor
    except (ValueError, OSError) as e:  # ssl.SSLError is an OSError
        raise InvalidArgument(f"the TLS certificate, key or client CA is not usable: {e}") from None
    return read[0], read[1], ca
