"""What full fetches of idle partitions cost the Kafka gateway (issue 57, KIP-227 fetch sessions):
``python -m raytxn.tools.profile_idle_fetch --out DIR``.

One Kafka consumer (assign mode, read_committed) reads a busy topic (``--busy`` partitions, a
native producer writing ``--rate`` msgs/s of 100 B to it) through one gateway, in two cases of
``--seconds`` each, the same traffic in both:

* ``busy``: the consumer is assigned the busy partitions only (the floor);
* ``busy+idle``: it is also assigned ``--idle`` partitions of another topic that get nothing.

A Kafka client without fetch sessions names every assigned partition in every Fetch, and the
gateway reads each of them from its partition actor and answers each, data or not. The gateway's
CPU seconds over each case (psutil), its Fetch requests and their bytes in and out (its
``stats()["traffic"]``), and in the ``busy+idle`` case a py-spy profile of the gateway (its share
of samples in the Fetch's decoding, the partition reads, building and encoding the answer) say what
the idle partitions cost: ``idle_cpu_share`` = 1 - busy CPU / busy+idle CPU, per message served.
``--client`` picks confluent-kafka (librdkafka, which never opens a fetch session: it sends
session id 0, epoch -1) or kafka-python (which opens one when the broker answers a session id).

The engine runs with two actor hosts (``actor_hosts=2``), so that a hundred partitions cost no
hundred processes; the gateway makes the same call per partition either way.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.config import SubscriptionConfig
from raytxn.ids import NAMESPACE
from raytxn.tools.processes import cpu_seconds
from raytxn.tools.profile_peers import IDLE_LEAVES, function_table, sampled

PAYLOAD = b"x" * 100
TICK_S = 0.01  # the producer sends rate * TICK_S messages a tick
WARM_S = 5.0   # the consumer runs this long before a case's clock (partition actors activate, sessions open)
HOSTS = 2
# The gateway's Fetch path by part, each a (function, file) frame: a sample counts for each part
# one of whose frames its stack holds (an awaiting coroutine is not on the stack: each part's own
# steps are).
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "decode_request": (("decode_request", "kafka/wire.py"),),
    "partition_reads": (("_read", "kafka/broker.py"), ("_data_arrived", "kafka/broker.py"),
                        ("_fetch_all", "kafka/broker.py"), ("call_async", "client/rpc.py")),
    "fetch_answer": (("fetch", "kafka/broker.py"), ("_partition_data", "kafka/broker.py")),
    "encode_response": (("encode_response", "kafka/wire.py"),),
}
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def part_shares(raw_file: str) -> dict[str, float]:
    """% of a py-spy raw file's busy samples (not waiting: ``profile_peers.IDLE_LEAVES``) whose
    stack holds a frame of each of ``PARTS``."""
    hits = dict.fromkeys(PARTS, 0)
    samples = 0
    for line in Path(raw_file).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit() or stack.rsplit(";", 1)[-1].startswith(IDLE_LEAVES):
            continue
        samples += int(count_text)
        frames = {(m["func"], m["file"]) for m in map(_FRAME.match, stack.split(";")) if m}
        for part, wanted in PARTS.items():
            if any((f == func or f.endswith(f".{func}")) and file.endswith(suffix)
                   for func, suffix in wanted for f, file in frames):
                hits[part] += int(count_text)
    return {part: round(100 * n / samples, 1) if samples else 0.0 for part, n in hits.items()}


def _consumer_main(client: str, bootstrap: str, assignment: list[tuple[str, int]], seconds: float) -> None:
    """A consumer process: reads the assignment from its end, warms up ``WARM_S``, prints
    ``{"warm": true}``, then reads ``seconds`` more and prints the messages read in them."""
    got = 0
    if client == "confluent":
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raytxn-profile-unused",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        consumer.assign([TopicPartition(t, p, OFFSET_END) for t, p in assignment])

        def poll() -> int:
            return sum(1 for m in consumer.consume(1000, 0.1) if m.error() is None)
    else:
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KafkaTopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                 isolation_level="read_committed")
        partitions = [KafkaTopicPartition(t, p) for t, p in assignment]
        consumer.assign(partitions)
        consumer.seek_to_end()

        def poll() -> int:
            return sum(len(records) for records in consumer.poll(timeout_ms=100, max_records=1000).values())
    end = time.monotonic() + WARM_S
    while time.monotonic() < end:
        poll()
    print(json.dumps({"warm": True}), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got += poll()
    print(json.dumps({"consumed": got}), flush=True)
    consumer.close()


class Feeder(threading.Thread):
    """A native producer writing ``rate`` msgs/s to ``topic`` until stopped."""

    def __init__(self, client: rt.Client, topic: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.producer = client.create_producer(topic, batching_max_delay_ms=2)
        self.values = pa.array([PAYLOAD] * max(1, int(rate * TICK_S)), type=pa.binary())
        self.sent = 0
        self._done = threading.Event()

    def run(self) -> None:
        next_tick = time.monotonic()
        while not self._done.is_set():
            self.producer.send_batch(self.values)
            self.sent += len(self.values)
            next_tick += TICK_S
            self._done.wait(max(0.0, next_tick - time.monotonic()))

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.producer.flush()
        self.producer.close()


def _case(name: str, client_kind: str, gateway: dict[str, Any], assignment: list[tuple[str, int]], seconds: float,
          out: Path, profile: bool) -> dict[str, Any]:
    bootstrap = gateway["bootstrap"]
    label = f"{client_kind}-{name}-{'watch' if gateway['watch_idle'] else 'read'}"
    errors = (out / f"{label}-consumer.log").open("w")  # a file: a chatty client never blocks
    proc = subprocess.Popen([sys.executable, "-m", "raytxn.tools.profile_idle_fetch", "consume", client_kind,
                             bootstrap, json.dumps(assignment), str(seconds)],
                            stdout=subprocess.PIPE, stderr=errors, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != json.dumps({"warm": True}):
        proc.wait(timeout=60)
        raise RuntimeError(f"the {client_kind} consumer failed ({proc.returncode}): see {errors.name}")
    before = ray.get(gateway["actor"].stats.remote())
    cpu0 = cpu_seconds(gateway["pid"])
    result: dict[str, Any] = {"case": name, "client": client_kind, "partitions": len(assignment)}
    if profile:
        with sampled(label, out, {"gateway": gateway["pid"]}) as spied:
            consumed = json.loads(proc.stdout.readline())["consumed"]
        result["profile"] = spied["files"].get("gateway")
    else:
        consumed = json.loads(proc.stdout.readline())["consumed"]
    cpu = cpu_seconds(gateway["pid"]) - cpu0
    after = ray.get(gateway["actor"].stats.remote())
    proc.wait(timeout=60)
    errors.close()
    fetches = sum(n - before["versions"].get(k, 0) for k, n in after["versions"].items() if k.startswith("1/"))
    bytes_in, bytes_out = (after["traffic"]["1"][i] - before["traffic"].get("1", [0, 0])[i] for i in (0, 1))
    result.update(consumed=consumed, gateway_cpu_s=round(cpu, 3), fetches=fetches,
                  cpu_ms_per_fetch=round(1000 * cpu / max(fetches, 1), 3),
                  cpu_us_per_message=round(1e6 * cpu / max(consumed, 1), 2),
                  fetch_bytes_in=bytes_in, fetch_bytes_out=bytes_out,
                  bytes_in_per_fetch=round(bytes_in / max(fetches, 1)),
                  bytes_out_per_fetch=round(bytes_out / max(fetches, 1)))
    return result


def profile_idle_fetch(partitions_busy: int, partitions_idle: int, rate: int, seconds: float, clients: list[str],
                       out: Path, progress: Callable[[str], None] = print) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    from raytxn.kafka.gateway import start_gateway

    ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-profile-idle-fetch-')}",
                        subscription=SubscriptionConfig(), actor_hosts=HOSTS)
    gateways: dict[bool, dict[str, Any]] = {}
    rows: list[dict] = []
    try:
        for watch in (False, True):
            gateways[watch] = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1",
                                            num_coordinators=client.config.coordinator.num_coordinators,
                                            watch_idle=watch)
        client.create_topic("busy", partitions_busy)
        client.create_topic("idle", partitions_idle)
        busy = [("busy", p) for p in range(partitions_busy)]
        idle = [("idle", p) for p in range(partitions_idle)]
        feeder = Feeder(client, "busy", rate)
        feeder.start()
        try:
            for kind in clients:
                for watch, gateway in gateways.items():
                    for name, assignment in (("busy", busy), ("busy+idle", busy + idle)):
                        row = _case(name, kind, gateway, assignment, seconds, out, profile=name == "busy+idle")
                        row["watch_idle"] = watch
                        progress(f"  {kind} watch_idle={watch} {name}: {row}")
                        rows.append(row)
        finally:
            feeder.stop()
    finally:
        for gateway in gateways.values():
            ray.kill(gateway["actor"], no_restart=True)
        client.close()
        stop_engine()
        ray.shutdown()
    return summarize(rows)


def summarize(rows: list[dict]) -> list[dict]:
    """Each client's two cases side by side, per setting of the gateway's idle watch: the idle
    partitions' share of the gateway's CPU per message, and the shares of the busy+idle profile's
    busy samples in each part of the Fetch path."""
    summary = []
    for kind, watch in dict.fromkeys((r["client"], r["watch_idle"]) for r in rows):
        floor, full = (next(r for r in rows if (r["client"], r["watch_idle"], r["case"]) == (kind, watch, case))
                       for case in ("busy", "busy+idle"))
        row: dict[str, Any] = {"client": kind, "watch_idle": watch, "busy_partitions": floor["partitions"],
                               "idle_partitions": full["partitions"] - floor["partitions"],
                               "cpu_us_per_message_busy": floor["cpu_us_per_message"],
                               "cpu_us_per_message_busy_idle": full["cpu_us_per_message"],
                               "idle_cpu_share": round(1 - floor["cpu_us_per_message"] / full["cpu_us_per_message"], 3),
                               "cpu_ms_per_fetch_busy": floor["cpu_ms_per_fetch"],
                               "cpu_ms_per_fetch_busy_idle": full["cpu_ms_per_fetch"],
                               "bytes_in_per_fetch": [floor["bytes_in_per_fetch"], full["bytes_in_per_fetch"]],
                               "bytes_out_per_fetch": [floor["bytes_out_per_fetch"], full["bytes_out_per_fetch"]],
                               "fetches": [floor["fetches"], full["fetches"]],
                               "consumed": [floor["consumed"], full["consumed"]]}
        if full.get("profile"):
            every, busy_samples, top = function_table(full["profile"])
            row["profile_samples"] = [every, busy_samples]
            row["shares_pct_of_busy_samples"] = part_shares(full["profile"])
            row["top_functions"] = top[:10]
        summary.append(row)
    return summary


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m raytxn.tools.profile_idle_fetch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=4, help="partitions of the busy topic")
    parser.add_argument("--idle", type=int, default=60, help="partitions of the idle topic")
    parser.add_argument("--rate", type=int, default=5000, help="msgs/s the native producer writes to the busy topic")
    parser.add_argument("--seconds", type=float, default=20.0, help="each case's measured time")
    parser.add_argument("--clients", default="confluent,kafka-python")
    parser.add_argument("--out", type=Path, default=Path("bench-results/idle-fetch"))
    args = parser.parse_args(argv)
    rows = profile_idle_fetch(args.busy, args.idle, args.rate, args.seconds, args.clients.split(","), args.out)
    (args.out / "idle-fetch.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "consume":  # a consumer process of the profile
        _consumer_main(sys.argv[2], sys.argv[3], [tuple(a) for a in json.loads(sys.argv[4])], float(sys.argv[5]))
    else:
        main()
