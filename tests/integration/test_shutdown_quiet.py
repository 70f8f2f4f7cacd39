"""``rt.shutdown()`` with clients still open: their background loops (a consumer's fetch loops,
its redelivery loop) end quietly, instead of printing ``ValueError: ... Ray object whose owner is
unknown`` tracebacks from a fetch to an actor of a Ray that is gone.

The script runs in its own process joining the session's Ray (as the quickstart test does), and
lingers after the shutdown, so that a loop left running would have the time to fail and say so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.engine import joinable_ray_address

pytestmark = [pytest.mark.ray, pytest.mark.slow(seconds=25)]

LEFT_OPEN = """
import logging, time
import raytxn as rt

logging.basicConfig(level=logging.INFO)  # a user's logging: a loop's warnings would show here
client = rt.connect(storage="file://{data}")
client.create_topic("left-open", partitions=2)
producer = client.create_producer("left-open")
producer.send(b"one")
consumer = client.subscribe("left-open", "sub", initial_position=rt.InitialPosition.Earliest)
print("received", consumer.receive(timeout=30).value().decode())
rt.shutdown()  # the consumer and producer are still open
time.sleep(3)  # a fetch loop still running fails within its fetch wait (1 s)
print("after shutdown")
"""


def test_shutdown_with_a_consumer_open_prints_no_traceback(tmp_path: Path, ray_session: object) -> None:
    address = joinable_ray_address(ray_session)
    script = textwrap.dedent(LEFT_OPEN).format(data=tmp_path / "data")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "RAY_ADDRESS": address})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    assert proc.stdout.split("\n")[:2] == ["received one", "after shutdown"], output[-5000:]
    for sign in ("Traceback", "owner is unknown", "ValueError", "fetch from"):
        assert sign not in output, output[-5000:]
