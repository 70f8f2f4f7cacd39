"""Quickstart: an exactly-once transfer between two topics, with a coordinator crash in the middle.

Starts a local Ray and the raytxn engine on the embedded default storage (file://./.raytxn-data),
puts 10 orders on `orders`, and moves each one to `invoices` in a transaction that both produces
the invoice and acknowledges the order. One transaction is aborted on purpose (its order comes
back and is processed again) and one commit crashes the coordinator half way; it recovers from its
log and finishes the commit. At the end every order has exactly one invoice.

The demo deletes the topics it created when it ends, also when it fails midway, so that the next
run starts the same actors; the coordinators' logs stay in the storage. A run that was killed
leaves its topics behind: stop everything and `rm -rf .raytxn-data` to start from nothing.
"""

from __future__ import annotations

import time
import uuid

import raytxn as rt
from raytxn.ids import coordinator_actor_name

RESET_HINT = "`rm -rf .raytxn-data` resets the demo's storage"
# Ray reports the crash on the driver's stdout itself, from a thread of its own (no option turns
# that report off alone), so the demo says once, before it, what it is.
CRASH_NOTE = ("note: the next crash is injected: Ray reports it with a '(raylet) A worker died or was killed "
              "... unexpected system error' line; that line is the crash, expected, not a failure")


def main() -> None:
    t0 = time.perf_counter()
    client = rt.connect()
    print(f"connected in {time.perf_counter() - t0:.1f}s: storage {client.config.storage_url}, "
          f"{client.config.coordinator.num_coordinators} coordinators")
    earlier = [topic["name"] for topic in client.list_topics()]
    if earlier:
        print(f"note: the storage holds {len(earlier)} topics of earlier runs; their actors start if used "
              f"({RESET_HINT})")
    run = uuid.uuid4().hex[:6]
    orders, invoices = f"orders-{run}", f"invoices-{run}"
    created: list[str] = []
    try:
        for topic in (orders, invoices):
            client.create_topic(topic, partitions=2)
            created.append(topic)
        transfer(client, orders, invoices)
        health = client.health()
        print(f"health: {health['active']}/{len(health['actors'])} actors alive, {health['dormant']} dormant "
              f"(started on first use), restarts {sum(r['restarts'] for r in health['actors'])}")
    finally:
        for topic in created:  # their actors and data: the next run starts the same actors again
            client.delete_topic(topic)
        if created:
            print(f"deleted the demo's topics {' and '.join(created)} ({RESET_HINT})")
        client.close()
        rt.shutdown()
    print(f"ok ({time.perf_counter() - t0:.1f}s)")


def transfer(client: rt.Client, orders: str, invoices: str) -> None:
    """Move every order to an invoice, exactly once, with an abort and a coordinator crash on the way."""
    producer = client.create_producer(orders)
    for i in range(10):
        producer.send(f"order-{i}".encode(), key=f"customer-{i % 3}")
    print(f"produced 10 orders on {orders}")

    consumer = client.subscribe(orders, "billing", consumer_type=rt.ConsumerType.Shared,
                                initial_position=rt.InitialPosition.Earliest)
    invoicer = client.create_producer(invoices)
    done: set[str] = set()
    aborted_once = crashed_once = False
    while len(done) < 10:
        msg = consumer.receive(timeout=30)
        order = msg.value().decode()
        txn = client.new_transaction(timeout=30)
        invoicer.send(f"invoice for {order}".encode(), key=msg.key(), txn=txn)
        consumer.acknowledge(msg, txn=txn)
        if order == "order-3" and not aborted_once:
            aborted_once = True
            txn.abort()
            print(f"{txn.id}: aborted on purpose -> its invoice is discarded, {order} is redelivered")
            continue
        if order == "order-6" and not crashed_once:
            crashed_once = True
            tc = coordinator_actor_name(txn.id.tc_id)
            before = client.coordinators.ref(txn.id.tc_id).call("ready")["incarnation"]
            print(CRASH_NOTE)
            client.faults.arm("coordinator.after_log_committing", "crash", actor=tc)
            txn.commit()  # the coordinator dies after logging COMMITTING; the client rides over it
            after = client.coordinators.ref(txn.id.tc_id).call("ready")["incarnation"]
            print(f"{txn.id}: {tc} crashed mid-commit (incarnation {before} -> {after}); "
                  f"recovered from its log and finished the commit")
        else:
            txn.commit()
        done.add(order)
        print(f"{txn.id}: {order} -> invoice (redelivered {msg.redelivery_count()}x)")

    checker = client.subscribe(invoices, "audit", initial_position=rt.InitialPosition.Earliest)
    seen = []
    while True:
        try:
            seen.append(checker.receive(timeout=2).value().decode())
        except rt.errors.Timeout:
            break
    expected = sorted(f"invoice for order-{i}" for i in range(10))
    print(f"{invoices} holds {len(seen)} invoices; exactly once per order: {sorted(seen) == expected}")
    assert sorted(seen) == expected, seen


if __name__ == "__main__":
    main()
