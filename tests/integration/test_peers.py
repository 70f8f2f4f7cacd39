"""raytxn.tools.peers: the cache folder, the fetch's errors, and a real Kafka broker's life (its
own process by PID, its own log dir, gone after stop)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raytxn.tools import peers
from tests.peers import running_broker


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYTXN_PEERS_CACHE", str(tmp_path / "cache"))
    assert peers.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
    monkeypatch.delenv("RAYTXN_PEERS_CACHE")
    assert peers.cache_dir() == Path.home() / ".cache" / "raytxn" / "peers"


def test_a_fetch_without_mvn_is_peer_unavailable_and_leaves_nothing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYTXN_PEERS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(peers.PeerUnavailable, match="mvn"):
        peers.kafka_jars("4.0.0")
    assert not (tmp_path / "cache" / "kafka-4.0.0").exists()


@pytest.mark.slow(60)
def test_a_refused_fetch_is_peer_unavailable_with_mavens_words(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An artifact the registry does not have: mvn fails, the error carries its output, and no
    half-made folder looks complete."""
    if peers.shutil.which("mvn") is None:
        pytest.skip("mvn is not on PATH")
    monkeypatch.setenv("RAYTXN_PEERS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(peers.PeerUnavailable, match=r"could not fetch kafka-0\.0\.0-no-such"):
        peers.kafka_jars("0.0.0-no-such")
    assert not (tmp_path / "cache" / "kafka-0.0.0-no-such").exists()


def test_artifact_stems_drop_the_version() -> None:
    assert peers._artifact_stem("kafka-clients-3.4.1.jar") == "kafka-clients"
    assert peers._artifact_stem("spark-sql-kafka-0-10_2.12-3.5.7.jar") == "spark-sql-kafka-0-10_2.12"
    assert peers._artifact_stem("commons-pool2-2.11.1.jar") == "commons-pool2"


@pytest.mark.slow(60)
def test_a_broker_starts_on_loopback_and_stop_ends_its_process_and_removes_its_log_dir() -> None:
    from confluent_kafka.admin import AdminClient

    for broker in running_broker():
        assert broker.bootstrap.startswith("127.0.0.1:") and broker.pid is not None
        pid, log_dir = broker.pid, broker.log_dir
        assert log_dir is not None and (log_dir / "meta.properties").exists()   # formatted by StorageTool
        brokers = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", broker.port)]
        broker.stop()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert not log_dir.exists()
        broker.stop()   # a second stop does nothing


def test_the_connector_jars_leave_out_what_pyspark_ships() -> None:
    """Only the connector and what pyspark lacks: never a second copy of a Spark, Scala or Hadoop jar."""
    try:
        jars = peers.spark_kafka_jars()
    except peers.PeerUnavailable as exc:
        pytest.skip(str(exc))
    stems = {peers._artifact_stem(Path(j).name) for j in jars}
    assert {"spark-sql-kafka-0-10_2.12", "spark-token-provider-kafka-0-10_2.12", "kafka-clients"} <= stems
    assert not stems & {"scala-library", "hadoop-client-runtime", "hadoop-client-api", "slf4j-api", "spark-tags_2.12"}


@pytest.mark.slow(40)
def test_a_broker_whose_port_is_taken_fails_to_start_with_its_log_and_leaves_nothing() -> None:
    """Not a missing peer but a broker that cannot start: BrokerDidNotStart, with the broker's own
    words, its process gone and its folder removed."""
    import socket

    try:
        peers.kafka_jars()
    except peers.PeerUnavailable as exc:
        pytest.skip(str(exc))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = peers.KafkaBroker(port=taken.getsockname()[1])
        with pytest.raises(peers.BrokerDidNotStart, match="exited at start") as failed:
            broker.start(timeout_s=180)
    assert "Address already in use" in str(failed.value) or "BindException" in str(failed.value), failed.value
    assert broker.pid is None and broker.log_dir is None
