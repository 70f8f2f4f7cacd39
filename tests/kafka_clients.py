"""Helpers for tests that drive the Kafka gateway with real Kafka clients."""

from __future__ import annotations

import time
from typing import Any


def poll_values(consumer: Any, count: int, timeout_s: float = 30, quiet_s: float = 0.0) -> list[Any]:
    """Poll a confluent-kafka consumer until ``count`` messages came, then ``quiet_s`` longer (to
    see that nothing more comes), all within ``timeout_s``."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None:
            assert message.error() is None, message.error()
            out.append(message)
        if len(out) >= count:
            quiet_until = quiet_until or time.monotonic() + quiet_s
            if time.monotonic() >= quiet_until:
                break
    return out
