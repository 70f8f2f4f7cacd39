"""Scale on one node (``raytxn bench scale``): cheap topics, passivated idle actors, many partitions.

- **Topic creation.** Topics with one subscription each, created in bulk (``create_topics``, 1,000
  a call) and one at a time (``create_topic``), in topics per second. The peer, measured in the
  same run, is a bare Ray actor's creation (what a topic cost when each partition was a process
  from the start).
- **Idle topics.** After creating them, ``touched`` of the topics take one message each (which
  activates the partition), then go idle; the engine passivates them. Reported: the live actors
  and the node's memory once they are idle again, and the live actors sampled over time.
- **Activation.** Each first send to a dormant partition includes its activation: p50/p99, beside
  a bare Ray actor's start (create and first call) in the same run. The first message after
  activation is checked to arrive exactly once (read back through an "earliest" subscription).
- **Many partitions.** Producer throughput of a 64-partition topic against a 4-partition one at
  equal message count (``bench produce``'s plain mode), every partition started beforehand, on an
  engine with the default passivation (the rest of the bench passivates after 2 s idle).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil
import ray

from raytxn.client.rpc import ActorRef
from raytxn.cluster import stop_engine
from raytxn.ids import NAMESPACE, host_actor_name, partition_actor_name
from raytxn.tools.bench import _percentile
from raytxn.tools.bench_produce import PAYLOAD, _engine, _produce

BULK_CHUNK = 1000        # topics per create_topics call
PASSIVATE_IDLE_S = 2.0   # the engine passivates actors idle this long (the default is 300 s)
SAMPLE_EVERY_S = 1.0
PRODUCE_ROUNDS = 3       # rounds of 4 then many partitions; a single run swings 20% here
HOSTS = 2                # hosts of the engine where every topic takes a message
TOUCH_WINDOW = 500       # topics that take their message at once there


@ray.remote(num_cpus=0)
class _Bare:
    """The peer: an actor that does nothing."""

    def ping(self) -> int:
        return 1


def bare_actor_starts(count: int) -> list[float]:
    """Seconds from creating a bare actor to its first answer, one after another, sorted."""
    seconds = []
    for _ in range(count):
        t0 = time.perf_counter()
        actor = _Bare.remote()
        ray.get(actor.ping.remote())
        seconds.append(time.perf_counter() - t0)
        ray.kill(actor)
    return sorted(seconds)


def live_engine_actors() -> int:
    return sum(1 for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE)


def bench_scale(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    topics = 500 if short else 10_000
    touched = 8 if short else 100
    many = 16 if short else 64
    produce_messages = 20_000 if short else 200_000
    client = _engine(passivate_idle_s=PASSIVATE_IDLE_S, watch_interval_s=0.5)
    try:
        base_memory = psutil.virtual_memory().used
        bare = bare_actor_starts(5 if short else 20)
        names = [f"scale-{i}" for i in range(topics)]
        t0 = time.perf_counter()
        for first in range(0, topics, BULK_CHUNK):
            client.create_topics(names[first:first + BULK_CHUNK], 1, subscriptions=["s"])
        bulk_s = time.perf_counter() - t0
        singles = [f"single-{i}" for i in range(50 if short else 200)]
        t0 = time.perf_counter()
        for name in singles:
            client.create_topic(name, 1)
        single_s = time.perf_counter() - t0
        progress(f"  {topics} topics in bulk: {topics / bulk_s:.0f}/s; one at a time {len(singles) / single_s:.0f}/s; "
                 f"a bare actor start p50 {_percentile(bare, 0.5):.2f} s")

        samples: list[list[float]] = []
        began = time.perf_counter()

        def sample() -> None:
            samples.append([round(time.perf_counter() - began, 1), live_engine_actors()])

        producer = client.create_producer(names[0])
        activations = []
        step = max(1, topics // touched)
        chosen = names[::step][:touched]
        for name in chosen:
            producer = client.create_producer(name)
            t0 = time.perf_counter()
            producer.send(PAYLOAD)  # the partition is dormant: this activates it
            activations.append(time.perf_counter() - t0)
            producer.close()
            sample()
        peak = max(n for _, n in samples)
        exactly_once = _read_back(client, chosen[: min(4, len(chosen))])
        deadline = time.perf_counter() + 120
        while live_engine_actors() > client.config.coordinator.num_coordinators + 1 and time.perf_counter() < deadline:
            time.sleep(SAMPLE_EVERY_S)
            sample()
        sample()
        idle_memory = psutil.virtual_memory().used
        progress(f"  activation p50 {_percentile(sorted(activations), 0.5):.2f} s; live actors peak {peak}, "
                 f"idle {samples[-1][1]}; node memory +{(idle_memory - base_memory) / 2**20:.0f} MiB")

        client.close()
        hosted = every_topic_hosted(topics, bare, progress)

        # A fresh engine with the default passivation (300 s idle): this one's 2 s would passivate
        # the partitions started first while the last ones start.
        client = _engine()
        rates: dict[int, list[float]] = {4: [], many: []}
        for partitions in rates:
            topic = f"wide-{partitions}"
            client.create_topic(topic, partitions)
            for p in range(partitions):  # not timed: every partition started before the runs
                ActorRef(partition_actor_name(topic, p)).call("ready")
            _produce(client, topic, produce_messages // 10)  # warm
        for _ in range(PRODUCE_ROUNDS):  # interleaved, so both see the same machine
            for partitions in rates:
                rates[partitions].append(_produce(client, f"wide-{partitions}", produce_messages))
                progress(f"  {partitions} partitions: {rates[partitions][-1]:.0f} msgs/s")
        return [*scale_rows(topics, bulk_s, len(singles), single_s, bare, sorted(activations), exactly_once,
                            peak, samples, base_memory, idle_memory, rates, produce_messages), hosted]
    finally:
        client.close()
        stop_engine()


def every_topic_hosted(topics: int, bare: list[float], progress: Callable[[str], None]) -> dict:
    """Every one of ``topics`` topics takes one message, on an engine with ``HOSTS`` hosts
    (actors/host.py): each send activates a dormant partition inside a host, with no process
    start. ``TOUCH_WINDOW`` topics at a time, each with its own producer. Then they go idle and
    are passivated out of their hosts. The peer: as many bare Ray actor starts, which is what
    the same touches cost with a process per partition (at this run's p50)."""
    client = _engine(passivate_idle_s=PASSIVATE_IDLE_S, watch_interval_s=0.5, actor_hosts=HOSTS)
    try:
        base_memory = psutil.virtual_memory().used
        names = [f"hosted-{i}" for i in range(topics)]
        for first in range(0, topics, BULK_CHUNK):
            client.create_topics(names[first:first + BULK_CHUNK], 1, subscriptions=["s"])
        samples: list[list[float]] = []
        peak_memory = base_memory
        began = time.perf_counter()
        for first in range(0, topics, TOUCH_WINDOW):
            producers = [client.create_producer(name) for name in names[first:first + TOUCH_WINDOW]]
            for producer in producers:
                producer.send_async(PAYLOAD)  # the partition is dormant: this activates it
            for producer in producers:
                producer.flush()
                producer.close()
            hosted_now = _hosted_count()
            samples.append([round(time.perf_counter() - began, 1), hosted_now])
            peak_memory = max(peak_memory, psutil.virtual_memory().used)
        touch_s = time.perf_counter() - began
        progress(f"  hosted: {topics} topics took a message in {touch_s:.0f} s ({topics / touch_s:.0f}/s), "
                 f"at most {max(n for _, n in samples)} actors hosted at once")
        step = max(1, topics // 20)
        exactly_once = _read_back(client, names[::step][:20])
        deadline = time.perf_counter() + 600
        while (hosted_now := _hosted_count()) and time.perf_counter() < deadline:
            samples.append([round(time.perf_counter() - began, 1), hosted_now])
            time.sleep(SAMPLE_EVERY_S)
        samples.append([round(time.perf_counter() - began, 1), hosted_now])
        idle_memory = psutil.virtual_memory().used
        live = live_engine_actors()
        progress(f"  hosted, idle: {live} live actors, {hosted_now} hosted; "
                 f"node memory +{(idle_memory - base_memory) / 2**20:.0f} MiB")
        return hosted_row(topics, touch_s, bare, exactly_once, samples, live, base_memory, peak_memory, idle_memory)
    finally:
        client.close()


def _hosted_count() -> int:
    """Actors the bench engine's hosts serve now."""
    return sum(ActorRef(host_actor_name(i)).call("ready")["hosted"] for i in range(HOSTS))


def hosted_row(topics: int, touch_s: float, bare: list[float], exactly_once: bool, samples: list[list[float]],
               live: int, base_memory: int, peak_memory: int, idle_memory: int) -> dict:
    """``samples``: [seconds, actors hosted] over the run, the last one once idle."""
    bare_p50 = _percentile(bare, 0.5)
    return {"bench": "scale", "case": "every topic took a message, hosted", "topics": topics, "hosts": HOSTS,
            "seconds": round(touch_s, 1), "topics_touched_per_s": round(topics / touch_s, 1),
            "bare_actor_starts_per_s": round(1 / bare_p50, 2),
            "touches_over_actor_starts": round(topics / touch_s * bare_p50, 1),
            "first_message_exactly_once": exactly_once,
            "hosted_peak": max(n for _, n in samples), "hosted_idle": samples[-1][1], "live_actors_idle": live,
            "node_memory_used_mb": round(idle_memory / 2**20),
            "memory_added_peak_mb": round((peak_memory - base_memory) / 2**20),
            "memory_added_idle_mb": round((idle_memory - base_memory) / 2**20),
            "hosted_over_time": samples}


def _read_back(client: Any, names: list[str]) -> bool:
    """Whether each topic's one message reaches its "earliest" subscription exactly once."""
    from raytxn.errors import Timeout

    for name in names:
        consumer = client.subscribe(name, "s")
        got = [consumer.receive(timeout=30).value()]
        try:
            got.append(consumer.receive(timeout=0.5).value())
        except Timeout:
            pass
        consumer.close()
        if got != [PAYLOAD]:
            return False
    return True


def scale_rows(topics: int, bulk_s: float, singles: int, single_s: float, bare: list[float],
               activations: list[float], exactly_once: bool, peak: int, samples: list[list[float]],
               base_memory: int, idle_memory: int, rates: dict[int, list[float]], messages: int) -> list[dict]:
    """``bare`` and ``activations``: sorted seconds; ``rates``: msgs/s of each round, by partitions.
    The ratio is of the best rounds (as the other benches' "best of N"), and each round's own
    ratio is listed beside it."""
    bare_p50 = _percentile(bare, 0.5)
    few, many = sorted(rates)
    per_round = sorted(m / f for f, m in zip(rates[few], rates[many], strict=True))
    return [
        {"bench": "scale", "case": "topic creation", "topics": topics,
         "bulk_topics_per_s": round(topics / bulk_s, 1), "single_topics_per_s": round(singles / single_s, 1),
         "bare_actor_starts_per_s": round(1 / bare_p50, 2),
         "bulk_over_actor_starts": round(topics / bulk_s * bare_p50, 1),
         "single_over_actor_starts": round(singles / single_s * bare_p50, 1)},
        {"bench": "scale", "case": "idle topics", "topics": topics, "touched": len(activations),
         "live_actors_peak": peak, "live_actors_idle": samples[-1][1] if samples else 0,
         "node_memory_used_mb": round(idle_memory / 2**20),
         "memory_added_mb": round((idle_memory - base_memory) / 2**20),
         "live_actors_over_time": samples},
        {"bench": "scale", "case": "activation of a dormant partition", "activations": len(activations),
         "p50_s": round(_percentile(activations, 0.5), 3), "p99_s": round(_percentile(activations, 0.99), 3),
         "bare_actor_start_p50_s": round(bare_p50, 3),
         "p50_over_bare_start": round(_percentile(activations, 0.5) / bare_p50, 2),
         "first_message_exactly_once": exactly_once},
        {"bench": "scale", "case": f"produce, {many} partitions against {few}", "messages": messages,
         "rounds": len(per_round), f"msgs_per_s_{few}p": round(max(rates[few])),
         f"msgs_per_s_{many}p": round(max(rates[many])),
         "many_over_few": round(max(rates[many]) / max(rates[few]), 3),
         "many_over_few_median_round": round(per_round[len(per_round) // 2], 3),
         "many_over_few_rounds": [round(r, 3) for r in per_round]},
    ]
