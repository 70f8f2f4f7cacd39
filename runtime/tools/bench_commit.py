"""Commit latency as a user sees it (``raytxn bench commit``): ``new_transaction()``, one
synchronous ``send`` of 100 B, ``commit()``, one after another from one thread, on one partition.

The anchor, measured in the same run, is the floor of that path on this machine: a bare Ray
actor call from the driver that fsyncs a small file before answering (the ceiling's
``CeilingSink`` with a one-message batch). A lazy begin costs nothing, the send is one
coordinator call (begin and register, one log write) and one append, and the commit one
coordinator call that logs COMMITTING and waits for the partition's marker (its last record is
logged after the answer, sharing the put of the next commit's entry: ``complete_linger_ms``). Every
latency is also reported as a multiple of the anchor's p50.

The floor, measured in rounds between the engine's, is the same path on bare actors: the same
four Ray calls and three durable puts, in the same order, with nothing else
(``bench_commit_floor``). Its p50 is the least this design's three durable steps take here; the
engine's p50 over the floor's is what the engine's own code adds. The lazy begin's row has a floor
of its own, which begins each txn with a call and a put before its send (five calls, four puts).

The floor's parts, measured beside it: a bare call to one of its async actors (the engine's kind,
no put), and one durable step (its send: a call whose actor puts one object before answering).
Beside the anchor (a threaded actor appending to an open file) they show what this design's
choices cost a step here: an asyncio actor's loop hop, and a put that creates an object (file,
fsync, link, directory fsync) where the anchor appends; and the floor is about three such steps
(the lazy one four).

A second engine answers commits once logged (``commit_answer="logged"``, Kafka's EndTxn): its
commit waits for COMMITTING's put only, and the partition's marker follows. It is measured in
rounds beside a floor that answers the same way."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import ray

from raytxn.cluster import stop_engine
from raytxn.tools.bench import _percentile
from raytxn.tools.bench_ceiling import CeilingSink
from raytxn.tools.bench_commit_floor import CommitFloor, call_latencies
from raytxn.tools.bench_produce import PAYLOAD, _engine

if TYPE_CHECKING:
    from raytxn.client.client import Client
    from raytxn.client.producer import Producer


def measure_fsync_round_trip(calls: int) -> list[float]:
    """Sorted latencies (ms) of ``calls`` sequential durable-write calls to a bare actor."""
    with tempfile.TemporaryDirectory(prefix="raytxn-commit-anchor-") as directory:
        echo = CeilingSink.remote(os.path.join(directory, "echo.bin"))  # fsyncs before answering
        ray.get(echo.ingest.remote([b"warm"]))
        latencies = call_latencies(lambda: ray.get(echo.ingest.remote([PAYLOAD])), calls)
        ray.kill(echo)
    return sorted(latencies)


def bench_commit(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """p50/p99 of (begin, 1 send, commit), and of its send and commit parts, beside the anchor:
    with each commit beginning the next txn (runtime/client/txn_chain.py, on by default) and
    without, in rounds that alternate, so that both see the same machine; then chained on an
    engine that answers commits once logged, beside its own floor."""
    txns = 200 if short else 2000
    rows = _commit_rows(txns, "applied", (True, False), progress)
    rows[0]["p50_over_lazy"] = round(rows[0]["p50_ms"] / rows[1]["p50_ms"], 3)
    return rows + _commit_rows(txns, "logged", (True,), progress)


def _commit_rows(txns: int, commit_answer: str, chains: tuple[bool, ...],
                 progress: Callable[[str], None]) -> list[dict]:
    """On a fresh engine answering commits ``commit_answer``: a row per begin in ``chains``
    (chained, lazy; chained among them), measured in 10 rounds alternating with a floor that
    begins and answers the same way."""
    client = _engine(commit_answer=commit_answer)
    try:
        producer = warm_txn_producer(client, f"bench-commit-{commit_answer}", 20)
        anchor = measure_fsync_round_trip(txns)
        # each begin beside its own floor: a lazy one puts the txn's begin before its send
        floors = {chain: CommitFloor(answer_at_log=commit_answer == "logged", lazy=not chain) for chain in chains}
        for floor in floors.values():
            floor.run(20)  # warm
        measured: dict[bool, tuple[list[float], list[float], list[float]]] = {chain: ([], [], []) for chain in chains}
        floor_whole: dict[bool, list[float]] = {chain: [] for chain in chains}
        floor_steps: list[float] = []  # the chained floor's sends: one call, one put
        rounds = 10
        for _ in range(rounds):
            for chain in chains:
                client.txn_chain.enabled = chain
                _time_txns(client, producer, txns // rounds, *measured[chain])
                whole, sends, _ = floors[chain].run(txns // rounds)
                floor_whole[chain] += whole
                if chain:
                    floor_steps += sends
        async_calls = floors[True].bare_call_latencies(txns)
        client.txn_chain.enabled = client.config.coordinator.chain_begin
        floor_puts_per_txn = {chain: floor.puts_per_txn() for chain, floor in floors.items()}
        for floor in floors.values():
            floor.close()
        parts = FloorParts(sorted(async_calls), sorted(floor_steps))
        rows = []
        for chain in chains:
            whole, sends, commits = (sorted(xs) for xs in measured[chain])
            row = commit_row(txns, whole, sends, commits, anchor, sorted(floor_whole[chain]),
                             floor_puts_per_txn[chain], chain, commit_answer, parts)
            rows.append(row)
            progress(f"  {'chained' if chain else 'lazy'}, answered once {commit_answer}: begin+send+commit p50 "
                     f"{row['p50_ms']} ms, p99 {row['p99_ms']} ms (send p50 {row['send_p50_ms']}, commit p50 "
                     f"{row['commit_p50_ms']}); durable actor call p50 {row['anchor_p50_ms']} ms: p50 = "
                     f"{row['p50_over_anchor']}x; the same path on bare actors p50 {row['floor_p50_ms']} ms: "
                     f"p50 = {row['p50_over_floor']}x (a bare async call p50 {row['async_call_p50_ms']} ms, one "
                     f"durable step {row['floor_step_p50_ms']} ms: the floor is {row['floor_over_step']} steps)")
        return rows
    finally:
        client.close()
        stop_engine()


def warm_txn_producer(client: Client, topic: str, warm_txns: int) -> Producer:
    """A new one-partition ``topic`` and a producer sending at once (no linger), warmed by
    ``warm_txns`` txns of one send: actors started, refs looked up."""
    client.create_topic(topic, 1)
    producer = client.create_producer(topic, batching_max_delay_ms=0)
    for _ in range(warm_txns):
        with client.transaction(timeout=60) as txn:
            producer.send(PAYLOAD, txn=txn)
    return producer


def _time_txns(client: Client, producer: Producer, txns: int, whole: list[float], sends: list[float],
               commits: list[float]) -> None:
    for _ in range(txns):
        t0 = time.perf_counter()
        txn = client.new_transaction(timeout=60)
        producer.send(PAYLOAD, txn=txn)
        t1 = time.perf_counter()
        txn.commit()
        t2 = time.perf_counter()
        whole.append((t2 - t0) * 1000)
        sends.append((t1 - t0) * 1000)
        commits.append((t2 - t1) * 1000)


class FloorParts(NamedTuple):
    """Sorted latencies (ms) of the floor's parts: ``async_calls``, bare calls to one of its async
    actors; ``steps``, its durable steps (a call whose actor puts one object)."""

    async_calls: list[float]
    steps: list[float]


def commit_row(txns: int, whole: list[float], sends: list[float], commits: list[float],
               anchor: list[float], floor: list[float], floor_puts_per_txn: float, chained: bool = True,
               commit_answer: str = "applied", parts: FloorParts | None = None) -> dict:
    """All latency lists sorted, in ms. ``floor``: the same path's on bare actors, which made
    ``floor_puts_per_txn`` durable puts a txn; ``commit_answer``: when the engine (and the floor)
    answered commits; ``parts``: the floor's parts, if measured."""
    anchor_p50 = _percentile(anchor, 0.5)
    floor_p50, floor_p99 = _percentile(floor, 0.5), _percentile(floor, 0.99)
    row = {"bench": "commit", "case": "new_transaction, 1 send of 100 B, commit", "txns": txns,
           "begin": "chained" if chained else "lazy", "commit_answer": commit_answer,
           "p50_ms": round(_percentile(whole, 0.5), 3), "p99_ms": round(_percentile(whole, 0.99), 3),
           "send_p50_ms": round(_percentile(sends, 0.5), 3), "commit_p50_ms": round(_percentile(commits, 0.5), 3),
           "commit_p99_ms": round(_percentile(commits, 0.99), 3),
           "anchor_p50_ms": round(anchor_p50, 3), "anchor_p99_ms": round(_percentile(anchor, 0.99), 3),
           "p50_over_anchor": round(_percentile(whole, 0.5) / anchor_p50, 2),
           "p99_over_anchor": round(_percentile(whole, 0.99) / anchor_p50, 2),
           "floor_p50_ms": round(floor_p50, 3), "floor_p99_ms": round(floor_p99, 3),
           "floor_puts_per_txn": round(floor_puts_per_txn, 2),
           "p50_over_floor": round(_percentile(whole, 0.5) / floor_p50, 2),
           "p99_over_floor": round(_percentile(whole, 0.99) / floor_p99, 2)}
    if parts is not None:
        step_p50 = _percentile(parts.steps, 0.5)
        row |= {"async_call_p50_ms": round(_percentile(parts.async_calls, 0.5), 3),
                "floor_step_p50_ms": round(step_p50, 3),
                "floor_step_over_anchor": round(step_p50 / anchor_p50, 2),
                "floor_over_step": round(floor_p50 / step_p50, 2)}
    return row
