"""Auth on a real engine (a secret configured): tokens, topic permissions enforced by the
partition and subscription actors, transaction and transactional-id ownership by principal,
superuser-only administration. One engine for the module; alice produces, bob consumes,
admin is the superuser."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.auth import create_token, new_secret
from raytxn.client.rpc import ActorRef
from raytxn.errors import AuthenticationFailed, NotAuthorized, TransactionAlreadyAborted
from raytxn.ids import NAMESPACE, partition_actor_name
from raytxn.protocol.txnlog import EndAction
from tests.engine import engine_client, new_topic, visible_values

pytestmark = pytest.mark.ray

SECRET = new_secret()
ADMIN = create_token(SECRET, "admin")
ALICE = create_token(SECRET, "alice")
BOB = create_token(SECRET, "bob")


@pytest.fixture(scope="module")
def admin(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, token=ADMIN, auth_secret=SECRET)


def as_(token: str) -> rt.Client:
    return rt.connect(token=token)


@pytest.fixture(scope="module")
def alice(admin: rt.Client) -> Iterator[rt.Client]:
    client = as_(ALICE)
    yield client
    client.close()


@pytest.fixture(scope="module")
def bob(admin: rt.Client) -> Iterator[rt.Client]:
    client = as_(BOB)
    yield client
    client.close()


def test_connect_needs_a_genuine_live_token(admin: rt.Client) -> None:
    with pytest.raises(AuthenticationFailed, match="present a token"):
        rt.connect()
    with pytest.raises(AuthenticationFailed, match="invalid token"):
        rt.connect(token=create_token(new_secret(), "admin"))  # signed with another secret
    with pytest.raises(AuthenticationFailed, match="expired"):
        rt.connect(token=create_token(SECRET, "alice", expires_at_s=time.time() - 1))
    assert admin.whoami() == {"auth": True, "principal": "admin", "superuser": True}
    # the secret never leaves the engine
    assert admin.config.auth.enabled and admin.config.auth.secret is None
    config = ray.get(ray.get_actor("supervisor", namespace=NAMESPACE).engine_config.remote())
    assert config.auth.secret is None


def test_only_superusers_administer(admin: rt.Client, alice: rt.Client) -> None:
    with pytest.raises(NotAuthorized, match="not a superuser"):
        alice.create_topic(f"auth-{uuid.uuid4().hex[:8]}")
    topic = new_topic(admin, prefix="auth")
    supervisor_pid = admin.supervisor.call("ready")["pid"]
    for attempt in (lambda: alice.delete_topic(topic), lambda: alice.grant_permission(topic, "alice", ["produce"]),
                    lambda: alice.permissions(topic), lambda: alice.faults.arm("partition.after_append", topic=topic),
                    lambda: alice.coordinators.ref(0).call("list_txns"), lambda: alice.list_transactions(),
                    lambda: alice.faults.arm("supervisor.after_mark_deleting"), lambda: alice.rolling_restart(),
                    lambda: alice.supervisor.call("restart_actor", "tc-0"),
                    lambda: alice.supervisor.call("drain", 1.0, 0.5),
                    lambda: alice.coordinators.ref(0).call("drain", 1.0)):
        with pytest.raises(NotAuthorized):
            attempt()
    assert admin.supervisor.call("ready")["pid"] == supervisor_pid  # nothing restarted
    assert [t["name"] for t in alice.list_topics()].count(topic) == 1  # reading metadata is fine
    assert admin.permissions(topic) == {}


def test_produce_and_consume_need_their_permission(admin: rt.Client, alice: rt.Client, bob: rt.Client) -> None:
    topic = new_topic(admin, prefix="auth")
    producer = alice.create_producer(topic)
    with pytest.raises(NotAuthorized, match="no produce permission"):
        producer.send(b"refused")
    assert visible_values(topic, token=ADMIN) == []  # nothing was written
    with pytest.raises(NotAuthorized, match="no consume permission"):
        bob.subscribe(topic, "bobs", initial_position="earliest")
    assert admin.get_topic(topic)["subscriptions"] == []  # nor was the subscription created

    assert admin.grant_permission(topic, "alice", ["produce"]) == {"alice": ["produce"]}
    admin.grant_permission(topic, "bob", ["consume"])
    assert admin.permissions(topic) == {"alice": ["produce"], "bob": ["consume"]}
    producer.send(b"m1")
    with pytest.raises(NotAuthorized, match="no consume permission"):
        alice.subscribe(topic, "alices", initial_position="earliest")  # produce does not imply consume
    consumer = bob.subscribe(topic, "bobs", initial_position="earliest")
    message = consumer.receive(timeout=20)
    assert message.value() == b"m1"
    consumer.acknowledge(message)
    with pytest.raises(NotAuthorized):
        bob.create_producer(topic).send(b"bob may not")
    consumer.close()
    # A compaction rewrites what every reader of the compacted view reads: produce and consume.
    with pytest.raises(NotAuthorized, match=r"needs its produce permission; .* has consume there"):
        bob.compact(topic)
    with pytest.raises(NotAuthorized, match="no consume permission"):
        alice.compact(topic)
    assert admin.compact(topic)[0]["generation"] == 1  # neither refused one published anything
    # A compacted read, reader or table view is a read: consume.
    for read in (alice.read_compacted, alice.compacted_reader, alice.table_view):
        with pytest.raises(NotAuthorized, match="no consume permission"):
            read(topic)
    with bob.compacted_reader(topic) as reader:  # its one message is keyless: no compacted record
        assert reader.read_available() == [] and reader.position == 0


def test_revoke_takes_effect_at_once_and_survives_restarts(admin: rt.Client, alice: rt.Client) -> None:
    topic = new_topic(admin, prefix="auth")
    admin.grant_permission(topic, "alice", ["produce"])
    producer = alice.create_producer(topic)
    producer.send(b"before")
    admin.revoke_permission(topic, "alice")
    with pytest.raises(NotAuthorized):
        producer.send(b"after revoke")
    # a restarted partition actor fetches the permissions again: still refused
    ray.kill(ray.get_actor(partition_actor_name(topic, 0), namespace=NAMESPACE), no_restart=False)
    with pytest.raises(NotAuthorized):
        alice.create_producer(topic).send(b"after restart")
    admin.grant_permission(topic, "alice", ["produce"])
    alice.create_producer(topic).send(b"granted again")
    assert visible_values(topic, token=ADMIN) == [b"before", b"granted again"]


def test_transactions_belong_to_their_principal(admin: rt.Client, alice: rt.Client, bob: rt.Client) -> None:
    topic = new_topic(admin, prefix="auth")
    admin.grant_permission(topic, "alice", ["produce"])
    admin.grant_permission(topic, "bob", ["produce"])
    txn = alice.new_transaction(timeout=60)
    alice.create_producer(topic).send(b"in alice's txn", txn=txn)
    assert admin.coordinators.get_txn(txn.id)["owner"] == "alice"  # the principal, not a client id
    for attempt in (lambda: bob.coordinators.end_txn(txn.id, EndAction.COMMIT),
                    lambda: bob.coordinators.get_txn(txn.id),
                    lambda: bob.coordinators.add_partitions(txn.id, [(topic, 0)])):
        with pytest.raises(NotAuthorized, match="owned by 'alice'"):
            attempt()
    assert alice.coordinators.get_txn(txn.id)["state"] == "OPEN"
    assert alice.describe_transaction(txn.id)["owner"] == "alice"
    # only a superuser lists everyone's transactions and may abort anyone's, even their owner
    with pytest.raises(NotAuthorized, match="not a superuser"):
        alice.abort_transaction(txn.id)
    listed = [row for row in admin.list_transactions() if row["txn"] == str(txn.id)]
    assert [(row["owner"], row["partitions"]) for row in listed] == [("alice", [[topic, 0]])]
    assert admin.abort_transaction(txn.id) == "ABORTED"
    with pytest.raises(TransactionAlreadyAborted):
        txn.commit()
    assert visible_values(topic, token=ADMIN) == []
    with alice.transaction() as ok:
        alice.create_producer(topic).send(b"committed", txn=ok)
    assert visible_values(topic, token=ADMIN) == [b"committed"]


def test_a_transactional_id_belongs_to_its_first_registrant(admin: rt.Client, alice: rt.Client,
                                                            bob: rt.Client) -> None:
    tid = f"tid-{uuid.uuid4().hex[:8]}"
    epoch = alice.register_transactional_id(tid)
    with pytest.raises(NotAuthorized, match="belongs to 'alice'"):
        bob.register_transactional_id(tid)  # bob cannot fence alice's producer...
    with pytest.raises(NotAuthorized, match="belongs to 'alice'"):
        bob.new_transaction(transactional_id=tid, epoch=epoch)  # ...nor write under her id
    txn = alice.new_transaction(transactional_id=tid, epoch=epoch)  # alice's epoch is still current
    txn.commit()
    assert admin.register_transactional_id(tid) == epoch + 1  # superusers may take over


def test_engine_internals_refuse_client_tokens(admin: rt.Client, alice: rt.Client) -> None:
    from raytxn.ids import TxnID

    topic = new_topic(admin, prefix="auth")
    admin.grant_permission(topic, "alice", ["produce", "consume"])
    partition = ActorRef(partition_actor_name(topic, 0), ALICE)
    for method, args in (("end_txn", (TxnID(0, 10**9), EndAction.COMMIT, 0)), ("trim", (None,)), ("snapshot", ())):
        with pytest.raises(NotAuthorized, match="not a superuser"):
            partition.call(method, *args)
    with pytest.raises(AuthenticationFailed):
        ActorRef(partition_actor_name(topic, 0)).call("append", "p", 0, [])  # no token at all


def test_ray_data_tasks_produce_and_read_as_the_clients_principal(admin: rt.Client, alice: rt.Client,
                                                                   bob: rt.Client) -> None:
    from raytxn.connectors.ray_data import read_topic, write_topic

    topic = new_topic(admin, partitions=2, prefix="auth")
    admin.grant_permission(topic, "alice", ["produce"])
    rows = ray.data.from_items([{"value": f"v{i}"} for i in range(20)])
    with bob.transaction() as txn, pytest.raises(NotAuthorized):
        write_topic(rows, bob, topic, txn)  # bob's token travels to the tasks: refused there
    with alice.transaction() as txn:
        assert write_topic(rows, alice, topic, txn) == 20
    with pytest.raises(NotAuthorized):
        read_topic(bob, topic, "bobs")
    admin.grant_permission(topic, "bob", ["consume"])
    dataset, handle = read_topic(bob, topic, "bobs")
    with bob.transaction() as txn:
        handle.acknowledge(txn)
    handle.close()
    assert sorted(row["value"] for row in dataset.take_all()) == sorted(f"v{i}".encode() for i in range(20))


def test_cli_secret_tokens_grants_and_refusals(admin: rt.Client, tmp_path: object) -> None:
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from raytxn.auth import AuthConfig, Authorizer
    from raytxn.tools.cli import app

    runner = CliRunner()

    def cli(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result.output

    def cli_json(*args: str) -> object:
        # the last line: Ray forwards its workers' log lines (an earlier test's retried Ray Data
        # task) to this driver's stdout, and CliRunner captures them before the JSON
        return json.loads(cli(*args, "--json").strip().splitlines()[-1])

    made = Path(str(tmp_path)) / "made.key"
    cli("token", "secret", "--output", str(made))
    assert made.stat().st_mode & 0o077 == 0  # only the owner may read a secret
    carol = cli("token", "create", "--principal", "carol", "--secret-file", str(made)).strip()
    assert Authorizer(AuthConfig(secret=made.read_text().strip())).authenticate(carol, time.time()) == "carol"
    cli("token", "create", "--principal", "bad name", "--secret-file", str(made), code=2)

    key = Path(str(tmp_path)) / "engine.key"
    key.write_text(SECRET)
    alice = cli("token", "create", "--principal", "alice", "--secret-file", str(key), "--expires-in", "600").strip()
    assert cli_json("--token", alice, "whoami")["principal"] == "alice"
    assert "NotAuthorized" in cli("--token", alice, "topics", "create", "cli-refused", code=1)
    assert "AuthenticationFailed" in cli("whoami", code=1)  # no token at all
    topic = new_topic(admin, prefix="auth")
    cli("--token", ADMIN, "topics", "grant", topic, "alice", "--actions", "produce")
    assert cli_json("--token", ADMIN, "topics", "permissions", topic) == [
        {"principal": "alice", "actions": ["produce"]}]
    cli("--token", alice, "produce", topic, "from-cli")
    cli("--token", ADMIN, "topics", "revoke", topic, "alice")
    assert "NotAuthorized" in cli("--token", alice, "produce", topic, "refused", code=1)
    assert visible_values(topic, token=ADMIN) == [b"from-cli"]
