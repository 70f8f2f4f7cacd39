"""Exactly-once Spark-on-Ray pipelines (real Spark through RayDP, real engine): the output always
equals the word count computed independently in plain Python, across a failed task attempt, an
executor killed, a partition actor crash during the write, a coordinator crash during commit, and a
driver stopped mid-batch and replaced, with no free Ray CPU, the old one fenced."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import raytxn as rt
from raytxn.connectors.dedup import dedup_window_spark, expected_dedup, passed_keys, sample_events
from raytxn.connectors.spark import ExactlyOncePipeline, read_batch
from raytxn.connectors.wordcount import expected_counts, running_wordcount_spark, sample_lines, total_counts, wordcount
from raytxn.ids import coordinator_actor_name
from tests.docs_blocks import PYTHON_PAGES, page_name, program_seconds, uses_spark
from tests.engine import engine_client
from tests.integration.test_docs import run_page_program

pytestmark = [pytest.mark.ray, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


# First in the module: a docs page's Spark program starts its own engine and Spark, so it runs
# before this module's engine and Spark exist (one Spark per Ray namespace), and never beside
# another Spark's start (tests/docs_blocks.py, uses_spark).
@pytest.mark.parametrize("page", [pytest.param(p, id=page_name(p), marks=pytest.mark.slow(seconds=program_seconds(p)))
                                  for p in PYTHON_PAGES if uses_spark(p)])
def test_docs_spark_page_runs(page: Path, ray_session: object, tmp_path: Path) -> None:
    run_page_program(page, ray_session, tmp_path)


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    from raytxn.config import SubscriptionConfig

    yield from engine_client(tmp_path_factory, subscription=SubscriptionConfig(consumer_timeout_s=3.0))


def setup_topics(client: rt.Client, lines: list[str]) -> tuple[str, str]:
    run = uuid.uuid4().hex[:6]
    source, sink = f"lines-{run}", f"counts-{run}"
    client.create_topic(source, 2)
    client.create_topic(sink, 2)
    # Batches are cut at entry boundaries (a producer batch is one entry, never split), so small
    # producer batches let the pipelines' 50-row micro-batches come out near 50 rows.
    producer = client.create_producer(source, batching_max_messages=5)
    for i, line in enumerate(lines):
        producer.send_async(line.encode(), key=str(i))
    producer.flush()
    return source, sink


def pipeline(spark, client: rt.Client, source: str, sink: str, **kwargs) -> ExactlyOncePipeline:
    return ExactlyOncePipeline(spark, client, source, "wc", sink, wordcount, f"wc-{source}",
                               batch_max_messages=kwargs.pop("batch_max_messages", 50), **kwargs)


def test_read_batch_columns_and_ack_handle(client: rt.Client, spark) -> None:
    source, _sink = setup_topics(client, ["a b", "c"])
    df, handle = read_batch(spark, client, source, "peek", max_messages=10)
    assert set(df.columns) == {"key", "value", "properties", "event_time", "publish_time", "topic", "partition",
                               "message_id"}
    assert sorted(bytes(r.value).decode() for r in df.collect()) == ["a b", "c"] and handle.count >= 1
    assert handle.rows_read() == 2
    handle.close()  # not acknowledged: the same range comes back
    df2, handle2 = read_batch(spark, client, source, "peek", max_messages=None)
    assert sorted(r.message_id for r in df2.collect()) == sorted(r.message_id for r in df.collect())
    with client.transaction() as txn:
        handle2.acknowledge(txn)
    handle2.close()
    _df3, handle3 = read_batch(spark, client, source, "peek", max_messages=10, wait_s=0.5)
    assert handle3.count == 0  # acknowledged in a committed txn: gone
    handle3.close()


def test_a_batch_is_read_by_one_python_task_per_slot_with_no_python_before_it(client: rt.Client, spark) -> None:
    """The session has one executor core: a batch of many chunks is read by one task, and no
    Python worker runs before it (its input, the chunks' indexes, comes from the JVM)."""
    from raytxn.connectors.spark import task_slots

    source, _sink = setup_topics(client, [f"line {i}" for i in range(40)])  # 5-message entries
    df, handle = read_batch(spark, client, source, "slots", max_messages=None, chunk_entries=1)
    try:
        assert task_slots(spark) == 1 < spark.sparkContext.defaultParallelism
        assert len(handle.chunks) >= 8  # one entry a chunk
        assert df.rdd.getNumPartitions() == 1
        lineage = df._jdf.queryExecution().toRdd().toDebugString()
        assert "PythonRDD" not in lineage, lineage
        assert sorted(bytes(r.value).decode() for r in df.collect()) == sorted(f"line {i}" for i in range(40))
        assert handle.rows_read() == 40
    finally:
        handle.close()


def test_wordcount_exactly_once(client: rt.Client, spark) -> None:
    lines = sample_lines(200)
    source, sink = setup_topics(client, lines)
    stats = pipeline(spark, client, source, sink).run(until_idle=True, progress=False)
    assert sum(s.rows_in for s in stats) == 200 and len(stats) >= 4
    assert total_counts(client, sink, "check") == expected_counts(lines)


def test_failed_task_attempt_is_retried_without_duplicates(client: rt.Client, spark) -> None:
    lines = sample_lines(120)
    source, sink = setup_topics(client, lines)
    failures = []

    def fail_once(spark_partition: int, attempt: int, rows_sent: int) -> None:
        if attempt == 0 and spark_partition == 0 and not failures:
            failures.append(spark_partition)  # (runs in the Spark worker; the list is its copy)
            raise RuntimeError("injected failure of a write task")

    stats = pipeline(spark, client, source, sink, write_fault=fail_once).run(until_idle=True, progress=False)
    assert sum(s.rows_in for s in stats) == 120
    assert total_counts(client, sink, "check") == expected_counts(lines)


def test_a_commit_failing_while_the_next_batch_runs_sends_both_ranges_out_again(
        client: rt.Client, spark, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch commits while the next one is leased, read and written, its ranges chained
    behind the committing ones. When that commit fails (here: its txn aborted a second after the
    commit was sent, as when the coordinator refuses it), the next batch's held acks are refused,
    it aborts too, and both ranges go out again: the output is still exactly once."""
    from raytxn.connectors import spark_pipeline

    lines = sample_lines(200)
    source, sink = setup_topics(client, lines)
    failed: list[str] = []
    commit = spark_pipeline._timed_commit

    def fail_one_commit(txn: rt.Transaction) -> float:
        if not failed and txn.id.sequence % 3 == 1:  # some batch past the first few
            failed.append(str(txn.id))
            time.sleep(1.0)  # the next batch leases its chained ranges meanwhile
            txn.abort()
            raise rt.errors.TransactionAlreadyAborted(f"{txn.id}: aborted before its commit (injected)")
        return commit(txn)

    monkeypatch.setattr(spark_pipeline, "_timed_commit", fail_one_commit)
    stats = pipeline(spark, client, source, sink).run(until_idle=True, progress=False)
    assert failed, "no commit failed"
    assert failed[0] not in {s.txn for s in stats}
    assert any(s.attempt > 0 for s in stats), "the batch behind the failed commit was not tried again"
    assert sum(s.rows_in for s in stats) == 200
    assert total_counts(client, sink, "check") == expected_counts(lines)


def test_partition_crash_during_write_and_coordinator_crash_during_commit(client: rt.Client, spark) -> None:
    lines = sample_lines(150)
    source, sink = setup_topics(client, lines)
    client.faults.arm("partition.after_append_before_reply", "crash", topic=sink, times=1)
    for tc in range(client.config.coordinator.num_coordinators):
        client.faults.arm("coordinator.after_log_committing", "crash", actor=coordinator_actor_name(tc))
    stats = pipeline(spark, client, source, sink).run(until_idle=True, progress=False)
    assert sum(s.rows_in for s in stats) == 150
    assert total_counts(client, sink, "check") == expected_counts(lines)
    restarted = [r for r in client.health()["actors"] if r["restarts"] > 0]
    assert any(r["kind"] == "coordinator" for r in restarted), "no coordinator crashed"


@pytest.mark.extended
def test_executor_killed_mid_run(client: rt.Client, spark) -> None:
    lines = sample_lines(150)
    source, sink = setup_topics(client, lines)
    killed = []

    def kill_executor(batch: int) -> None:
        if batch == 1 and not killed:
            executors = [a for a in ray.util.list_named_actors(all_namespaces=True)
                         if a["name"].startswith("raydp-executor-")]
            assert executors, "no RayDP executor actor found"
            ray.kill(ray.get_actor(executors[0]["name"], namespace=executors[0]["namespace"]), no_restart=False)
            killed.append(executors[0]["name"])

    stats = pipeline(spark, client, source, sink, before_commit=kill_executor).run(until_idle=True, progress=False)
    assert killed, "the executor was never killed"
    assert sum(s.rows_in for s in stats) == 150
    assert total_counts(client, sink, "check") == expected_counts(lines)


def _driver(address: str, pipeline_id: str, source: str, sink: str, pause: float, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("driver_run.py")), "--address", address,
                             "--pipeline", pipeline_id, "--source", source, "--sink", sink, "--pause", str(pause),
                             *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _wait_line(proc: subprocess.Popen, prefix: str, timeout_s: float = 240) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    seen = []
    # Matched anywhere in the line (a stray log fragment may precede it), not as a prefix of a
    # longer number ("COMMITTING 1" is not "COMMITTING 12").
    pattern = re.compile(re.escape(prefix) + r"(?!\d)")
    for line in proc.stdout:
        if pattern.search(line):
            return line[pattern.search(line).start():]
        seen.append(line)
        assert time.monotonic() < deadline, f"no {prefix!r} line"
    raise AssertionError(f"driver exited ({proc.wait()}) before printing {prefix!r}:\n{''.join(seen[-40:])}")


@ray.remote(num_cpus=0)
class _CpuHolder:
    """Holds the Ray CPUs it was created with, so that nothing else can be scheduled on them."""

    def ready(self) -> bool:
        return True


@pytest.mark.extended
@pytest.mark.slow(seconds=70)
@pytest.mark.timeout(900)
def test_driver_stopped_replaced_with_no_free_cpu_and_fenced(client: rt.Client, spark) -> None:
    """A driver process hangs mid-batch (output written, not committed); a successor takes the
    pipeline over and finishes it while every free Ray CPU is taken (the read path needs none:
    tasks read storage, writes call actors); the old driver wakes up, tries to commit and is
    fenced. The successor is this process, on the module's Spark (a second Spark driver process
    took CI two to five minutes: each is three JVMs); a placeholder actor holds the free CPUs."""
    lines = sample_lines(200)
    source, sink = setup_topics(client, lines)
    address = ray.get_runtime_context().gcs_address
    pipeline_id = f"wc-driver-{source}"
    zombie = _driver(address, pipeline_id, source, sink, pause=2.0)
    holder = None
    try:
        _wait_line(zombie, "COMMITTING")
        os.kill(zombie.pid, signal.SIGSTOP)  # the driver hangs mid-batch: output written, not committed
        free = ray.available_resources().get("CPU", 0)
        if free > 0:
            holder = _CpuHolder.options(num_cpus=free).remote()
            assert ray.get(holder.ready.remote(), timeout=60)
        assert ray.available_resources().get("CPU", 0) == 0
        stats = ExactlyOncePipeline(spark, client, source, "wc", sink, wordcount, pipeline_id,
                                    batch_max_messages=200).run(until_idle=True, progress=False)
        assert sum(s.rows_in for s in stats) == len(lines)  # everything, the hung driver's range too
        os.kill(zombie.pid, signal.SIGCONT)  # the old driver wakes up and tries to commit: fenced
        rest, _ = zombie.communicate(timeout=120)
        assert zombie.returncode == 3, rest[-3000:]  # exit code 3: stopped by Fenced
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGCONT)
            zombie.kill()
        if holder is not None:
            ray.kill(holder)
    assert total_counts(client, sink, "check") == expected_counts(lines)


@pytest.mark.extended  # the suite's 30 minutes are spent; its pipelines run one subscription each
def test_two_pipelines_on_two_subscriptions_of_one_topic(client: rt.Client, spark) -> None:
    lines = sample_lines(100)
    source, sink = setup_topics(client, lines)
    other_sink = f"{sink}-other"
    client.create_topic(other_sink, 2)
    # Three Spark batches in all (each costs seconds under CI load): first's half, second's whole,
    # first's other half.
    first = ExactlyOncePipeline(spark, client, source, "wc-a", sink, wordcount, f"a-{source}", batch_max_messages=50)
    second = ExactlyOncePipeline(spark, client, source, "wc-b", other_sink, wordcount, f"b-{source}",
                                 batch_max_messages=100)
    first.run(max_batches=1, progress=False)
    second.run(until_idle=True, progress=False)  # interleaved: each subscription keeps its own cursor
    first.run(until_idle=True, progress=False)
    for pipeline, out in ((first, sink), (second, other_sink)):
        assert sum(s.rows_in for s in pipeline.stats) == 100
        assert total_counts(client, out, "check") == expected_counts(lines)


@pytest.mark.extended  # the suite's budget (27 s); the lease tests of test_leases.py stay
def test_a_stalled_pipelines_lease_expires_and_its_range_is_committed_once(client: rt.Client, spark) -> None:
    """Pipeline A stalls while transforming its first batch, past its lease's timeout; pipeline
    B on the same subscription gets the range and commits it. A's acknowledge is refused, so its
    commit fails, and on retry it goes on from where B left off: every line counted once."""
    lines = sample_lines(100)
    source, sink = setup_topics(client, lines)
    stalled: list[int] = []

    def stall_once(df):
        if not stalled:
            stalled.append(1)
            time.sleep(2.0)  # past A's lease timeout
            other.run(until_idle=True, progress=False)  # B takes the range over and commits everything
        return wordcount(df)

    other = ExactlyOncePipeline(spark, client, source, "wc", sink, wordcount, f"b-{source}", batch_max_messages=30,
                                lease_timeout_s=30)
    stuck = ExactlyOncePipeline(spark, client, source, "wc", sink, stall_once, f"a-{source}", batch_max_messages=30,
                                lease_timeout_s=1.0)
    stuck.run(until_idle=True, progress=False)
    assert stalled and sum(s.rows_in for s in other.stats) == 100 and stuck.stats == []
    # A wrote its batch's counts in its txn before its acknowledge was refused: had it committed,
    # they would be counted twice.
    assert total_counts(client, sink, "check") == expected_counts(lines)


def latest_values(client: rt.Client, topic: str) -> dict[str, bytes]:
    """Each live key's latest committed value, folded from ``read_compacted`` (independent of
    the pipeline's own state read)."""
    latest: dict[str, bytes | None] = {}
    for p in range(client.get_topic(topic)["partitions"]):
        for record in client.read_compacted(topic, p):
            latest[record["key"]] = record["value"]
    return {key: value for key, value in latest.items() if value}


def stateful(spark, client: rt.Client, source: str, sink: str, transform, **kwargs) -> ExactlyOncePipeline:
    state = f"state-{source}"
    client.create_topic(state, 2, compacted=True)
    return ExactlyOncePipeline(spark, client, source, "wc", sink, transform, f"st-{source}", batch_max_messages=40,
                               state_topic=state, **kwargs)


def test_keyed_state_keeps_running_totals_exactly_once_across_an_aborted_batch(client: rt.Client, spark) -> None:
    """Running word totals kept in a compacted state topic: batch 1's first attempt wrote its
    output and its state updates and then failed before its commit; had its aborted updates been
    read by its retry, or a batch not read its predecessor's, the totals would be off."""
    lines = sample_lines(80)
    source, sink = setup_topics(client, lines)
    failed: list[int] = []

    def fail_once(batch: int) -> None:
        if batch == 1 and not failed:
            failed.append(batch)
            raise RuntimeError("injected failure before batch 1's commit")

    pipe = stateful(spark, client, source, sink, running_wordcount_spark, before_commit=fail_once)
    assert pipe.overlap_commits is False  # each batch reads the state its predecessor committed
    stats = pipe.run(until_idle=True, progress=False)
    assert failed and sum(s.rows_in for s in stats) == 80 and len(stats) >= 2
    assert [s.attempt for s in stats if s.attempt] == [1] and all(s.state_updates > 0 for s in stats)
    expected = {word: str(n).encode() for word, n in expected_counts(lines).items()}
    assert latest_values(client, pipe.state_topic) == expected
    assert latest_values(client, sink) == expected  # the output's last total per word, too


def test_a_null_state_value_deletes_the_key(client: rt.Client, spark) -> None:
    from pyspark.sql import functions as F

    lines = sample_lines(60)
    source, sink = setup_topics(client, lines)

    def totals_forgetting_beta(df, state):
        totals, _ = running_wordcount_spark(df, state)
        updates = totals.select("key", F.when(F.col("key") == "beta", F.lit(None)).otherwise(F.col("value"))
                                .alias("value"))
        return totals, updates

    pipe = stateful(spark, client, source, sink, totals_forgetting_beta)
    stats = pipe.run(until_idle=True, progress=False)
    assert sum(s.rows_in for s in stats) == 60 and len(stats) >= 2
    expected = {word: str(n).encode() for word, n in expected_counts(lines).items() if word != "beta"}
    assert latest_values(client, pipe.state_topic) == expected
    beta = [r for p in range(2) for r in client.read_compacted(pipe.state_topic, p) if r["key"] == "beta"]
    assert beta and all(r["value"] is None for r in beta)  # written, as tombstones


def send_events(client: rt.Client, topic: str, events: list[tuple[str, int]]) -> None:
    producer = client.create_producer(topic, batching_max_messages=5)
    for key, event_time in events:
        producer.send_async(f"payload of {key} at {event_time}".encode(), key=key, event_time=event_time)
    producer.flush()


@pytest.mark.extended  # 73 s: the suite's Spark module was the longest worker's (the keyed-state test stays)
@pytest.mark.slow(seconds=75)
def test_a_dedup_window_passes_each_event_once_across_an_aborted_batch(client: rt.Client, spark) -> None:
    """The per-key dedup window (``raytxn.connectors.dedup``): repeats within the window dropped,
    repeats three windows later passed again, exactly as the plain-Python rule says, though batch 1
    wrote its output and its seen ids and then aborted (had its retry read them, its events would
    be dropped as their own duplicates); ids not seen for a window are forgotten (tombstones)."""
    window_ms = 20_000
    events = sample_events(240, window_ms)
    run = uuid.uuid4().hex[:6]
    source, sink = f"events-{run}", f"unique-{run}"
    client.create_topic(source, 2)
    client.create_topic(sink, 2)
    send_events(client, source, events)
    failed: list[int] = []

    def fail_once(batch: int) -> None:
        if batch == 1 and not failed:
            failed.append(batch)
            raise RuntimeError("injected failure before batch 1's commit")

    pipe = stateful(spark, client, source, sink, dedup_window_spark(window_ms), before_commit=fail_once)
    stats = pipe.run(until_idle=True, progress=False)
    assert failed and sum(s.rows_in for s in stats) == len(events) and len(stats) >= 3
    passed = passed_keys(client, sink, "check")
    expected = expected_dedup(events, window_ms)
    assert passed == expected and sum(expected.values()) < len(events) and max(expected.values()) > 1
    state = latest_values(client, pipe.state_topic)
    last_seen = {key: event_time for key, event_time in events}  # each id's last occurrence
    assert all(int(value.split(b",")[0]) == last_seen[key] for key, value in state.items())
    assert 0 < len(state) < len(last_seen) // 2, "ids a window old were not forgotten"
    tombstones = [r for p in range(2) for r in client.read_compacted(pipe.state_topic, p) if r["value"] is None]
    assert tombstones, "forgotten ids leave tombstones in the state topic"



def test_bad_state_settings_are_refused(client: rt.Client, spark) -> None:
    run = uuid.uuid4().hex[:6]
    source, sink, plain, state = (f"{name}-{run}" for name in ("src", "out", "plain", "state"))
    for topic in (source, sink, plain):
        client.create_topic(topic, 1)
    client.create_topic(state, 1, compacted=True)

    def make(**kwargs) -> ExactlyOncePipeline:
        return ExactlyOncePipeline(spark, client, source, "s", sink, running_wordcount_spark, f"bad-{run}", **kwargs)

    for kwargs, message in [({"state_topic": plain}, "not compacted"), ({"state_topic": source}, "of its own"),
                            ({"state_topic": sink}, "of its own"),
                            ({"state_topic": state, "exactly_once": False}, "exactly_once")]:
        with pytest.raises(rt.errors.InvalidArgument, match=message):
            make(**kwargs)
    with pytest.raises(rt.errors.TopicNotFound):
        make(state_topic=f"missing-{run}")
    assert make(state_topic=state).overlap_commits is False
    assert make().overlap_commits is True  # no state: commits overlap as before


def restarts(client: rt.Client, kind: str, name_part: str = "") -> int:
    return sum(r["restarts"] for r in client.health()["actors"] if r["kind"] == kind and name_part in r["name"])


@pytest.mark.extended  # the suite's keyed-state test aborts a batch; this one crashes actors in its commit
def test_keyed_state_survives_a_state_partition_crash_and_a_coordinator_crash_during_commit(
        client: rt.Client, spark) -> None:
    lines = sample_lines(80)
    source, sink = setup_topics(client, lines)
    pipe = stateful(spark, client, source, sink, running_wordcount_spark)
    coordinators_before = restarts(client, "coordinator")
    state_before = restarts(client, "partition", pipe.state_topic)
    client.faults.arm("partition.after_append_before_reply", "crash", topic=pipe.state_topic, times=1)
    for tc in range(client.config.coordinator.num_coordinators):
        client.faults.arm("coordinator.after_log_committing", "crash", actor=coordinator_actor_name(tc))
    stats = pipe.run(until_idle=True, progress=False)
    assert sum(s.rows_in for s in stats) == 80
    expected = {word: str(n).encode() for word, n in expected_counts(lines).items()}
    assert latest_values(client, pipe.state_topic) == expected
    assert latest_values(client, sink) == expected
    assert restarts(client, "partition", pipe.state_topic) > state_before, "no state partition crashed"
    assert restarts(client, "coordinator") > coordinators_before, "no coordinator crashed"
    for tc in range(client.config.coordinator.num_coordinators):
        client.faults.disarm("coordinator.after_log_committing", actor=coordinator_actor_name(tc))
