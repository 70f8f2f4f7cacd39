"""The raytxn CLI against a running engine: in-process through typer's runner, and as its own
process (``raytxn ... --address <this session's Ray>``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

import raytxn as rt
from raytxn.errors import (
    InvalidArgument,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionNotFound,
)
from raytxn.tools.cli import app
from tests.engine import engine_client

pytestmark = pytest.mark.ray
runner = CliRunner()
CLI = str(Path(sys.executable).with_name("raytxn"))
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def run(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def run_json(*args: str) -> object:
    return json.loads(run(*args, "--json").strip().splitlines()[-1])


def test_topics_produce_consume_and_status(client: rt.Client) -> None:
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    assert "created" in run("topics", "create", topic, "--partitions", "2")
    assert topic in [t["name"] for t in run_json("topics", "list")]
    sent = run_json("produce", topic, "a", "b", "c", "--key", "k", "--txn")
    assert [r["value"] for r in sent] == ["a", "b", "c"]
    got = run_json("consume", topic, "cli-sub", "--count", "3", "--timeout", "5")
    assert [r["value"] for r in got] == ["a", "b", "c"]
    stats = run_json("topics", "stats", topic)
    assert len(stats["partition_stats"]) == 2
    assert run_json("subs", "list", topic) == [{"topic": topic, "subscription": "cli-sub"}]
    assert len(run_json("subs", "stats", topic, "cli-sub")) == 2
    health = run_json("status")
    assert health["healthy"] and any(r["name"] == "tc-0" for r in health["actors"])
    assert "raytxn status" in run("status")
    run("topics", "delete", topic)
    result = runner.invoke(app, ["topics", "stats", topic])
    assert result.exit_code == 1 and "TopicNotFound" in result.output


def test_topics_compact_keeps_each_keys_latest_value(client: rt.Client) -> None:
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    assert "compacted" in run("topics", "create", topic, "--compacted", "--compaction-threshold-bytes", "4096")
    assert (client.get_topic(topic)["compacted"], client.get_topic(topic)["compaction_threshold_bytes"]) == (True, 4096)
    result = runner.invoke(app, ["produce", topic, "keyless"])
    assert result.exit_code == 1 and "KeylessMessage" in result.output
    run_json("produce", topic, "a", "b", "--key", "k")
    run_json("produce", topic, "c", "--key", "other")
    [row] = run_json("topics", "compact", topic, "--delete-retention-ms", "0")
    assert (row["generation"], row["records"], row["next_offset"]) == (1, 2, 3)
    assert [(r["key"], r["value"]) for r in client.read_compacted(topic)] == [("k", b"b"), ("other", b"c")]
    result = runner.invoke(app, ["topics", "compact", topic, "--partition", "5"])
    assert result.exit_code == 1 and "InvalidArgument" in result.output


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``raytxn ARGS --address <this session's Ray>`` as its own process."""
    address = ray.get_runtime_context().gcs_address
    return subprocess.run([CLI, *args, "--address", address], capture_output=True, text=True, timeout=180,
                          cwd=ROOT)


def cli_json(*args: str) -> object:
    done = cli(*args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def hanging_txn(client: rt.Client, topic: str, subscription: str) -> rt.Transaction:
    """An open transaction with a partition (a send) and a subscription (an ack) as participants."""
    producer = client.create_producer(topic)
    producer.send(b"first", key="k")
    consumer = client.subscribe(topic, subscription, initial_position="earliest")
    message = consumer.receive(timeout=10)
    txn = client.new_transaction(timeout=300)
    producer.send(b"pending", key="k", txn=txn)
    consumer.acknowledge(message, txn=txn)
    consumer.close()
    return txn


def test_txns_list_older_than_show_abort_from_a_subprocess(client: rt.Client) -> None:
    topic = f"cli-t-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    txn = hanging_txn(client, topic, "cli-sub")
    time.sleep(2.0)
    rows = {row["txn"]: row for row in cli_json("txns", "list", "--older-than", "2s")}
    mine = rows[str(txn.id)]
    assert mine["owner"] == client.owner and mine["state"] == "OPEN" and mine["age_ms"] >= 2000
    assert mine["partitions"] == [[topic, 0]] and mine["subscriptions"] == [[topic, 0, "cli-sub"]]
    assert str(txn.id) not in [row["txn"] for row in cli_json("txns", "list", "--older-than", "1h")]
    bad = cli("txns", "list", "--older-than", "5x")
    assert bad.returncode == 2 and "not a duration: '5x'" in bad.stdout, bad.stdout + bad.stderr
    shown = cli_json("txns", "show", f"{txn.id.tc_id},{txn.id.sequence}")
    assert shown["state"] == "OPEN" and shown["age_ms"] >= mine["age_ms"]
    assert (shown["partitions"], shown["subscriptions"]) == (mine["partitions"], mine["subscriptions"])
    aborted = cli("txns", "abort", str(txn.id))
    assert aborted.returncode == 0 and f"{txn.id}: ABORTED" in aborted.stdout, aborted.stdout + aborted.stderr
    with pytest.raises(TransactionAlreadyAborted):
        txn.commit()
    assert run_json("txns", "show", str(txn.id))["state"] == "ABORTED"
    bad = runner.invoke(app, ["txns", "show", "nonsense"])
    assert bad.exit_code == 2 and "not a transaction id" in bad.output
    missing = runner.invoke(app, ["txns", "show", "0,999999"])
    assert missing.exit_code == 1 and "TransactionNotFound" in missing.output


def test_hanging_transactions_through_the_client_api(client: rt.Client) -> None:
    topic = f"api-t-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    old = hanging_txn(client, topic, "api-sub")
    time.sleep(1.5)
    young = client.new_transaction(timeout=300)
    listed = [row["txn"] for row in client.list_transactions(older_than="1s")]
    assert str(old.id) in listed and str(young.id) not in listed
    assert [row["txn"] for row in client.list_transactions(older_than=1.0)] == listed  # seconds as a number
    everything = [row["txn"] for row in client.list_transactions()]
    assert everything.index(str(old.id)) < everything.index(str(young.id))  # the oldest first
    assert len(client.list_transactions(limit=1)) == 1
    for bad in ({"older_than": "soon"}, {"older_than": -1}, {"limit": 0}):
        with pytest.raises(InvalidArgument):
            client.list_transactions(**bad)
    described = client.describe_transaction(str(old.id))  # as it prints: txn(tc,seq)
    assert described["subscriptions"] == [[topic, 0, "api-sub"]] and described["age_ms"] >= 1500
    with pytest.raises(InvalidArgument):
        client.describe_transaction("0-1")
    with pytest.raises(TransactionNotFound):
        client.describe_transaction("7,1")  # no coordinator 7
    assert client.abort_transaction(old.id) == "ABORTED"
    assert client.describe_transaction(old.id)["state"] == "ABORTED"
    young.commit()
    with pytest.raises(TransactionAlreadyCommitted):
        client.abort_transaction(young.id)


@pytest.mark.slow(seconds=15)
def test_browse_recent_backlog_and_the_console_commands(client: rt.Client) -> None:
    import socket
    import urllib.request

    topic = f"cli-b-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    client.create_subscription(topic, "cli-sub", "earliest")
    producer = client.create_producer(topic)
    producer.send(b"plain")
    aborted = client.new_transaction()
    producer.send(b"dropped", txn=aborted)
    aborted.abort()
    page = run_json("topics", "browse", topic)
    assert [(r["kind"], r["state"]) for r in page["rows"]] == [("data", "committed"), ("data", "aborted"),
                                                               ("abort", "marker")]
    bad = runner.invoke(app, ["topics", "browse", topic, "--offset", "99"])
    assert bad.exit_code == 2 and "outside" in bad.output
    consumer = client.subscribe(topic, "cli-sub")  # live: it counts its own backlog
    (row,) = run_json("subs", "stats", topic, "cli-sub")
    assert row["backlog_messages"] == 1 and row["backlog_exact"]  # the plain message; not the aborted, not the marker
    consumer.close()
    assert {"txn": str(aborted.id), "tc_id": aborted.id.tc_id, "sequence": aborted.id.sequence,
            "outcome": "ABORTED"} in run_json("txns", "recent")
    with socket.socket() as probe:  # a free port for the console's named actor
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = run_json("console", "--port", str(port))
    assert served["url"] == f"http://127.0.0.1:{port}/" and served["auth"] is False
    assert run_json("console", "--port", str(port))["url"] == served["url"]  # the same console again
    with urllib.request.urlopen(f"{served['url']}topics?q={topic}", timeout=30) as response:  # auth off: no login
        assert response.status == 200 and f'data-topic="{topic}"' in response.read().decode()
    assert "stopped the console" in run("console", "stop", "--port", str(port))
    assert "no console serves" in run("console", "stop", "--port", str(port))


def test_stop_in_another_process_stops_the_engine_not_a_ray_it_did_not_start(client: rt.Client) -> None:
    """Last in the module: it stops the module's engine. `raytxn stop` runs as its own process
    attached to this session's Ray, which it did not start, so Ray must keep running."""
    import tempfile

    from raytxn.ids import NAMESPACE

    if (Path(tempfile.gettempdir()) / "raytxn-started-ray").exists():
        pytest.skip("a Ray started by `raytxn start` runs on this machine: `raytxn stop` would stop it")
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([CLI, "stop", "--address", address], capture_output=True, text=True, timeout=180,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running" in done.stdout
    for name in ("supervisor", "tc-0", "tc-1"):
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)
    assert ray.get(ray.put(41)) + 1 == 42  # this session's Ray is untouched


def test_start_in_another_process_starts_an_engine_with_auth(ray_session: object, tmp_path: object) -> None:
    """After the stop test: `raytxn start` as its own process. Ray runs already (this session's,
    named by RAY_ADDRESS), so it only starts the engine on it; with --auth-secret-file, auth on."""
    from raytxn.auth import create_token, new_secret
    from raytxn.cluster import stop_engine
    from raytxn.ids import NAMESPACE

    secret = new_secret()
    key = Path(str(tmp_path)) / "engine.key"
    key.write_text(secret)
    env = {**__import__("os").environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    done = subprocess.run([CLI, "start", "--storage", f"file://{Path(str(tmp_path)) / 'data'}",
                           "--auth-secret-file", str(key), "--superuser", "ops"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "raytxn running" in done.stdout and "auth on" in done.stdout
        assert ray.get_actor("supervisor", namespace=NAMESPACE) is not None
        ops = rt.connect(token=create_token(secret, "ops"))
        assert ops.whoami() == {"auth": True, "principal": "ops", "superuser": True}
        ops.close()
    finally:
        stop_engine(create_token(secret, "ops"))

