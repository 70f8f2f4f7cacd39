"""`raytxn stop` ends the Ray `raytxn start` started, by its recorded processes, and nothing else.

On real processes (no Ray needed): a stand-in for a Ray's process names its session directory in
its command line and has a child that does not (as the raylet's workers do not); a decoy names
another session, and one more is recorded under its pid with a wrong start time (a reused pid)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from raytxn.tools import local_ray

PARENT = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)")


def _spawn(*marker: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", PARENT, *marker])


def _children(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    for _ in range(100):
        children = psutil.Process(proc.pid).children()
        if children:
            return children
        time.sleep(0.05)
    raise AssertionError("the stand-in's child did not start")


def test_stop_ends_the_recorded_rays_processes_and_their_children_only(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_ray, "RECORD", tmp_path / "record")  # not the machine's record
    session = f"/tmp/ray/session_test_{uuid.uuid4().hex}"
    ours, decoy, reused = _spawn(f"--session-dir={session}"), _spawn("--session-dir=/tmp/ray/other"), _spawn()
    try:
        our_child, decoy_child = _children(ours)[0], _children(decoy)[0]
        found = {p.pid for p in local_ray.processes_of(session)}
        assert found == {ours.pid, our_child.pid}
        started = local_ray.StartedRay("127.0.0.1:1", session, [(ours.pid, psutil.Process(ours.pid).create_time()),
                                                                (reused.pid, 12.0)])
        local_ray.RECORD.write_text("{}")
        assert local_ray.stop(started) == 2
        assert ours.wait(timeout=20) is not None and not our_child.is_running()
        assert decoy.poll() is None and decoy_child.is_running() and reused.poll() is None
        assert not local_ray.RECORD.exists()
    finally:
        for proc in (ours, decoy, reused):
            for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
                child.kill()
            proc.kill()
            proc.wait(timeout=20)


def test_a_record_that_is_not_one_reads_as_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_ray, "RECORD", tmp_path / "record")
    assert local_ray.recorded() is None
    local_ray.RECORD.write_text("started by raytxn start\n")  # the marker an older raytxn wrote
    assert local_ray.recorded() is None
    started = local_ray.StartedRay("127.0.0.1:5", "/tmp/ray/session_x", [(1, 2.0)])
    local_ray.RECORD.write_text(__import__("json").dumps(__import__("dataclasses").asdict(started)))
    assert local_ray.recorded() == started
