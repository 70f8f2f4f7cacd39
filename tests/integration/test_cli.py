"""The raytxn CLI against a running engine (in-process through typer's runner)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import raytxn as rt
from raytxn.tools.cli import app
from tests.engine import engine_client

pytestmark = pytest.mark.ray
runner = CliRunner()


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


def test_txns_list_show_abort(client: rt.Client) -> None:
    topic = f"cli-t-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    txn = client.new_transaction(timeout=120)
    client.create_producer(topic).send(b"pending", txn=txn)
    rows = run_json("txns", "list")
    mine = [r for r in rows if r["txn"] == str(txn.id)]
    assert mine and mine[0]["partitions"] == [[topic, 0]] and mine[0]["owner"] == client.owner
    shown = run_json("txns", "show", f"{txn.id.tc_id},{txn.id.sequence}")
    assert shown["state"] == "OPEN"
    assert "ABORTED" in run("txns", "abort", f"{txn.id.tc_id},{txn.id.sequence}")
    assert run_json("txns", "show", str(txn.id))["state"] == "ABORTED"
    bad = runner.invoke(app, ["txns", "show", "nonsense"])
    assert bad.exit_code == 2
    missing = runner.invoke(app, ["txns", "show", "0,999999"])
    assert missing.exit_code == 1 and "TransactionNotFound" in missing.output


def test_stop_in_another_process_stops_the_engine_not_a_ray_it_did_not_start(client: rt.Client) -> None:
    """Last in the module: it stops the module's engine. `raytxn stop` runs as its own process
    attached to this session's Ray, which it did not start, so Ray must keep running."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import ray

    from raytxn.ids import NAMESPACE

    if (Path(tempfile.gettempdir()) / "raytxn-started-ray").exists():
        pytest.skip("a Ray started by `raytxn start` runs on this machine: `raytxn stop` would stop it")
    address = ray.get_runtime_context().gcs_address
    cli = str(Path(sys.executable).with_name("raytxn"))
    done = subprocess.run([cli, "stop", "--address", address], capture_output=True, text=True, timeout=180,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running" in done.stdout
    for name in ("supervisor", "tc-0", "tc-1"):
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)
    assert ray.get(ray.put(41)) + 1 == 42  # this session's Ray is untouched


def test_start_in_another_process_starts_an_engine_with_auth(ray_session: object, tmp_path: object) -> None:
    """After the stop test: `raytxn start` as its own process. Ray runs already (this session's,
    named by RAY_ADDRESS), so it only starts the engine on it; with --auth-secret-file, auth on."""
    import subprocess
    import sys
    from pathlib import Path

    import ray

    from raytxn.auth import create_token, new_secret
    from raytxn.cluster import stop_engine
    from raytxn.ids import NAMESPACE

    secret = new_secret()
    key = Path(str(tmp_path)) / "engine.key"
    key.write_text(secret)
    cli = str(Path(sys.executable).with_name("raytxn"))
    env = {**__import__("os").environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    done = subprocess.run([cli, "start", "--storage", f"file://{Path(str(tmp_path)) / 'data'}",
                           "--auth-secret-file", str(key), "--superuser", "ops"],
                          capture_output=True, text=True, timeout=180, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "raytxn running" in done.stdout and "auth on" in done.stdout
        assert ray.get_actor("supervisor", namespace=NAMESPACE) is not None
        ops = rt.connect(token=create_token(secret, "ops"))
        assert ops.whoami() == {"auth": True, "principal": "ops", "superuser": True}
        ops.close()
    finally:
        stop_engine(create_token(secret, "ops"))
