"""A writer process killed (SIGKILL) at random moments, mostly in the middle of a flush: after
recovery every acknowledged append is there with its exact bytes, every entry is whole, and the
ledger is contiguous. Runs on file:// and on the real SeaweedFS S3 server."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raytxn.ids import Position
from raytxn.ledger import ManagedLedger
from raytxn.ledger.storage import Storage

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(url: str, options: dict, stream: str, acks_before_kill: int, rng: random.Random) -> list[tuple]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(WRITER), url, json.dumps(options), stream, "20000", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    acked: list[tuple] = []
    deadline = time.monotonic() + 60
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ack "):
                _, ledger, entry, tag = line.split()
                acked.append((int(ledger), int(entry), tag))
                if len(acked) >= acks_before_kill:
                    time.sleep(rng.random() * 0.01)  # land somewhere inside the next flush
                    break
            assert time.monotonic() < deadline, "writer too slow"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    # acks printed between our last read and the kill count too
    assert proc.stdout is not None
    for line in proc.stdout.read().splitlines():
        if line.startswith("ack "):
            _, ledger, entry, tag = line.split()
            acked.append((int(ledger), int(entry), tag))
    return acked


async def recover_and_read(url: str, options: dict, stream: str) -> list:
    ml = await ManagedLedger.open(Storage.from_url(url, **options), stream)  # seals the dead one's ledger
    entries = []
    for info in ml.ledgers:
        pos = Position(info.ledger_id, 0)
        while True:
            batch = await ml.read(pos, max_entries=1000, end=Position(info.ledger_id, 10**12))
            if not batch:
                break
            entries.extend(batch)
            pos = Position(info.ledger_id, batch[-1].position.entry_id + 1)
    return entries


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_kill_mid_flush_loses_nothing_acked(backend: str, request: pytest.FixtureRequest,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.conftest import make_url

    if backend == "s3":
        request.applymarker(pytest.mark.s3)
    url, options = make_url(backend, request, tmp_path_factory)
    rng = random.Random(1234)
    all_acked: list[tuple] = []
    for _round in range(3):
        all_acked += run_and_kill(url, options, "crash/stream", rng.randint(20, 80), rng)
        entries = asyncio.run(recover_and_read(url, options, "crash/stream"))
        by_position = {(e.position.ledger_id, e.position.entry_id): e.records for e in entries}
        for ledger, entry, tag in all_acked:
            records = by_position.get((ledger, entry))
            assert records is not None, f"acknowledged entry <{ledger},{entry}> lost"
            body = records[0]
            assert body.startswith(tag.encode() + b":")
            counter = int(tag.rsplit("-", 1)[1])
            assert body == tag.encode() + b":" + bytes([counter % 251]) * 20000, "entry not whole"
        # per ledger, entry ids are contiguous from 0: no holes, nothing partial in between
        ledgers = sorted({p[0] for p in by_position})
        for ledger in ledgers:
            ids = sorted(e for (lg, e) in by_position if lg == ledger)
            assert ids == list(range(len(ids)))
        # no record appears twice
        tags = [r[0].split(b":", 1)[0] for r in by_position.values()]
        assert len(tags) == len(set(tags))
