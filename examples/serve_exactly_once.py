"""Ray Serve and raytxn.aio: a deployment that turns orders into invoices exactly once while it
answers requests.

Starts a local Ray (or joins the one RAY_ADDRESS names) and the raytxn engine on the embedded
default storage (file://./.raytxn-data), then Ray Serve with its HTTP proxy on 127.0.0.1:--port,
and deploys `Invoicer`. Its replica consumes `orders` and, for each order, produces an invoice and
acknowledges the order in one transaction, with raytxn.aio: every wait is awaited, so the
replica's event loop stays free and `GET /invoicer` is answered meanwhile. The demo puts orders
on `orders`, kills the subscription actor that feeds the replica half way (Ray restarts it, it
recovers from its log, the replica's consumer reattaches), asks the replica over HTTP all along,
and at the end checks that every order has exactly one invoice.

The demo shuts Serve down and deletes the topics it created when it ends, also when it fails.
Run: .venv/bin/python examples/serve_exactly_once.py [--orders 40] [--port 8000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import requests
from ray import serve

import raytxn as rt
from raytxn import aio
from raytxn.ids import subscription_actor_name

# Ray reports the kill on the driver's stdout itself, from a thread of its own.
KILL_NOTE = ("note: the next kill is on purpose: Ray may report it with a '(raylet) ... worker died or was "
             "killed' line; that line is the kill, expected, not a failure")


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Invoicer:
    """Invoices every order of ``orders`` on ``invoices``, exactly once; ``GET`` says how many."""

    async def __init__(self, storage_url: str, orders: str, invoices: str) -> None:  # type: ignore[misc]
        self.client = await aio.connect(storage=storage_url)
        self.orders = await self.client.subscribe(orders, "billing", initial_position="earliest",
                                                  consumer_type="Shared")
        self.invoices = await self.client.create_producer(invoices)
        self.invoiced = 0
        self.worker = asyncio.ensure_future(self.invoice_orders())  # runs beside the requests

    async def invoice_orders(self) -> None:
        while True:
            try:
                order = await self.orders.receive(timeout=5)
            except rt.errors.Timeout:
                continue
            txn = await self.client.new_transaction(timeout=30)
            try:
                # the invoice and the order's ack commit together, or neither does
                await self.invoices.send(b"invoice for " + order.value(), key=order.key(), txn=txn)
                await self.orders.acknowledge(order, txn=txn)
                await txn.commit()
                self.invoiced += 1
            except rt.errors.RaytxnError:  # not committed: its invoice never shows
                if txn.state not in ("COMMITTED", "ABORTED"):
                    try:
                        await txn.abort()
                    except rt.errors.RaytxnError:
                        pass  # its coordinator aborts it at its timeout
                self.orders.negative_acknowledge(order)  # comes back, to be invoiced again

    async def __call__(self, request: Any) -> dict[str, int]:
        return {"invoiced": self.invoiced}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=40)
    parser.add_argument("--port", type=int, default=8000, help="Serve's HTTP port on 127.0.0.1")
    args = parser.parse_args()
    t0 = time.perf_counter()
    client = rt.connect()
    print(f"connected in {time.perf_counter() - t0:.1f}s: storage {client.config.storage_url}")
    run = uuid.uuid4().hex[:6]
    orders, invoices = f"orders-{run}", f"invoices-{run}"
    created: list[str] = []
    try:
        for topic in (orders, invoices):
            client.create_topic(topic, partitions=2)
            created.append(topic)
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        serve.run(Invoicer.bind(client.config.storage_url, orders, invoices), name="invoicer",
                  route_prefix="/invoicer")
        print(f"Serve answers on http://127.0.0.1:{args.port}/invoicer ({time.perf_counter() - t0:.1f}s); "
              f"putting {args.orders} orders on {orders}")
        invoice_with_a_kill(client, orders, invoices, args.orders, f"http://127.0.0.1:{args.port}/invoicer")
    finally:
        serve.shutdown()
        for topic in created:
            client.delete_topic(topic)
        client.close()
        rt.shutdown()
    print(f"ok ({time.perf_counter() - t0:.1f}s)")


def invoice_with_a_kill(client: rt.Client, orders: str, invoices: str, count: int, url: str) -> None:
    producer = client.create_producer(orders)
    latencies: list[float] = []

    def ask() -> int:
        started = time.monotonic()
        answer = requests.get(url, timeout=60)
        answer.raise_for_status()
        latencies.append(time.monotonic() - started)
        return answer.json()["invoiced"]

    for i in range(count):
        producer.send(f"order-{i}".encode(), key=f"customer-{i % 5}")
        ask()
        if i == count // 2:
            print(KILL_NOTE)
            name = subscription_actor_name(orders, 0, "billing")
            client.faults.kill(name)
            print(f"killed {name} after {i + 1} orders")
    sent = time.monotonic()
    while (invoiced := ask()) < count:
        assert time.monotonic() < sent + 120, f"only {invoiced} of {count} orders invoiced"
        time.sleep(0.1)
    print(f"every order invoiced {time.monotonic() - sent:.1f}s after the last was sent; the replica answered "
          f"{len(latencies)} requests meanwhile, the slowest in {max(latencies) * 1000:.0f} ms")

    audit = client.subscribe(invoices, "audit", initial_position="earliest")
    seen = []
    while True:
        try:
            seen.append(audit.receive(timeout=2).value().decode())
        except rt.errors.Timeout:
            break
    expected = sorted(f"invoice for order-{i}" for i in range(count))
    print(f"{invoices} holds {len(seen)} invoices; exactly once per order: {sorted(seen) == expected}")
    assert sorted(seen) == expected, seen


if __name__ == "__main__":
    main()
