"""``examples/serve_exactly_once.py`` run as a user runs it: a Ray Serve deployment invoicing
orders exactly once with raytxn.aio while it answers HTTP requests, across a kill of the
subscription actor that feeds it. The run joins the test session's Ray (``RAY_ADDRESS``), as
tests/integration/test_quickstart.py's do, with Serve's HTTP proxy on a free loopback port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.aio_workload import REQUEST_BOUND_S
from tests.engine import joinable_ray_address
from tests.integration.test_aio_serve import free_port

# The extended job's (the suite's budget, 30 s): the Serve exactly-once test (test_aio_serve.py) stays in the suite.
pytestmark = [pytest.mark.ray, pytest.mark.extended, pytest.mark.slow(seconds=50)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve_exactly_once.py"


def test_the_serve_example_invoices_every_order_once_and_answers_meanwhile(tmp_path: Path, ray_session: object) -> None:
    address = joinable_ray_address(ray_session)
    try:
        proc = subprocess.run([sys.executable, str(EXAMPLE), "--orders", "30", "--port", str(free_port())],
                              cwd=tmp_path, capture_output=True, text=True, timeout=240,
                              env={**os.environ, "RAY_ADDRESS": address})
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"the example did not end in 240 s; it printed:\n{hung.stdout!r}\n"
                             f"{hung.stderr!r}") from None
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-5000:]
    print(out)
    assert re.search(r"killed sub-orders-\w+-0-billing after 16 orders", out), out
    answered = re.search(r"the replica answered (\d+) requests meanwhile, the slowest in (\d+) ms", out)
    assert answered and int(answered[1]) > 30, out
    assert int(answered[2]) <= REQUEST_BOUND_S * 1000, out
    assert re.search(r"invoices-\w+ holds 30 invoices; exactly once per order: True", out), out
