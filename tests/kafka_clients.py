"""Helpers for tests that drive the Kafka gateway with real Kafka clients."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
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


class RawKafka:
    """One connection speaking Kafka's protocol (kafka-python's message classes), a request at
    a time: what a client sends that no client library here sends for us (a transaction resumed
    by its producer id and epoch, a request of a chosen version)."""

    def __init__(self, bootstrap: str, client_id: str = "raw") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation, self.client_id = 0, client_id

    def call(self, api: Any, version: int, **fields: Any) -> Any:
        from raytxn.kafka import wire

        request = api[version](**fields)
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id=self.client_id)
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        size = struct.unpack(">i", self._exactly(4))[0]
        return wire.SERVED[request.API_KEY].response[version].decode(self._exactly(size), header=True)

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            assert chunk, "the gateway closed the connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def gateway_bootstrap() -> Iterator[str]:
    """A module's Kafka gateway: an actor on a free port of 127.0.0.1 (its ``bootstrap``), killed
    after the module's tests (``yield from`` it in a module fixture)."""
    import ray

    from raytxn.kafka.gateway import start_gateway

    address = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1")
    try:
        yield address["bootstrap"]
    finally:
        ray.kill(address["actor"], no_restart=True)


def start_peer_group(peer_group: str, count: int = 2) -> list[dict[str, Any]]:
    """A peer group of ``count`` gateways on free ports of 127.0.0.1, no first-rebalance delay;
    idempotent (a running one is kept, a killed one started again under its broker id)."""
    from raytxn.kafka.gateway import start_gateways

    return start_gateways(count, 0, peer_group=peer_group, bind_host="127.0.0.1", advertised_host="127.0.0.1",
                          initial_rebalance_delay_ms=0)


def gateway_stats(address: dict[str, Any]) -> dict[str, Any]:
    import ray

    return ray.get(address["actor"].stats.remote())


def peer_group_addresses(peer_group: str, count: int = 2) -> Iterator[list[dict[str, Any]]]:
    """A module's peer group (``start_peer_group``), yielded once each gateway lists all of them,
    stopped after the module's tests (``yield from`` it in a module fixture)."""
    from raytxn.kafka.gateway import stop_gateways
    from tests.engine import wait_for

    addresses = start_peer_group(peer_group, count)
    try:
        wait_for(lambda: all(gateway_stats(a)["peers"] == list(range(count)) for a in addresses),
                 what="each gateway lists every peer")
        yield addresses
    finally:
        stop_gateways(peer_group)


def served_api_keys(address: dict[str, Any]) -> set[int]:
    """The Kafka API keys a gateway has answered at least once."""
    return {int(key.split("/")[0]) for key, n in gateway_stats(address)["versions"].items() if n > 0}
