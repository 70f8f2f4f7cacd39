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
import itertools
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

import ray

from raytxn.tools import bench_peers_clients as work
from raytxn.tools.bench_kafka import PAYLOAD, _kafka_consume, _kafka_produce
from raytxn.tools.bench_peers import Sides, _broker, running_sides
from raytxn.tools.processes import cpu_seconds, ray_processes

BROKER_PID: list[int] = []  # the Kafka broker this run started (its CPU is measured beside the gateway's)
RATE_HZ = 67          # py-spy samples a second (odd, so it does not beat with 100 ms windows)
TOP = 15              # functions per table
# Leaf frames of a thread that waits: Ray's core worker loop (C++, blocked; py-spy cannot tell it
# from a running one) and an event loop's select. A table's shares are of the other samples.
IDLE_LEAVES = ("Worker.main_loop", "EpollSelector.select", "select (selectors.py")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


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
    cpu0 = {name: cpu_seconds(pid) for name, pid in targets.items()}
    start = time.perf_counter()
    try:
        yield result
    finally:
        result["wall_s"] = round(time.perf_counter() - start, 3)
        for name, pid in targets.items():
            result["cpu_s"][name] = round(cpu_seconds(pid) - cpu0[name], 3)
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


def _requests(sides: Sides) -> dict[str, int]:
    """Requests the gateway served so far, by API key (all versions summed)."""
    by_key: dict[str, int] = collections.Counter()
    for seen, count in ray.get(sides.gateway_actor.stats.remote())["versions"].items():
        by_key[seen.split("/")[0]] += count
    return dict(by_key)


@contextmanager
def served(sides: Sides, result: dict) -> Iterator[None]:
    """The gateway's requests by API key while the block runs, into ``result["requests"]``
    (API keys: 0 produce, 1 fetch, 24 AddPartitionsToTxn, 25 AddOffsetsToTxn, 26 EndTxn,
    28 TxnOffsetCommit)."""
    before = _requests(sides)
    try:
        yield
    finally:
        after = _requests(sides)
        result["requests"] = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}


@contextmanager
def cpu_meter(targets: dict[str, int]) -> Iterator[dict[str, float]]:
    """Each of ``targets``' CPU seconds (user + system) while the block runs."""
    before = {name: cpu_seconds(pid) for name, pid in targets.items()}
    spent: dict[str, float] = {}
    try:
        yield spent
    finally:
        spent.update({name: round(cpu_seconds(pid) - before[name], 3) for name, pid in targets.items()})


def function_table(raw_file: str, top: int = TOP) -> tuple[int, int, list[dict]]:
    """The samples of a py-spy raw file (all, and busy: not waiting, ``IDLE_LEAVES``), and its
    ``top`` functions by self share: each with its self and total share of the busy samples (%),
    a function counted once per sample however deep it recurs. Functions are ``name (file)``
    without line numbers, file shortened to its last two parts."""
    self_n: collections.Counter[str] = collections.Counter()
    total_n: collections.Counter[str] = collections.Counter()
    samples = every = 0
    for line in Path(raw_file).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(frame) for frame in stack.split(";") if not frame.startswith(("process ", "thread "))]
        every += count
        if not frames or frames[-1].startswith(IDLE_LEAVES):
            continue
        samples += count
        self_n[frames[-1]] += count
        for frame in set(frames):
            total_n[frame] += count
    rows = [{"function": f, "self_pct": round(100 * n / samples, 1), "total_pct": round(100 * total_n[f] / samples, 1)}
            for f, n in self_n.most_common(top)] if samples else []
    return every, samples, rows


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
    return {"driver": os.getpid(), **ray_processes()}


def _floor_targets() -> dict[str, int]:
    return {"driver": os.getpid(), **({"kafka-broker": BROKER_PID[0]} if BROKER_PID else {})}


def _produce_consume(sides: Sides, out: Path, messages: int) -> list[dict]:
    results = []
    floor_topic = sides.topic("kafka", "prof-produce")
    with cpu_meter(_floor_targets()) as produce_floor_cpu:
        produce_kafka = _kafka_produce(sides.kafka, floor_topic, messages)
    with cpu_meter(_floor_targets()) as consume_floor_cpu:
        consume_kafka, _ = _kafka_consume(sides.kafka, floor_topic, 1, messages)
    topic = sides.topic("gateway", "prof-produce")
    with sampled("produce", out, processes()) as produce, served(sides, produce):
        produce_gateway = _kafka_produce(sides.gateway, topic, messages)
    produce.update(msgs_per_s=round(messages / produce_gateway), floor_msgs_per_s=round(messages / produce_kafka),
                   floor_cpu_s=produce_floor_cpu, messages=messages,
                   floor="the same confluent-kafka producer on the Kafka broker, just before")
    with sampled("consume", out, processes()) as consume, served(sides, consume):
        consume_gateway, _ = _kafka_consume(sides.gateway, topic, 1, messages)
    consume.update(msgs_per_s=round(messages / consume_gateway), floor_msgs_per_s=round(messages / consume_kafka),
                   floor_cpu_s=consume_floor_cpu, messages=messages,
                   floor="the same confluent-kafka consumer on the Kafka broker, just before")
    results += [produce, consume]
    sides.drop_topics()
    return results


def timed_kafka_eos(bootstrap: str, source: str, sink: str, count: int) -> dict:
    """``bench_peers_clients.kafka_eos_loop`` with each transaction's split: seconds consuming,
    producing the outputs and flushing them, ``send_offsets_to_transaction``, committing; the
    first transaction's seconds apart (a group's first offsets commit may start actors)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"prof-eos-{os.getpid()}-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": work.FETCH_WAIT_MS})
    consumer.subscribe([source])
    producer = work.transactional_producer(bootstrap, "prof-eos")
    split = {"consume_s": 0.0, "produce_s": 0.0, "offsets_s": 0.0, "commit_s": 0.0}
    txns: list[float] = []
    done, start = 0, None
    deadline = time.monotonic() + work.READ_TIMEOUT_S
    try:
        while done < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"exactly-once loop: {done} of {count} inputs in {work.READ_TIMEOUT_S}s")
            t0 = time.perf_counter()
            batch = consumer.consume(min(work.EOS_BATCH, count - done), timeout=0.1)
            if not batch:
                continue
            start = start or t0
            t1 = time.perf_counter()
            producer.begin_transaction()
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"confluent-kafka consumer: {message.error()}")
                work._produce_one(producer, sink, message.value().upper())
            producer.flush(30)
            t2 = time.perf_counter()
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            t3 = time.perf_counter()
            producer.commit_transaction(30)
            t4 = time.perf_counter()
            for key, (a, b) in zip(split, itertools.pairwise((t0, t1, t2, t3, t4)), strict=True):
                split[key] += b - a
            txns.append(t4 - t0)
            done += len(batch)
            deadline = time.monotonic() + work.READ_TIMEOUT_S
    finally:
        consumer.close()
    assert start is not None
    return {"msgs_per_s": round(count / (time.perf_counter() - start)), "txns": len(txns),
            "first_txn_s": round(txns[0], 3), "median_txn_s": round(sorted(txns)[len(txns) // 2], 3),
            **{k: round(v, 3) for k, v in split.items()}}


def _eos(sides: Sides, out: Path, messages: int) -> dict:
    source, sink = sides.topic("kafka", "prof-eos-in"), sides.topic("kafka", "prof-eos-out")
    work.kafka_fill(sides.kafka, source, messages)
    with cpu_meter(_floor_targets()) as floor_cpu:
        floor = timed_kafka_eos(sides.kafka, source, sink, messages)
    source, sink = sides.topic("gateway", "prof-eos-in"), sides.topic("gateway", "prof-eos-out")
    work.kafka_fill(sides.gateway, source, messages)
    with sampled("eos", out, processes()) as eos, served(sides, eos):
        eos.update(timed_kafka_eos(sides.gateway, source, sink, messages))
    sides.drop_topics()
    eos.update(floor_msgs_per_s=floor["msgs_per_s"], kafka=floor, floor_cpu_s=floor_cpu, messages=messages,
               floor="the same confluent-kafka loop on the Kafka broker, just before")
    return eos


def _add_split(split: dict[str, float], *marks: float) -> None:
    for key, (a, b) in zip(("begin_s", "send_s", "flush_s", "commit_s"), itertools.pairwise(marks), strict=True):
        split[key] += b - a


def _split_figures(sent: int, elapsed: float, windows: int, split: dict[str, float]) -> dict:
    return {"msgs_per_s": round(sent / elapsed), "windows": windows, **{k: round(v, 3) for k, v in split.items()},
            "flush_ms_per_window": round(1000 * split["flush_s"] / windows, 1),
            "commit_ms_per_window": round(1000 * split["commit_s"] / windows, 1)}


def timed_native_loop(client: Any, topic: str, seconds: float, transactional: bool) -> dict:
    """``bench_peers_clients.native_loop``'s plain or txn_sync pattern, with each window's split:
    seconds sending (``send_async``), ending (``flush``; ``commit``) and beginning."""
    producer = client.create_producer(topic, batching_max_delay_ms=2)
    split = {"begin_s": 0.0, "send_s": 0.0, "flush_s": 0.0, "commit_s": 0.0}
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
        producer.flush()  # the commit would flush first: timed apart, the rest is the commit's own
        t3 = time.perf_counter()
        if txn is not None:
            txn.commit()
        t4 = time.perf_counter()
        _add_split(split, t0, t1, t2, t3, t4)
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
    split = {"begin_s": 0.0, "send_s": 0.0, "flush_s": 0.0, "commit_s": 0.0}
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
        if producer.flush(30):
            raise RuntimeError("confluent-kafka producer: messages left undelivered after a flush")
        t3 = time.perf_counter()
        if transactional:
            producer.commit_transaction(30)
        t4 = time.perf_counter()
        _add_split(split, t0, t1, t2, t3, t4)
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
            with cpu_meter(_floor_targets()) as kafka_cpu:
                result["kafka"] = timed_kafka_loop(sides.kafka, kafka_topic, seconds, transactional)
            result["kafka"]["cpu_s"] = kafka_cpu
            results.append(result)
            sides.drop_topics()
    return results


def summarize(result: dict) -> dict:
    """Each sampled process's CPU seconds, samples and top functions."""
    tables = {}
    for name, path in result.get("files", {}).items():
        every, busy, rows = function_table(path)
        tables[name] = {"cpu_s": result["cpu_s"].get(name), "samples": every, "busy_samples": busy, "top": rows}
    return {**{k: v for k, v in result.items() if k != "files"}, "profiles": tables}


def markdown(summaries: list[dict], min_busy: int = 20, top: int = 10) -> str:
    """The summaries as markdown: per case its figure beside its floor and each process's CPU
    seconds, then the top functions of each process with at least ``min_busy`` busy samples."""
    lines = []
    for summary in summaries:
        lines.append(f"### {summary['case']}\n")
        figures = {k: v for k, v in summary.items() if k not in ("profiles", "cpu_s", "attach_errors", "case")}
        lines.append("`" + json.dumps(figures) + "`\n")
        lines.append("| process | CPU s | samples | busy samples |\n|---|---:|---:|---:|")
        for name, table in summary["profiles"].items():
            lines.append(f"| {name} | {table['cpu_s']} | {table['samples']} | {table['busy_samples']} |")
        for name, error in summary.get("attach_errors", {}).items():
            lines.append(f"| {name} | py-spy did not attach: {error} | | |")
        for name, table in summary["profiles"].items():
            if table["busy_samples"] < min_busy:
                continue
            lines.append(f"\n{name} (% of {table['busy_samples']} busy samples)\n")
            lines.append("| self % | total % | function |\n|---:|---:|---|")
            lines += [f"| {r['self_pct']} | {r['total_pct']} | `{r['function']}` |" for r in table["top"][:top]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None, progress: Callable[[str], None] = print) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m raytxn.tools.profile_peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results/profiles", help="folder for the raw profiles and profiles.json")
    parser.add_argument("--cases", default="produce,consume,eos,loop")
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--eos-messages", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--loop-rounds", type=int, default=2)
    parser.add_argument("--kafka-bootstrap", default="", help="a running broker instead of starting one")
    parser.add_argument("--markdown", default="", help="only print this profiles.json as markdown tables")
    args = parser.parse_args(argv)
    if args.markdown:
        summaries = json.loads(Path(args.markdown).read_text())
        progress(markdown(summaries))
        return summaries
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = set(args.cases.split(","))
    results: list[dict] = []
    with _broker(args.kafka_bootstrap, BROKER_PID) as bootstrap, running_sides(bootstrap) as sides:
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
    (out / "profiles.md").write_text(markdown(summaries))
    for summary in summaries:
        progress(json.dumps({k: v for k, v in summary.items() if k != "profiles"}))
    progress(f"wrote {out / 'profiles.json'}")
    return summaries


if __name__ == "__main__":
    main()
