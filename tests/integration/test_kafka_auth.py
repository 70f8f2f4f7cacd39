"""The Kafka gateway on an engine with authentication on, driven by real Kafka clients
(confluent-kafka, kafka-python) and by raw Kafka frames where a client cannot be made to send
what is tested (SaslHandshake v0, a request after the token expired). One engine; one SASL
gateway on loopback and one with TLS and client certificates (mTLS), plus a TLS-only one for a
moment. alice may produce and consume topic ``data``; bob may do both on his own topic only;
admin is the superuser. Every refusal is checked to change nothing, through the native client."""

from __future__ import annotations

import datetime
import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.auth import create_token, new_secret
from raytxn.kafka.gateway import start_gateway
from tests.engine import engine_client, new_topic, visible_values
from tests.kafka_clients import poll_values

pytestmark = pytest.mark.ray

SECRET = new_secret()
ADMIN = create_token(SECRET, "admin")
ALICE = create_token(SECRET, "alice")
BOB = create_token(SECRET, "bob")
FAIL_FAST = {"message.timeout.ms": 4000, "socket.timeout.ms": 4000}


@pytest.fixture(scope="module")
def admin(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, token=ADMIN, auth_secret=SECRET)


@pytest.fixture(scope="module")
def gateway(admin: rt.Client) -> Iterator[dict[str, Any]]:
    address = start_gateway(0, num_coordinators=admin.config.coordinator.num_coordinators,
                            initial_rebalance_delay_ms=0)
    try:
        yield address
    finally:
        ray.kill(address["actor"], no_restart=True)


@pytest.fixture(scope="module")
def topics(admin: rt.Client) -> dict[str, str]:
    """``data``: alice's (produce, consume); ``bobs``: bob's own; bob has nothing on ``data``."""
    data, bobs = new_topic(admin, prefix="kauth"), new_topic(admin, prefix="kbob")
    admin.grant_permission(data, "alice", ["produce", "consume"])
    admin.grant_permission(bobs, "bob", ["produce", "consume"])
    producer = admin.create_producer(data)
    for i in range(3):
        producer.send(f"seed-{i}".encode())
    producer.close()
    return {"data": data, "bobs": bobs}


def plain(bootstrap: str, user: str, token: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": token, **extra}


def oauth(bootstrap: str, token_for: Callable[[], tuple[str, float]], **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _config: token_for(), **extra}


def delivery_errors(config: dict[str, Any], topic: str, count: int = 1) -> list[Any]:
    """Produce ``count`` messages with confluent-kafka; the delivery errors (None: delivered)."""
    from confluent_kafka import Producer

    results: list[Any] = []
    producer = Producer(config)
    for i in range(count):
        producer.produce(topic, f"m{i}".encode(), on_delivery=lambda err, _msg: results.append(err))
    producer.flush(30)
    return results


def stats(address: dict[str, Any]) -> dict[str, Any]:
    return ray.get(address["actor"].stats.remote())


# --- logins ------------------------------------------------------------------------------------


def test_plain_and_oauthbearer_logins_with_confluent_kafka(admin: rt.Client, gateway: dict[str, Any],
                                                         topics: dict[str, str]) -> None:
    from confluent_kafka import Consumer

    data, bootstrap = topics["data"], gateway["bootstrap"]
    before = visible_values(data, token=ADMIN)
    assert delivery_errors(plain(bootstrap, "alice", ALICE, acks="all"), data, 2) == [None, None]
    token = create_token(SECRET, "alice", expires_at_s=time.time() + 600)
    assert delivery_errors(oauth(bootstrap, lambda: (token, time.time() + 600), acks="all"), data) == [None]
    assert visible_values(data, token=ADMIN) == [*before, b"m0", b"m1", b"m0"]

    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(oauth(bootstrap, lambda: (token, time.time() + 600), **{
        "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    consumer.subscribe([data])
    got = poll_values(consumer, len(before) + 3)
    consumer.commit(asynchronous=False)
    consumer.close()
    assert [m.value() for m in got] == [*before, b"m0", b"m1", b"m0"]
    assert group in admin.get_topic(data)["subscriptions"]  # the group's offsets are alice's subscription


def test_kafka_python_plain_and_oauthbearer(admin: rt.Client, gateway: dict[str, Any], topics: dict[str, str]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        def token(self) -> str:
            return create_token(SECRET, "alice", expires_at_s=time.time() + 600)

    data, bootstrap = topics["data"], gateway["bootstrap"]
    before = visible_values(data, token=ADMIN)
    producer = KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password=ALICE)
    producer.send(data, b"kp-plain").get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=Provider(),
                             enable_auto_commit=False, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(data, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < len(before) + 1 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value for r in records)
    consumer.close()
    assert values == [*before, b"kp-plain"]


@pytest.mark.parametrize("case", ["missing", "wrong_secret", "expired", "other_username", "garbage"])
def test_bad_credentials_are_refused_and_change_nothing(gateway: dict[str, Any], topics: dict[str, str],
                                                        case: str) -> None:
    from confluent_kafka import KafkaError

    data, bootstrap = topics["data"], gateway["bootstrap"]
    before = visible_values(data, token=ADMIN)
    refused_before = stats(gateway)["refused"]
    if case == "missing":  # no SASL configured at all: the "anyone acts as the operator"
        config = {"bootstrap.servers": bootstrap, **FAIL_FAST}
    else:
        password = {"wrong_secret": create_token(new_secret(), "alice"),
                    "expired": create_token(SECRET, "alice", expires_at_s=time.time() - 5),
                    "other_username": BOB, "garbage": "not-a-token"}[case]
        config = plain(bootstrap, "alice", password, **FAIL_FAST)
    errors = delivery_errors(config, data)
    assert len(errors) == 1 and errors[0] is not None
    if case == "missing":  # Metadata said so (Kafka's answer to an anonymous principal)
        assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]
    else:  # the login failed: nothing was ever sent, librdkafka times the message out
        assert errors[0].code() in (KafkaError._MSG_TIMED_OUT, KafkaError._AUTHENTICATION), errors[0]
    assert visible_values(data, token=ADMIN) == before
    refused = stats(gateway)["refused"]
    assert refused.get("sasl_authentication_failed", 0) > refused_before.get("sasl_authentication_failed", 0)


def test_kafka_python_gets_the_reason_of_a_refused_login(gateway: dict[str, Any], topics: dict[str, str],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """kafka-python logs the gateway's SaslAuthenticate message: which principal, what was wrong."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    before = visible_values(topics["data"], token=ADMIN)
    with caplog.at_level(logging.ERROR, logger="kafka"), pytest.raises(KafkaError) as raised:
        producer = KafkaProducer(bootstrap_servers=gateway["bootstrap"], security_protocol="SASL_PLAINTEXT",
                                 sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password=ALICE,
                                 max_block_ms=6000, request_timeout_ms=6000, bootstrap_timeout_ms=6000)
        try:
            producer.send(topics["data"], b"as-bob-with-alices-token").get(timeout=6)
        finally:
            producer.close(timeout=1)
    assert any("the username 'bob' is not the token's principal 'alice'" in r.getMessage() for r in caplog.records), (
        raised.value, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING])
    assert visible_values(topics["data"], token=ADMIN) == before


# --- authorization -----------------------------------------------------------------------------


def test_a_principal_without_permission_is_refused_everywhere_and_nothing_changes(
        admin: rt.Client, gateway: dict[str, Any], topics: dict[str, str]) -> None:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

    data, bobs, bootstrap = topics["data"], topics["bobs"], gateway["bootstrap"]
    before, subscriptions = visible_values(data, token=ADMIN), admin.get_topic(data)["subscriptions"]
    as_bob = plain(bootstrap, "bob", BOB)

    # produce
    errors = delivery_errors({**as_bob, **FAIL_FAST}, data)
    assert errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]
    assert delivery_errors(as_bob, bobs) == [None]  # his own topic: fine

    # fetch (assigned, no group)
    consumer = Consumer({**as_bob, "group.id": f"bob-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(data, 0, 0)])
    error = None
    deadline = time.monotonic() + 20
    while error is None and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is not None, "bob fetched alice's topic"
            error = message.error()
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error

    # offset commit (of the assigned partition)
    with pytest.raises(KafkaException) as raised:
        consumer.commit(offsets=[TopicPartition(data, 0, 1)], asynchronous=False)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED or any(
        p.error is not None and p.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        for p in getattr(raised.value.args[0], "partitions", []) or []), raised.value
    consumer.close()

    # group join with a subscription to alice's topic
    joiner = Consumer({**as_bob, "group.id": f"bobg-{uuid.uuid4().hex[:6]}", "session.timeout.ms": 6000})
    joiner.subscribe([data])
    error = None
    deadline = time.monotonic() + 20
    while error is None and time.monotonic() < deadline:
        message = joiner.poll(0.2)
        if message is not None and message.error() is not None:
            error = message.error()
        assert message is None or message.error() is not None, "bob consumed alice's topic"
    joiner.close()
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error

    # send_offsets_to_transaction: bob's txn writes his own topic, offsets of alice's
    producer = Producer({**as_bob, "transactional.id": f"bob-tx-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(bobs, b"in-bobs-txn")
    metadata_consumer = Consumer({**as_bob, "group.id": f"bobtx-{uuid.uuid4().hex[:6]}"})
    with pytest.raises(KafkaException) as raised:
        producer.send_offsets_to_transaction([TopicPartition(data, 0, 2)],
                                             metadata_consumer.consumer_group_metadata(), 30)
    assert "authorization" in str(raised.value).lower(), raised.value
    producer.abort_transaction(30)
    metadata_consumer.close()
    assert b"in-bobs-txn" not in visible_values(bobs, token=ADMIN)

    # nothing of alice's changed: no data, no subscription (group offsets) of bob's
    assert visible_values(data, token=ADMIN) == before
    assert admin.get_topic(data)["subscriptions"] == subscriptions
    refused = stats(gateway)["refused"]
    assert refused.get("topic_authorization_failed", 0) >= 3 and refused.get("group_authorization_failed", 0) >= 1


def test_a_partition_alice_reads_idle_is_still_refused_to_bob(gateway: dict[str, Any],
                                                               topics: dict[str, str]) -> None:
    """With authentication on, the gateway does not answer fetches of idle partitions from its own
    knowledge of their ends (``kafka.idle_partitions``): a read is where the partition checks the
    connection's right to consume. alice fetches ``data`` at its end for a while (which, with
    authentication off, has the gateway watch it and answer such fetches without reading); bob's
    fetch at that same end is refused. Fails when the gateway watches with authentication on:
    bob then gets alice's empty answer, and no error."""
    from confluent_kafka import Consumer, TopicPartition

    data, bootstrap = topics["data"], gateway["bootstrap"]
    assert gateway["watch_idle"] is False
    alice = Consumer(plain(bootstrap, "alice", ALICE, **{"group.id": f"a-{uuid.uuid4().hex[:6]}",
                                                          "enable.auto.commit": False, "fetch.wait.max.ms": 100}))
    end = alice.get_watermark_offsets(TopicPartition(data, 0), timeout=30)[1]
    alice.assign([TopicPartition(data, 0, end)])
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        message = alice.poll(0.1)
        assert message is None or message.error() is None, message.error()
    bob = Consumer(plain(bootstrap, "bob", BOB, **{"group.id": f"b-{uuid.uuid4().hex[:6]}",
                                                   "enable.auto.commit": False, "fetch.wait.max.ms": 100}))
    bob.assign([TopicPartition(data, 0, end)])
    error = None
    deadline = time.monotonic() + 20
    while error is None and time.monotonic() < deadline:
        message = bob.poll(0.1)
        if message is not None:
            error = message.error()
            assert error is not None, "bob fetched alice's topic"
    alice.close()
    bob.close()
    assert error is not None and error.code() == 29, error  # TOPIC_AUTHORIZATION_FAILED
    assert stats(gateway)["idle_partitions"] is None


def test_only_a_superuser_creates_or_deletes_topics_through_the_gateway(
        admin: rt.Client, gateway: dict[str, Any], topics: dict[str, str]) -> None:
    """CreateTopics and DeleteTopics of a principal that is not a superuser are
    TOPIC_AUTHORIZATION_FAILED and change nothing (raytxn's own client refuses them too); the
    superuser's succeed. Describing configs needs a login only, as get_topic does."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

    bootstrap, bobs = gateway["bootstrap"], topics["bobs"]
    as_bob, as_admin = AdminClient(plain(bootstrap, "bob", BOB)), AdminClient(plain(bootstrap, "admin", ADMIN))
    wanted = f"kbob-new-{uuid.uuid4().hex[:6]}"
    with pytest.raises(KafkaException) as refused:
        as_bob.create_topics([NewTopic(wanted, 1, 1)], request_timeout=30)[wanted].result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as refused:
        as_bob.delete_topics([bobs], request_timeout=30)[bobs].result(30)  # even his own topic
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    names = {t["name"] for t in admin.list_topics()}
    assert bobs in names and wanted not in names
    resource = ConfigResource(ResourceType.TOPIC, bobs)
    assert as_bob.describe_configs([resource], request_timeout=30)[resource].result(30)["cleanup.policy"].value == \
        "delete"
    assert as_admin.create_topics([NewTopic(wanted, 2, 1)], request_timeout=30)[wanted].result(30) is None
    assert admin.get_topic(wanted)["partitions"] == 2
    assert as_admin.delete_topics([wanted], request_timeout=30)[wanted].result(30) is None
    assert wanted not in {t["name"] for t in admin.list_topics()}


def test_a_transactional_id_belongs_to_its_principal(gateway: dict[str, Any], topics: dict[str, str]) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    bootstrap, tid = gateway["bootstrap"], f"alice-tx-{uuid.uuid4().hex[:6]}"
    alice = Producer(plain(bootstrap, "alice", ALICE, **{"transactional.id": tid}))
    alice.init_transactions(30)
    alice.begin_transaction()
    alice.produce(topics["data"], b"alice-in-txn")
    alice.commit_transaction(30)
    bob = Producer(plain(bootstrap, "bob", BOB, **{"transactional.id": tid}))
    with pytest.raises(KafkaException) as raised:
        bob.init_transactions(20)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, raised.value
    alice.begin_transaction()  # alice's producer was not fenced by bob's attempt
    alice.produce(topics["data"], b"alice-again")
    alice.commit_transaction(30)
    assert visible_values(topics["data"], token=ADMIN)[-2:] == [b"alice-in-txn", b"alice-again"]


def test_a_permitted_principal_runs_a_transaction_with_offsets(admin: rt.Client, gateway: dict[str, Any],
                                                              topics: dict[str, str]) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    data, bootstrap = topics["data"], gateway["bootstrap"]
    group = f"alice-eos-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(plain(bootstrap, "alice", ALICE, **{"group.id": group, "enable.auto.commit": False,
                                                            "auto.offset.reset": "earliest"}))
    consumer.subscribe([data])
    assert poll_values(consumer, 1)
    producer = Producer(plain(bootstrap, "alice", ALICE, **{"transactional.id": f"alice-eos-{uuid.uuid4().hex[:6]}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(data, b"eos-out")
    producer.send_offsets_to_transaction([TopicPartition(data, 0, 1)], consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    committed = consumer.committed([TopicPartition(data, 0)], timeout=20)
    consumer.close()
    assert committed[0].offset == 1
    assert visible_values(data, token=ADMIN)[-1] == b"eos-out"


def test_the_supervisor_says_what_the_caller_may_do_on_topics(topics: dict[str, str]) -> None:
    from raytxn.client.rpc import ActorRef
    from raytxn.errors import AuthenticationFailed, InvalidArgument

    data, bobs = topics["data"], topics["bobs"]
    asked = [data, bobs, "no-such-topic"]

    def actions(token: str | None) -> dict[str, list[str]]:
        return ActorRef("supervisor", token).call("topic_actions", asked)

    assert actions(ALICE) == {data: ["consume", "produce"], bobs: []}
    assert actions(BOB) == {data: [], bobs: ["consume", "produce"]}
    assert actions(ADMIN) == {data: ["consume", "produce"], bobs: ["consume", "produce"]}
    with pytest.raises(AuthenticationFailed):
        actions(None)
    with pytest.raises(InvalidArgument):
        ActorRef("supervisor", ALICE).call("topic_actions", "not-a-list")


# --- the session's end -------------------------------------------------------------------------


def frame(api_key: int, version: int, correlation: int, body: bytes, client_id: bytes = b"t") -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id
    return struct.pack(">i", len(header) + len(body)) + header + body


def kstring(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def kbytes(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    return exactly(struct.unpack(">i", exactly(4))[0])


def connect(address: dict[str, Any]) -> socket.socket:
    return socket.create_connection((address["host"], address["port"]), timeout=10)


METADATA_V1_ALL = struct.pack(">i", -1)  # Metadata v1: every topic


def test_sasl_handshake_v0_then_raw_plain(gateway: dict[str, Any]) -> None:
    with connect(gateway) as sock:
        sock.sendall(frame(17, 0, 1, kstring("PLAIN")))
        answer = read_frame(sock)
        assert struct.unpack_from(">ih", answer) == (1, 0)  # correlation id, no error
        message = b"\x00alice\x00" + ALICE.encode()
        sock.sendall(struct.pack(">i", len(message)) + message)
        assert read_frame(sock) == b""  # an empty raw frame: logged in
        sock.sendall(frame(3, 1, 2, METADATA_V1_ALL))
        assert struct.unpack_from(">i", read_frame(sock))[0] == 2  # served
    with connect(gateway) as sock:  # a bad raw login: the connection is closed
        sock.sendall(frame(17, 0, 1, kstring("PLAIN")))
        read_frame(sock)
        message = b"\x00alice\x00" + BOB.encode()
        sock.sendall(struct.pack(">i", len(message)) + message)
        with pytest.raises((ConnectionError, OSError)):
            read_frame(sock)


def authenticate_v1(sock: socket.socket, message: bytes, correlation: int = 2) -> tuple[int, str | None, int]:
    """SaslHandshake v1 + SaslAuthenticate v1: (error code, error message, session lifetime ms)."""
    mechanism = "PLAIN" if message.startswith(b"\x00") else "OAUTHBEARER"
    sock.sendall(frame(17, 1, correlation, kstring(mechanism)))
    assert struct.unpack_from(">ih", read_frame(sock)) == (correlation, 0)
    sock.sendall(frame(36, 1, correlation + 1, kbytes(message)))
    answer = read_frame(sock)
    (code,) = struct.unpack_from(">h", answer, 4)
    (size,) = struct.unpack_from(">h", answer, 6)
    text = None if size < 0 else answer[8:8 + size].decode()
    at = 8 + max(size, 0)
    (auth_size,) = struct.unpack_from(">i", answer, at)
    (lifetime,) = struct.unpack_from(">q", answer, at + 4 + max(auth_size, 0))
    return code, text, lifetime


def test_a_session_ends_at_its_tokens_expiry_kip_368(gateway: dict[str, Any]) -> None:
    token = create_token(SECRET, "alice", expires_at_s=time.time() + 3)
    with connect(gateway) as sock:
        code, text, lifetime = authenticate_v1(sock, f"n,,\x01auth=Bearer {token}\x01\x01".encode())
        assert (code, text) == (0, None) and 0 < lifetime <= 3000
        sock.sendall(frame(3, 1, 9, METADATA_V1_ALL))
        read_frame(sock)
        # a re-authentication as someone else is refused; the session stays alice's
        assert authenticate_v1(sock, b"\x00bob\x00" + BOB.encode(), 10)[:2] == (
            58, "SASL/PLAIN authentication failed: re-authentication as 'bob' on a connection of 'alice'")
        time.sleep(3.2)
        sock.sendall(frame(3, 1, 20, METADATA_V1_ALL))
        with pytest.raises((ConnectionError, OSError)):
            read_frame(sock)  # closed: the token expired and no new login came
    assert stats(gateway)["refused"].get("session_expired", 0) >= 1


def test_refusals_name_the_principal(gateway: dict[str, Any]) -> None:
    with connect(gateway) as sock:
        assert authenticate_v1(sock, b"\x00alice\x00" + BOB.encode())[:2] == (
            58, "SASL/PLAIN authentication failed: the username 'alice' is not the token's principal 'bob'")
    with connect(gateway) as sock:
        expired = create_token(SECRET, "alice", time.time() - 1)
        code, text, _ = authenticate_v1(sock, b"\x00alice\x00" + expired.encode())
        assert code == 58 and "expired" in (text or "") and "alice" in (text or "")


def test_confluent_kafka_reauthenticates_past_its_first_tokens_expiry(gateway: dict[str, Any],
                                                                       topics: dict[str, str]) -> None:
    """oauth_cb hands out tokens living 4 s; the producer goes on past the first one's end
    (librdkafka refreshes the token and re-authenticates, KIP-368)."""
    from confluent_kafka import Producer

    issued: list[float] = []

    def token_for(_config: Any) -> tuple[str, float]:
        expires = time.time() + 4
        issued.append(expires)
        return create_token(SECRET, "alice", expires_at_s=expires), expires

    data = topics["data"]
    producer = Producer({"bootstrap.servers": gateway["bootstrap"], "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "OAUTHBEARER", "oauth_cb": token_for, "acks": "all"})
    results: list[Any] = []
    for i in range(2):
        producer.produce(data, f"reauth-{i}".encode(), on_delivery=lambda err, _m: results.append(err))
        producer.flush(30)
        if i == 0:
            deadline = time.monotonic() + 6  # past the first token's expiry, serving callbacks meanwhile
            while time.monotonic() < deadline:
                producer.poll(0.2)
    assert results == [None, None] and len(issued) >= 2
    assert visible_values(data, token=ADMIN)[-2:] == [b"reauth-0", b"reauth-1"]


# --- TLS ---------------------------------------------------------------------------------------


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def certificate(name: str, key: Any, issuer: Any, issuer_key: Any, ca: bool, sans: list[Any]) -> Any:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    import ipaddress

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raytxn test CA")])
    ca = certificate("raytxn test CA", ca_key, ca_name, ca_key, True, [])
    files: dict[str, Path] = {}
    for role, sans in (("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                       ("client", [])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = certificate(f"raytxn {role}", key, ca_name, ca_key, False, sans)
        files[f"{role}_cert"] = folder / f"{role}.pem"
        files[f"{role}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{role}_key"] = folder / f"{role}.key"
        files[f"{role}_key"].write_bytes(key_pem(key))
    files["ca"] = folder / "ca.pem"
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return files


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def test_sasl_over_tls_and_mtls(admin: rt.Client, topics: dict[str, str], certificates: dict[str, Path]) -> None:
    from confluent_kafka import KafkaError

    data = topics["data"]
    tls_only = start_gateway(0, tls_cert=certificates["server_cert"], tls_key=certificates["server_key"])
    mtls = start_gateway(0, tls_cert=certificates["server_cert"], tls_key=certificates["server_key"],
                         tls_client_ca=certificates["ca"])
    try:
        assert (tls_only["tls"], tls_only["mtls"], mtls["mtls"]) == (True, False, True)
        ssl_client = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(certificates["ca"])}
        with_cert = {"ssl.certificate.location": str(certificates["client_cert"]),
                     "ssl.key.location": str(certificates["client_key"])}
        before = visible_values(data, token=ADMIN)
        assert delivery_errors({**plain(tls_only["bootstrap"], "alice", ALICE), **ssl_client}, data) == [None]
        assert delivery_errors({**plain(mtls["bootstrap"], "alice", ALICE), **ssl_client, **with_cert},
                               data) == [None]
        # under mTLS, a client without a certificate is refused (the TLS handshake fails)
        errors = delivery_errors({**plain(mtls["bootstrap"], "alice", ALICE), **ssl_client, **FAIL_FAST}, data)
        assert errors[0] is not None and errors[0].code() in (KafkaError._MSG_TIMED_OUT, KafkaError._SSL), errors[0]
        # a plaintext client cannot talk to a TLS listener
        errors = delivery_errors({**plain(tls_only["bootstrap"], "alice", ALICE), **FAIL_FAST}, data)
        assert errors[0] is not None
        # SASL is still required over TLS: a certificate does not name a principal
        errors = delivery_errors({"bootstrap.servers": mtls["bootstrap"], "security.protocol": "SSL",
                                  "ssl.ca.location": str(certificates["ca"]), **with_cert, **FAIL_FAST}, data)
        assert errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]
        # exactly the two accepted sends were added (retention may trim the front meanwhile: the
        # module's groups ack this topic, and a range every subscription acked may go)
        after, expected = visible_values(data, token=ADMIN), [*before, b"m0", b"m0"]
        assert 2 <= len(after) <= len(expected) and after == expected[len(expected) - len(after):]
    finally:
        for address in (tls_only, mtls):
            ray.kill(address["actor"], no_restart=True)


def test_half_a_tls_configuration_is_refused(certificates: dict[str, Path], admin: rt.Client) -> None:
    from raytxn.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="both tls_cert and tls_key"):
        start_gateway(0, tls_cert=certificates["server_cert"])
    with pytest.raises(InvalidArgument, match="needs tls_cert"):
        start_gateway(0, tls_client_ca=certificates["ca"])
    with pytest.raises(InvalidArgument, match="not usable"):
        start_gateway(0, tls_cert=certificates["server_cert"], tls_key=certificates["client_key"])


def test_the_gateway_reports_auth_and_its_refusals(gateway: dict[str, Any]) -> None:
    seen = stats(gateway)
    assert seen["auth"] is True and seen["warning"] is None and seen["host"] == "127.0.0.1"
    assert set(seen["refused"]) <= {"sasl_authentication_failed", "topic_authorization_failed",
                                    "group_authorization_failed", "transactional_id_authorization_failed",
                                    "session_expired", "unauthenticated_closed", "illegal_sasl_state",
                                    "unsupported_sasl_mechanism"}
