"""Multi-node run (executed in its own process by test_multinode.py): a 3-node
``ray.cluster_utils.Cluster`` whose two worker nodes host the engine, its actors spread over both;
the node hosting a coordinator and some partitions is removed mid-run; everything recovers on the
other node, and a topic whose partitions were passivated (dormant) before the loss is activated
on the surviving node with its data whole. Prints one JSON line with what happened and the
checker's report."""

from __future__ import annotations

import faulthandler
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

import raytxn as rt
from raytxn.client.message import MessageId
from raytxn.client.rpc import ActorRef
from raytxn.ids import Position, coordinator_actor_name, partition_actor_name
from raytxn.protocol.entry_format import decode_entry
from raytxn.tools.checker import check
from raytxn.tools.history import History

TOPIC = "multinode"
PARTITIONS = 4
IDLE_TOPIC = "multinode-idle"


def node_of(name: str) -> str:
    rows = list_actors(filters=[("name", "=", name), ("state", "=", "ALIVE")])
    return rows[0]["node_id"] if rows else ""


def drain(topic: str = TOPIC, partitions: int = PARTITIONS) -> list[tuple[int, MessageId, str]]:
    out = []
    for p in range(partitions):
        position = Position(0, 0)
        while True:
            result = ActorRef(partition_actor_name(topic, p)).call("read", position, 1000, deadline_s=120)
            for pos, records in result["entries"]:
                for index, message in enumerate(decode_entry(records)[1]):
                    out.append((p, MessageId(topic, p, pos.ledger_id, pos.entry_id, index), message.value.decode()))
            if result["next"] == position:
                break
            position = result["next"]
    return out


def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.5)


def main() -> None:
    faulthandler.dump_traceback_later(480, exit=True)  # a hang shows where it hangs
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 1}})
    workers = [cluster.add_node(num_cpus=2, resources={"raytxn": 100}) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="raytxn", logging_level="ERROR")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-multinode-')}",
                        actor_resources={"raytxn": 0.01}, watch_interval_s=0.5, deadline_s=120,
                        passivate_idle_s=5.0)
    client.create_topic(IDLE_TOPIC, 2)
    idle_producer = client.create_producer(IDLE_TOPIC)
    for k in range(8):  # keys over both partitions
        idle_producer.send(f"before-{k}".encode(), key=f"k{k}")
    idle_producer.close()
    client.create_topic(TOPIC, PARTITIONS)
    producer = client.create_producer(TOPIC, send_timeout_s=120)
    history = History()
    stop = threading.Event()
    committed_txns = [0]

    def workload() -> None:
        i = 0
        while not stop.is_set():
            txn = client.new_transaction(timeout=30)
            history.txn_begin(txn.id, time.monotonic())
            for j in range(4):
                uid = f"m-{i}-{j}"
                history.send(uid, TOPIC, None, txn.id, producer.producer_name, time.monotonic())
                try:
                    history.send_ok(uid, producer.send(uid.encode(), key=uid, txn=txn), time.monotonic(),
                                     producer=producer.producer_name)
                except Exception as e:  # noqa: BLE001 - recorded: the checker decides
                    history.send_failed(uid, e, time.monotonic(), producer=producer.producer_name)
            issued = time.monotonic()
            try:
                txn.commit()
                history.txn_commit(txn.id, "committed", time.monotonic(), issued_at=issued)
                committed_txns[0] += 1
            except rt.errors.TransactionAlreadyAborted:
                history.txn_commit(txn.id, "aborted", time.monotonic(), issued_at=issued)
            except Exception:  # noqa: BLE001 - outcome unknown to the client
                history.txn_commit(txn.id, "unknown", time.monotonic(), issued_at=issued)
            i += 1

    worker = threading.Thread(target=workload)
    worker.start()
    def idle_dormant() -> bool:
        return not any(node_of(partition_actor_name(IDLE_TOPIC, p)) for p in range(2))

    # the workload under way, and the idle topic's partitions passivated meanwhile
    wait_until(lambda: committed_txns[0] >= 5 and idle_dormant(), 120)
    dormant_before_loss = idle_dormant()
    spread = {}
    for n in [coordinator_actor_name(0), coordinator_actor_name(1)] + [partition_actor_name(TOPIC, p)
                                                                     for p in range(PARTITIONS)]:
        spread[n] = node_of(n)
    victim_node = node_of(coordinator_actor_name(0))
    hosted = [n for n in [coordinator_actor_name(0), coordinator_actor_name(1)]
              + [partition_actor_name(TOPIC, p) for p in range(PARTITIONS)] if node_of(n) == victim_node]
    victim = next(w for w in workers if w.node_id == victim_node)
    before = committed_txns[0]
    cluster.remove_node(victim, allow_graceful=False)
    removed_at = time.monotonic()
    # progress again, and the victim's actors seen running elsewhere (the GCS marks the node's
    # actors dead a while after the node is gone: until then they are still listed on it)
    wait_until(lambda: committed_txns[0] >= before + 5
               and all(node_of(n) not in ("", victim_node) for n in hosted), 180)
    moved = {n: node_of(n) for n in hosted}
    stop.set()
    worker.join(timeout=300)
    after = committed_txns[0]
    idle_producer = client.create_producer(IDLE_TOPIC)
    for k in range(8):
        idle_producer.send(f"after-{k}".encode(), key=f"k{k}")  # activates them on a surviving node
    idle_values = sorted(v for _, _, v in drain(IDLE_TOPIC, 2))
    health = client.health()
    history.final_state("drain", TOPIC, drain())
    report = check(history, txn_timeout_s=30)
    print(json.dumps({
        "victim_hosted": hosted, "moved_to": moved, "victim_node": victim_node,
        "committed_before_removal": before, "committed_total": after,
        "healthy": health["healthy"], "clean": report.clean, "summary": report.summary(),
        "recovered_s": time.monotonic() - removed_at, "spread": spread,
        "worker_nodes": [w.node_id for w in workers], "dormant_before_loss": dormant_before_loss,
        "idle_topic_values": idle_values,
        "idle_topic_nodes": [node_of(partition_actor_name(IDLE_TOPIC, p)) for p in range(2)],
        "idle_topic_partitions": sorted({p for p, _, _ in drain(IDLE_TOPIC, 2)}),
    }))
    client.close()
    rt.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
