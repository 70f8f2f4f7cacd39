"""Real peers on this machine: an Apache Kafka broker (one KRaft node on loopback) and Spark's own
Kafka connector, fetched once from Maven Central into a cache folder.

The benchmarks compare raytxn with these peers, and the differential tests run the gateway's
real-client scenarios against both. Nothing here is committed to the repository: ``mvn`` copies
the artifacts and their dependencies into :func:`cache_dir` the first time they are asked for.
A broker's process is ended by its PID only, and its data lives in a fresh folder.

    python -m raytxn.tools.peers fetch     # fetch the Kafka and Spark-Kafka jars now
    python -m raytxn.tools.peers broker    # run a broker in the foreground until Ctrl-C
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from raytxn.errors import RaytxnError

# The newest Kafka 4 release the project's Maven registry serves (4.0.0 .. 4.4.0 are listed there).
KAFKA_VERSION = "4.4.0"
SCALA_BINARY = "2.13"
# Kafka logs through slf4j 1.7; its distribution binds that to log4j2 with this jar, which is not a
# dependency of the kafka_2.13 artifact (without it the broker logs nothing, start-up errors too).
LOG4J_SLF4J = ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5")
SPARK_SCALA_BINARY = "2.12"   # pyspark 3.5's jars are built for Scala 2.12
MVN_TIMEOUT_S = 900
_TAIL_CHARS = 3000


class PeerUnavailable(RaytxnError):
    """A peer cannot run here: ``mvn`` or ``java`` is missing, the fetch was refused, or the broker
    did not come up. Tests skip with this message."""


def cache_dir() -> Path:
    """The folder fetched jars live in: ``$RAYTXN_PEERS_CACHE`` or ``~/.cache/raytxn/peers``."""
    configured = os.environ.get("RAYTXN_PEERS_CACHE")
    folder = Path(configured).expanduser() if configured else Path.home() / ".cache" / "raytxn" / "peers"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _tail(text: str) -> str:
    return text[-_TAIL_CHARS:]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock of the cache for one artifact set: two pytest workers (or a bench and a
    test) asking at once fetch it once; the second waits and then finds it complete."""
    with open(cache_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pom(name: str, coordinates: list[tuple[str, str, str]]) -> str:
    dependencies = "\n".join(
        f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>" for group, artifact, version in coordinates)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        f"  <groupId>raytxn.peers</groupId><artifactId>{name}</artifactId><version>1</version>\n"
        "  <packaging>pom</packaging>\n"
        f"  <dependencies>\n{dependencies}\n  </dependencies>\n</project>\n")


def _fetch(name: str, coordinates: list[tuple[str, str, str]]) -> Path:
    """``mvn dependency:copy-dependencies`` of ``coordinates`` (runtime scope, transitively) into
    ``cache_dir()/name/libs``, once: a ``.complete`` file marks a finished copy, and a copy is made
    beside it and renamed into place so a fetch cut short leaves nothing that looks complete."""
    target = cache_dir() / name
    libs = target / "libs"
    if (target / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeerUnavailable(f"cannot fetch {name}: mvn (Apache Maven) is not on PATH")
    with _locked(name):
        if (target / ".complete").exists():
            return libs
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir()))
        try:
            (work / "pom.xml").write_text(_pom(name, coordinates))
            started = time.monotonic()
            try:
                done = subprocess.run(
                    [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                     f"-DoutputDirectory={work / 'libs'}", "-DincludeScope=runtime"],
                    capture_output=True, text=True, timeout=MVN_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired as exc:
                raise PeerUnavailable(f"fetching {name} took over {MVN_TIMEOUT_S} s") from exc
            if done.returncode != 0 or not any((work / "libs").glob("*.jar")):
                raise PeerUnavailable(f"mvn could not fetch {name} (exit {done.returncode}):\n"
                                      f"{_tail(done.stdout + done.stderr)}")
            (work / "fetch_seconds").write_text(f"{time.monotonic() - started:.1f}\n")
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
            (target / ".complete").write_text("")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs


def fetch_seconds(libs: Path) -> float | None:
    """How long the fetch of a ``libs`` folder took when it was made (None if unknown)."""
    marker = libs.parent / "fetch_seconds"
    return float(marker.read_text()) if marker.exists() else None


def kafka_jars(version: str = KAFKA_VERSION) -> Path:
    """The folder of ``kafka_2.13:<version>`` and every jar it runs with (fetched once)."""
    return _fetch(f"kafka-{version}", [("org.apache.kafka", f"kafka_{SCALA_BINARY}", version), LOG4J_SLF4J])


def _pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def _artifact_stem(jar: str) -> str:
    """``kafka-clients-3.4.1.jar`` -> ``kafka-clients``: the name without its version."""
    parts = Path(jar).stem.split("-")
    for i, part in enumerate(parts):
        if part[:1].isdigit():
            return "-".join(parts[:i])
    return "-".join(parts)


def spark_kafka_jars(spark_version: str | None = None) -> list[str]:
    """Jar paths of ``spark-sql-kafka-0-10_2.12`` at the installed pyspark's version and the
    dependencies Spark does not ship itself (kafka-clients, commons-pool2,
    spark-token-provider-kafka...), for ``init_spark(configs={"spark.jars": ",".join(jars)})``.
    Jars pyspark already has (Spark's own, Scala, Hadoop, slf4j...) are left out so one class is
    never on the classpath twice."""
    version = spark_version or _pyspark_version()
    libs = _fetch(f"spark-kafka-{version}",
                  [("org.apache.spark", f"spark-sql-kafka-0-10_{SPARK_SCALA_BINARY}", version)])
    shipped: set[str] = set()
    with contextlib.suppress(ImportError):
        import pyspark

        shipped = {_artifact_stem(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(j) for j in libs.glob("*.jar") if _artifact_stem(j.name) not in shipped)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cluster_id() -> str:
    """A Kafka ``Uuid`` string (base64url of 16 bytes, no padding), not starting with '-' (which
    Kafka's own generator avoids too: the tools would read it as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _metadata_brokers(host: str, port: int, timeout_s: float) -> int:
    """Ask the broker for Metadata v0 (all topics) over a plain socket: the number of brokers it
    lists, or raise OSError. A KRaft broker opens its listener once it caught up with the
    metadata log, and lists itself once it registered, so one broker means it serves."""
    header = struct.pack(">hhih", 3, 0, 1, len(b"raytxn-peers")) + b"raytxn-peers"
    body = header + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        raw = b""
        while len(raw) < 12:
            chunk = sock.recv(4096)
            if not chunk:
                raise OSError("the broker closed the connection")
            raw += chunk
    _size, correlation, brokers = struct.unpack(">iii", raw[:12])
    if correlation != 1:
        raise OSError(f"answer to another request ({correlation})")
    return brokers


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


class KafkaBroker:
    """A real single-node Apache Kafka broker (KRaft: broker and controller in one process) on
    127.0.0.1, with a fresh log dir. ``with KafkaBroker() as broker: broker.bootstrap``."""

    def __init__(self, log_dir: Path | None = None, port: int = 0, version: str = KAFKA_VERSION) -> None:
        self.version = version
        self.port = port
        self.bootstrap = ""
        self._given_log_dir = log_dir
        self._work: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_dir(self) -> Path | None:
        if self._given_log_dir is not None:
            return self._given_log_dir
        return self._work / "data" if self._work else None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _server_properties(self, port: int, controller_port: int, log_dir: Path) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(log_dir),
            "num.partitions": "1",
            # one node: every internal topic has one replica; few partitions keep start-up short
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.segment.bytes": str(64 * 1024 * 1024),
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise PeerUnavailable("cannot run a Kafka broker: java (17 or later) is not on PATH")
        return java

    def _log_tail(self) -> str:
        log = self._work / "server.log" if self._work else None
        return _tail(log.read_text(errors="replace")) if log and log.exists() else ""

    def start(self, timeout_s: float = 180) -> str:
        """Format the log dir (Kafka's StorageTool), start the broker, wait until it serves
        Metadata and lists itself; the bootstrap address ``127.0.0.1:PORT``. Two JVM starts: on
        an idle machine about 10 s, on this shared 2-core one under load up to a minute or more,
        hence the generous default."""
        if self._process is not None:
            return self.bootstrap
        java = self._java()
        libs = kafka_jars(self.version)
        self._work = Path(tempfile.mkdtemp(prefix="raytxn-kafka-"))
        log_dir = self.log_dir
        assert log_dir is not None
        port = self.port or _free_port()
        controller_port = _free_port()
        properties = self._work / "server.properties"
        properties.write_text(self._server_properties(port, controller_port, log_dir))
        (self._work / "log4j2.properties").write_text(_LOG4J2)
        jvm = [java, "-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={self._work / 'log4j2.properties'}",
               f"-Dkafka.logs.dir={self._work}", "-cp", f"{libs}/*"]
        formatted = subprocess.run(
            [*jvm, "kafka.tools.StorageTool", "format", "--ignore-formatted", "-t", _cluster_id(),
             "-c", str(properties)], capture_output=True, text=True, timeout=120, check=False)
        if formatted.returncode != 0:
            self._remove_work()
            raise PeerUnavailable(f"Kafka's StorageTool could not format {log_dir}:\n"
                                  f"{_tail(formatted.stdout + formatted.stderr)}")
        with open(self._work / "server.log", "wb") as log:
            self._process = subprocess.Popen([*jvm, "kafka.Kafka", str(properties)], stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        atexit.register(self.stop)
        self._wait_serving(port, timeout_s)
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        return self.bootstrap

    def _wait_serving(self, port: int, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self._log_tail()
                self._process = None
                self._remove_work()
                raise PeerUnavailable(f"the Kafka broker exited at start:\n{tail}")
            try:
                if _metadata_brokers("127.0.0.1", port, timeout_s=2) >= 1:
                    return
                last_error = "it lists no broker yet"
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.2)
        tail = self._log_tail()
        self.stop()
        raise PeerUnavailable(f"the Kafka broker did not serve within {timeout_s} s ({last_error}):\n{tail}")

    def stop(self) -> None:
        """End the broker's own process (by PID: SIGTERM, then SIGKILL after 20 s) and remove
        the folder it made (its log dir too, unless one was given)."""
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)
        self._remove_work()

    def _remove_work(self) -> None:
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``fetch``: fetch the Kafka and Spark-Kafka jars (once) and say where they are and how long
    the fetch took; ``broker``: run a broker until interrupted."""
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "fetch"
    try:
        if command == "fetch":
            started = time.monotonic()
            libs = kafka_jars()
            print(f"kafka {KAFKA_VERSION}: {libs} ({len(list(libs.glob('*.jar')))} jars, "
                  f"fetch took {fetch_seconds(libs)} s)")
            jars = spark_kafka_jars()
            print(f"spark-sql-kafka {_pyspark_version()}: {len(jars)} jars in {Path(jars[0]).parent} "
                  f"(fetch took {fetch_seconds(Path(jars[0]).parent)} s)")
            print(f"ready in {time.monotonic() - started:.1f} s")
            return 0
        if command == "broker":
            with KafkaBroker() as broker:
                print(f"Kafka {broker.version} at {broker.bootstrap} (pid {broker.pid}); Ctrl-C stops it", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while broker._process is not None and broker._process.poll() is None:
                        time.sleep(1)
            return 0
    except PeerUnavailable as exc:
        print(f"peer unavailable: {exc}", file=sys.stderr)
        return 2
    print(f"unknown command {command!r}: fetch | broker", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
