"""The engine a gateway benchmark runs against: ``local_engine_with_gateway(prefix)``.

``bench kafka``, ``bench gateway-memory`` and ``bench peers`` each need the same three things: a
Ray (this process's, or a fresh local one of their own, never someone else's cluster), a raytxn
engine on a new ``file://`` store, and one Kafka gateway on 127.0.0.1; and each must stop all of
it after, in the reverse order, even when the run fails.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.config import SubscriptionConfig
from raytxn.ids import NAMESPACE


@contextmanager
def local_engine_with_gateway(prefix: str) -> Iterator[tuple[rt.Client, dict[str, Any]]]:
    """A client of a new engine whose store is a temp dir named ``prefix``, and a gateway's
    ``start_gateway`` record (``actor``, ``bootstrap``, ``pid``); the gateway, the engine and a
    Ray started here are stopped on the way out."""
    from raytxn.kafka.gateway import start_gateway

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")
    gateway = None
    try:
        client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix=prefix)}", subscription=SubscriptionConfig())
        try:
            gateway = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1",
                                    num_coordinators=client.config.coordinator.num_coordinators)
            yield client, gateway
        finally:
            if gateway is not None:
                ray.kill(gateway["actor"], no_restart=True)
            client.close()
            stop_engine()
    finally:
        if started_ray:
            ray.shutdown()
