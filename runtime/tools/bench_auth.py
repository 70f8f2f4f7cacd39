"""What auth costs: produce throughput (plain and transactional) and the latency of one
synchronous send, with auth off and on (every call then carries a token the actor verifies;
verified tokens are cached, so the steady-state cost is a dict lookup and a permission check)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

import ray

import raytxn as rt
from raytxn.auth import create_token, new_secret
from raytxn.cluster import stop_engine
from raytxn.tools.bench_produce import PAYLOAD, _produce


def _send_latencies_ms(client: rt.Client, topic: str, sends: int) -> list[float]:
    producer = client.create_producer(topic, batching_max_delay_ms=0)
    latencies = []
    for _ in range(sends):
        start = time.perf_counter()
        producer.send(PAYLOAD)
        latencies.append((time.perf_counter() - start) * 1000)
    return sorted(latencies)


def bench_auth(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """Produce throughput (1 partition, plain and txn) and sync-send latency, auth off vs on."""
    messages = 20_000 if short else 100_000
    sends = 300 if short else 2_000
    rows = []
    for auth in (False, True):
        if ray.is_initialized():
            stop_engine()
        secret = new_secret()
        admin = create_token(secret, "admin")
        storage = f"file://{tempfile.mkdtemp(prefix='raytxn-bench-auth-')}"
        admin_client = rt.connect(storage=storage, **({"auth_secret": secret, "token": admin} if auth else {}))
        client = admin_client
        try:
            admin_client.create_topic("bench-auth", 1)
            if auth:  # produce as an ordinary principal: the permission check runs on every append
                admin_client.grant_permission("bench-auth", "producer", ["produce"])
                client = rt.connect(token=create_token(secret, "producer"))
            plain = _produce(client, "bench-auth", messages, transactional=False)
            txn = _produce(client, "bench-auth", messages, transactional=True)
            latencies = _send_latencies_ms(client, "bench-auth", sends)
            row = auth_row(auth, messages, plain, txn, latencies)
            progress(f"  auth {row['auth']:3}: plain {plain:8.0f} msgs/s, txn {txn:8.0f} msgs/s, "
                     f"send p50 {row['send_p50_ms']:.2f} ms p99 {row['send_p99_ms']:.2f} ms")
            rows.append(row)
        finally:
            if client is not admin_client:
                client.close()
            admin_client.close()
            stop_engine(admin if auth else None)
    off, on = with_ratio_to_auth_off(rows)
    progress(f"  auth on / off: plain {on['plain_vs_auth_off']:.2f}, "
             f"send p50 +{on['send_p50_ms'] - off['send_p50_ms']:.3f} ms")
    return [off, on]


def auth_row(auth: bool, messages: int, plain_msgs_per_s: float, txn_msgs_per_s: float,
             send_latencies_ms: list[float]) -> dict:
    latencies = sorted(send_latencies_ms)
    return {"bench": "auth", "auth": "on" if auth else "off", "messages": messages,
            "plain_msgs_per_s": round(plain_msgs_per_s, 1), "txn_msgs_per_s": round(txn_msgs_per_s, 1),
            "send_p50_ms": round(latencies[len(latencies) // 2], 3),
            "send_p99_ms": round(latencies[int(len(latencies) * 0.99)], 3)}


def with_ratio_to_auth_off(rows: list[dict]) -> list[dict]:
    """The rows of auth off and on, each with its plain throughput over auth off's."""
    off = next(row for row in rows if row["auth"] == "off")
    return [{**row, "plain_vs_auth_off": round(row["plain_msgs_per_s"] / off["plain_msgs_per_s"], 3)} for row in rows]
