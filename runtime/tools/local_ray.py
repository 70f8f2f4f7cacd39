"""The local Ray that `raytxn start` starts, recorded so that `raytxn stop` ends that Ray and no
other (``ray stop`` ends every Ray on the machine, other programs' too).

`raytxn start` starts Ray's head on a free GCS port; its GCS server's command line names the
session directory, which every process of that Ray names too (GCS, raylet, dashboard, monitors),
and Ray's workers and agents are the raylet's children. The record (a JSON file in the temp dir)
holds the address, the session directory and the pids (with their start times, so a pid reused
by another program is never ended).
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

RECORD = Path(tempfile.gettempdir()) / "raytxn-started-ray"
STOP_GRACE_S = 15.0  # SIGTERM first (Ray's processes clean up), SIGKILL what is left after this


@dataclass
class StartedRay:
    address: str
    session_dir: str
    processes: list[tuple[int, float]] = field(default_factory=list)  # (pid, create_time)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.Error, OSError):  # gone, or not ours to read
        return []


def _session_dir_of_gcs(port: int) -> str | None:
    for process in psutil.process_iter():
        argv = _cmdline(process)
        if argv and argv[0].endswith("gcs_server") and f"--gcs_server_port={port}" in argv:
            for arg in argv:
                if arg.startswith("--session-dir="):
                    return arg.split("=", 1)[1]
    return None


def processes_of(session_dir: str) -> list[psutil.Process]:
    """Every process of the Ray of ``session_dir``: those naming it, and their descendants."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        if any(session_dir in arg for arg in _cmdline(process)):
            found[process.pid] = process
            try:
                found.update((child.pid, child) for child in process.children(recursive=True))
            except psutil.Error:
                pass
    return list(found.values())


def start(ray_bin: str, num_cpus: int | None = None) -> StartedRay:
    """``ray start --head`` on a free port; returns (and records) what was started."""
    port = _free_port()
    argv = [ray_bin, "start", "--head", "--disable-usage-stats", f"--port={port}"]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    subprocess.run(argv, check=True, capture_output=True)
    session_dir = _session_dir_of_gcs(port)
    if session_dir is None:
        raise RuntimeError(f"`ray start` ran, but no GCS server listens on port {port}")
    started = StartedRay(f"127.0.0.1:{port}", session_dir,
                         [(p.pid, p.create_time()) for p in processes_of(session_dir)])
    RECORD.write_text(json.dumps(asdict(started)))
    return started


def recorded() -> StartedRay | None:
    """The Ray `raytxn start` started and nobody stopped yet, if any."""
    try:
        data = json.loads(RECORD.read_text())
        return StartedRay(data["address"], data["session_dir"], [tuple(p) for p in data["processes"]])
    except (OSError, ValueError, KeyError, TypeError):  # none, or a marker of an older raytxn
        return None


def stop(started: StartedRay) -> int:
    """End the processes of ``started`` (and only those); forget the record. Returns how many."""
    targets = {p.pid: p for p in processes_of(started.session_dir)}
    for pid, create_time in started.processes:
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - create_time) < 1e-3:  # the same process, not a reused pid
                targets[pid] = process
        except psutil.Error:
            pass
    alive = list(targets.values())
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    _, alive = psutil.wait_procs(alive, timeout=STOP_GRACE_S)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=max(1.0, deadline - time.monotonic()))
    RECORD.unlink(missing_ok=True)
    return len(targets)
