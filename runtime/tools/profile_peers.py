"""Profiles of the peers bench's short-falling cases, each beside its floor in the same run
(issue 56's targets): ``python -m raytxn.tools.profile_peers --out DIR``.

* ``produce``, ``consume``, ``eos``: confluent-kafka's idempotent produce of N messages,
  ``read_committed`` consume of them, and the exactly-once consume-transform-produce loop,
  first against the real Kafka broker (the floor: the same client code), then against raytxn's
  gateway while ``py-spy`` samples every process of this run's Ray (the gateway actor, the
  actor hosts) and this driver;
* ``loop``: the native client's produce loop with a ``flush`` every 100 ms (the plain twin, the
  floor) and with a synchronous commit every 100 ms, each sampled the same way, plus each
  window's split into sending and ending (flush or commit), and the same split of
  confluent-kafka's loop on the Kafka broker (what Kafka's producer loses on that loop).

Each process's CPU seconds over the case (psutil) say where the run's CPU went; py-spy's raw
samples (``--format raw``: collapsed stacks, saved per case and process in ``--out``) give each
function's share of that process's samples, by itself (``self``) and with what it calls
(``total``). py-spy needs to ptrace the sampled processes (root, or CAP_SYS_PTRACE): where it
cannot attach the report says so and keeps the CPU figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import ray

from raytxn.tools import bench_peers_clients as work
from raytxn.tools.bench_kafka import PAYLOAD, _kafka_consume, _kafka_produce
from raytxn.tools.bench_peers import Sides, running_sides

RATE_HZ = 67          # py-spy samples a second (odd, so it does not beat with 100 ms windows)
TOP = 15              # functions per table
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _ray_processes() -> dict[str, int]:
    """This run's Ray worker processes by their title (``ray::KafkaGateway``, ``ray::ActorHost``
    ...), numbered where one title has several; only children of this driver's own raylet, so
    other Ray instances on the machine are never sampled."""
    node = ray._private.worker._global_node  # the raylet of this driver's local Ray
    raylet = node.all_processes["raylet"][0].process.pid
    found: dict[str, int] = {}
    for proc in psutil.Process(raylet).children(recursive=True):
        try:
            title = proc.cmdline()[0].split(".")[0].split(" ")[0] if proc.cmdline() else ""
        except psutil.Error:
            continue
        if not title.startswith("ray::") or title == "ray::IDLE":
            continue
        name, n = title[5:], 2
        while name in found:
            name, n = f"{title[5:]}#{n}", n + 1
        found[name] = proc.pid
    return found


@contextmanager
def sampled(case: str, out: Path, targets: dict[str, int]) -> Iterator[dict[str, Any]]:
    """py-spy on each of ``targets`` (name -> pid) while the block runs, and their CPU
    seconds; fills the yielded dict with ``cpu_s``, ``wall_s`` and ``samples`` files."""
    result: dict[str, Any] = {"case": case, "cpu_s": {}, "files": {}, "attach_errors": {}}
    spies: dict[str, tuple[subprocess.Popen, Path]] = {}
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for name, pid in targets.items():
        path = out / f"{case}-{name.replace('#', '_')}.txt"
        proc = subprocess.Popen([py_spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw",
                                 "--nonblocking", "--output", str(path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        spies[name] = (proc, path)
    time.sleep(1.0)  # py-spy attaches (reads the interpreter's memory layout) before the clock runs
    cpu0 = {name: _cpu(pid) for name, pid in targets.items()}
    start = time.perf_counter()
    try:
        yield result
    finally:
        result["wall_s"] = round(time.perf_counter() - start, 3)
        for name, pid in targets.items():
            result["cpu_s"][name] = round(_cpu(pid) - cpu0[name], 3)
        for name, (proc, path) in spies.items():
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if path.exists():
                result["files"][name] = str(path)
            else:
                result["attach_errors"][name] = (err or "").strip()[-300:]


def _cpu(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def function_table(raw_file: str, top: int = TOP) -> tuple[int, list[dict]]:
    """The samples of a py-spy raw file, and its ``top`` functions by self share: each with
    its self and total share of the samples (%), a function counted once per sample however
    deep it recurs. Functions are ``name (file)`` without line numbers, file shortened to its
    last two parts."""
    self_n: collections.Counter[str] = collections.Counter()
    total_n: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in Path(raw_file).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(frame) for frame in stack.split(";") if not frame.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        self_n[frames[-1]] += count
        for frame in set(frames):
            total_n[frame] += count
    rows = [{"function": f, "self_pct": round(100 * n / samples, 1), "total_pct": round(100 * total_n[f] / samples, 1)}
            for f, n in self_n.most_common(top)] if samples else []
    return samples, rows


def total_share(raw_file: str, needles: tuple[str, ...]) -> float:
    """% of the file's samples whose stack holds a frame containing any of ``needles``."""
    hit = samples = 0
    for line in Path(raw_file).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        samples += int(count_text)
        if any(needle in stack for needle in needles):
            hit += int(count_text)
    return round(100 * hit / samples, 1) if samples else 0.0


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    parts = Path(match["file"]).parts
    return f"{match['func']} ({'/'.join(parts[-2:])})"


# --- the cases -------------------------------------------------------------------------------


def processes() -> dict[str, int]:
    """What to sample: this driver and this run's Ray processes (taken again per case: a new
    topic's actors may start in a new process)."""
    return {"driver": os.getpid(), **_ray_processes()}


def _produce_consume(sides: Sides, out: Path, messages: int) -> list[dict]:
    results = []
    floor_topic = sides.topic("kafka", "prof-produce")
    produce_kafka = _kafka_produce(sides.kafka, floor_topic, messages)
    consume_kafka, _ = _kafka_consume(sides.kafka, floor_topic, 1, messages)
    topic = sides.topic("gateway", "prof-produce")
    with sampled("produce", out, processes()) as produce:
        produce_gateway = _kafka_produce(sides.gateway, topic, messages)
    produce.update(msgs_per_s=round(messages / produce_gateway), floor_msgs_per_s=round(messages / produce_kafka),
                   floor="the same confluent-kafka producer on the Kafka broker, just before")
    with sampled("consume", out, processes()) as consume:
        consume_gateway, _ = _kafka_consume(sides.gateway, topic, 1, messages)
    consume.update(msgs_per_s=round(messages / consume_gateway), floor_msgs_per_s=round(messages / consume_kafka),
                   floor="the same confluent-kafka consumer on the Kafka broker, just before")
    results += [produce, consume]
    sides.drop_topics()
    return results


def _eos(sides: Sides, out: Path, messages: int) -> dict:
    source, sink = sides.topic("kafka", "prof-eos-in"), sides.topic("kafka", "prof-eos-out")
    work.kafka_fill(sides.kafka, source, messages)
    floor = work.kafka_eos_loop(sides.kafka, source, sink, messages)
    source, sink = sides.topic("gateway", "prof-eos-in"), sides.topic("gateway", "prof-eos-out")
    work.kafka_fill(sides.gateway, source, messages)
    with sampled("eos", out, processes()) as eos:
        rate = work.kafka_eos_loop(sides.gateway, source, sink, messages)
    sides.drop_topics()
    eos.update(msgs_per_s=round(rate), floor_msgs_per_s=round(floor),
               floor="the same confluent-kafka loop on the Kafka broker, just before")
    return eos


def _split_figures(sent: int, elapsed: float, windows: int, split: dict[str, float]) -> dict:
    return {"msgs_per_s": round(sent / elapsed), "windows": windows, **{k: round(v, 3) for k, v in split.items()},
            "end_ms_per_window": round(1000 * split["end_s"] / windows, 1)}


def timed_native_loop(client: Any, topic: str, seconds: float, transactional: bool) -> dict:
    """``bench_peers_clients.native_loop``'s plain or txn_sync pattern, with each window's split:
    seconds sending (``send_async``), ending (``flush``; ``commit``) and beginning."""
    producer = client.create_producer(topic, batching_max_delay_ms=2)
    split = {"begin_s": 0.0, "send_s": 0.0, "end_s": 0.0}
    sent = windows = 0
    start = time.perf_counter()
    while time.perf_counter() < start + seconds:
        t0 = time.perf_counter()
        txn = client.new_transaction(timeout=60) if transactional else None
        t1 = time.perf_counter()
        while time.perf_counter() < t1 + work.WINDOW_S:
            for _ in range(work.SENDS_PER_CHECK):
                producer.send_async(PAYLOAD, txn=txn)
            sent += work.SENDS_PER_CHECK
        t2 = time.perf_counter()
        if txn is not None:
            txn.commit()
        else:
            producer.flush()
        t3 = time.perf_counter()
        split["begin_s"] += t1 - t0
        split["send_s"] += t2 - t1
        split["end_s"] += t3 - t2
        windows += 1
    elapsed = time.perf_counter() - start
    producer.close()
    return _split_figures(sent, elapsed, windows, split)


def timed_kafka_loop(bootstrap: str, topic: str, seconds: float, transactional: bool) -> dict:
    """confluent-kafka's loop (``bench_peers_clients.kafka_loop``) with the same split."""
    from confluent_kafka import Producer

    if transactional:
        producer = work.transactional_producer(bootstrap, "prof-loop")
    else:
        producer = Producer(work._producer_config(bootstrap, **{"enable.idempotence": True, "acks": "all"}))
    producer.list_topics(topic, timeout=30)
    split = {"begin_s": 0.0, "send_s": 0.0, "end_s": 0.0}
    sent = windows = 0
    start = time.perf_counter()
    while time.perf_counter() < start + seconds:
        t0 = time.perf_counter()
        if transactional:
            producer.begin_transaction()
        t1 = time.perf_counter()
        while time.perf_counter() < t1 + work.WINDOW_S:
            for _ in range(work.SENDS_PER_CHECK):
                work._produce_one(producer, topic)
            producer.poll(0)
            sent += work.SENDS_PER_CHECK
        t2 = time.perf_counter()
        if transactional:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
        t3 = time.perf_counter()
        split["begin_s"] += t1 - t0
        split["send_s"] += t2 - t1
        split["end_s"] += t3 - t2
        windows += 1
    elapsed = time.perf_counter() - start
    return _split_figures(sent, elapsed, windows, split)


def _loop(sides: Sides, out: Path, seconds: float, rounds: int) -> list[dict]:
    """Plain and txn_sync, natively (sampled) and on Kafka (timed), alternating, ``rounds`` times."""
    results = []
    for round_ in range(rounds):
        for transactional in (False, True):
            name = f"loop-{'txn_sync' if transactional else 'plain'}-r{round_ + 1}"
            topic = sides.topic("native", name)
            with sampled(name, out, processes()) as result:
                result.update(timed_native_loop(sides.client, topic, seconds, transactional))
            kafka_topic = sides.topic("kafka", name)
            result["kafka"] = timed_kafka_loop(sides.kafka, kafka_topic, seconds, transactional)
            results.append(result)
            sides.drop_topics()
    return results


def summarize(result: dict) -> dict:
    """Each sampled process's CPU seconds, samples and top functions."""
    tables = {}
    for name, path in result.get("files", {}).items():
        samples, rows = function_table(path)
        tables[name] = {"cpu_s": result["cpu_s"].get(name), "samples": samples, "top": rows}
    return {**{k: v for k, v in result.items() if k != "files"}, "profiles": tables}


def main(argv: list[str] | None = None, progress: Callable[[str], None] = print) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m raytxn.tools.profile_peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results/profiles", help="folder for the raw profiles and profiles.json")
    parser.add_argument("--cases", default="produce,consume,eos,loop")
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--eos-messages", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--loop-rounds", type=int, default=2)
    parser.add_argument("--kafka-bootstrap", default="", help="a running broker instead of starting one")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = set(args.cases.split(","))
    results: list[dict] = []
    with running_sides(args.kafka_bootstrap) as sides:
        progress(f"sampling {processes()}")
        warm = sides.topic("gateway", "prof-warm")
        _kafka_produce(sides.gateway, warm, 2_000)  # the gateway's first connections and metadata
        sides.drop_topics()
        if cases & {"produce", "consume"}:
            results += _produce_consume(sides, out, args.messages)
        if "eos" in cases:
            results.append(_eos(sides, out, args.eos_messages))
        if "loop" in cases:
            results += _loop(sides, out, args.seconds, args.loop_rounds)
    summaries = [summarize(r) for r in results if r["case"].split("-")[0] in cases]
    (out / "profiles.json").write_text(json.dumps(summaries, indent=1))
    for summary in summaries:
        progress(json.dumps({k: v for k, v in summary.items() if k != "profiles"}))
    progress(f"wrote {out / 'profiles.json'}")
    return summaries


if __name__ == "__main__":
    main()
