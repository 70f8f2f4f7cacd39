"""Exactly-once keyed state on the real engine (``raytxn.connectors.stateful.StatefulPipeline``): a
running word count and a per-key dedup, exact across failed batches, a zombie incarnation and
engine actors crashing at each point of a batch's commit."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.connectors.dedup import dedup_window, expected_dedup, passed_keys, sample_events
from raytxn.connectors.stateful import StatefulPipeline
from raytxn.connectors.wordcount import expected_counts, running_wordcount, sample_lines
from raytxn.errors import Fenced, InvalidArgument
from raytxn.ids import coordinator_actor_name, partition_actor_name
from tests.engine import engine_client, new_topic

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def topics(client: rt.Client, lines: list[str]) -> tuple[str, str, str]:
    source, sink, state = new_topic(client, 2, "src"), new_topic(client, 2, "sink"), new_topic(client, 2, "state")
    producer = client.create_producer(source, batching_max_messages=5)  # entries of 5: batches cut between
    for line in lines:
        producer.send_async(line.encode())
    producer.flush()
    return source, sink, state


def latest_values(client: rt.Client, topic: str) -> dict[str, bytes]:
    with client.table_view(topic) as view:
        return view.items()


def exact(client: rt.Client, sink: str, state: str, lines: list[str]) -> None:
    """The state and the sink's latest value per word are the true counts: nothing applied twice
    or lost."""
    expected = {word: str(n).encode() for word, n in expected_counts(lines).items()}
    assert latest_values(client, state) == expected
    assert latest_values(client, sink) == expected


def test_a_running_word_count_is_exact(client: rt.Client) -> None:
    lines = sample_lines(300)
    source, sink, state = topics(client, lines)
    pipeline = StatefulPipeline(client, source, "wc", sink, state, running_wordcount, "wc-plain",
                                batch_max_messages=40)
    try:
        stats = pipeline.run(until_idle=True)
    finally:
        pipeline.close()
    assert sum(s.rows_in for s in stats) == 300 and len(stats) >= 300 // 40
    exact(client, sink, state, lines)


def test_failed_batches_are_tried_again_and_apply_once(client: rt.Client) -> None:
    """A failure before the commit (after the outputs, updates and acks were sent in the txn)
    and a transform that raises: each batch aborts and runs again on the committed state."""
    lines = sample_lines(120)
    source, sink, state = topics(client, lines)
    failures = {"commit": 0, "transform": 0}

    def before_commit(batch: int) -> None:
        if batch == 1 and failures["commit"] == 0:
            failures["commit"] += 1
            raise RuntimeError("injected: before the commit")

    def flaky(rows: list[dict[str, Any]], state: Mapping[str, bytes]) -> tuple[list, dict]:
        if len(pipeline.stats) == 2 and failures["transform"] == 0:
            failures["transform"] += 1
            raise ValueError("injected: in the transform")
        return running_wordcount(rows, state)

    pipeline = StatefulPipeline(client, source, "wc", sink, state, flaky, "wc-failing", batch_max_messages=30,
                                before_commit=before_commit)
    try:
        stats = pipeline.run(until_idle=True)
    finally:
        pipeline.close()
    assert failures == {"commit": 1, "transform": 1}
    assert [s.attempt for s in stats[1:3]] == [1, 1] and sum(s.rows_in for s in stats) == 120
    exact(client, sink, state, lines)


def test_a_zombie_incarnation_is_fenced_and_its_batch_never_counts(client: rt.Client) -> None:
    lines = sample_lines(100)
    source, sink, state = topics(client, lines)
    successor: list[StatefulPipeline] = []

    def a_successor_starts(batch: int) -> None:
        if batch == 1 and not successor:  # the zombie is about to commit its second batch
            successor.append(StatefulPipeline(client, source, "wc", sink, state, running_wordcount, "wc-zombie",
                                              batch_max_messages=25))
            successor[0].run(until_idle=True)

    zombie = StatefulPipeline(client, source, "wc", sink, state, running_wordcount, "wc-zombie",
                              batch_max_messages=25, before_commit=a_successor_starts)
    with pytest.raises(Fenced):
        zombie.run(until_idle=True)
    zombie.close()
    successor[0].close()
    assert len(zombie.stats) == 1  # its first batch committed; its second was fenced
    exact(client, sink, state, lines)


POINTS = [("coordinator", "coordinator.after_log_committing"), ("coordinator", "coordinator.after_send_end"),
          ("state", "partition.before_marker"), ("sink", "partition.after_marker")]


# The suite runs the first point; `make test-extended` all four (the suite's 30 minutes are spent).
@pytest.mark.slow(seconds=10)
@pytest.mark.parametrize(("where", "point"), [pytest.param(*POINTS[0], id=POINTS[0][1])] + [
    pytest.param(where, point, id=point, marks=pytest.mark.extended) for where, point in POINTS[1:]])
def test_an_engine_actor_crashing_in_a_batchs_commit_loses_and_doubles_nothing(client: rt.Client, where: str,
                                                                               point: str) -> None:
    lines = sample_lines(90)
    source, sink, state = topics(client, lines)
    if where == "coordinator":
        refs = [ActorRef(coordinator_actor_name(i), client.token) for i in
                range(client.config.coordinator.num_coordinators)]
    else:
        refs = [ActorRef(partition_actor_name(state if where == "state" else sink, p), client.token) for p in range(2)]
    armed = []

    def crash_in_the_second_commit(batch: int) -> None:
        if batch == 1 and not armed:
            for ref in refs:
                ref.call("arm_fault", point, "crash")
            armed.append(point)

    pipeline = StatefulPipeline(client, source, "wc", sink, state, running_wordcount, f"wc-crash-{point}",
                                batch_max_messages=30, before_commit=crash_in_the_second_commit)
    try:
        pipeline.run(until_idle=True)
    finally:
        pipeline.close()
    still_armed = [bool(ref.call("list_faults")) for ref in refs]
    for ref in refs:
        ref.call("disarm_fault")
    assert armed and not all(still_armed), "no actor crashed at the point: the test showed nothing"
    exact(client, sink, state, lines)


def dedup(rows: list[dict[str, Any]], seen: Mapping[str, bytes]) -> tuple[list, dict]:
    """A per-key dedup: a message passes once per key (its value's id), ever."""
    out, marks = [], {}
    for row in rows:
        event = row["value"].decode()
        if event not in seen and event not in marks:
            out.append((None, row["value"]))
            marks[event] = b"1"
    return out, marks


def test_a_dedup_by_key_passes_each_event_once(client: rt.Client) -> None:
    events = [f"e{i % 17}" for i in range(80)]
    source, sink, state = topics(client, events)
    pipeline = StatefulPipeline(client, source, "dd", sink, state, dedup, "dedup", batch_max_messages=15)
    try:
        pipeline.run(until_idle=True)
        assert sorted(pipeline.state) == sorted({f"e{i}" for i in range(17)})
    finally:
        pipeline.close()
    consumer = client.subscribe(sink, "check", initial_position="earliest")
    passed = [consumer.receive(timeout=10).value().decode() for _ in range(17)]
    assert sorted(passed) == sorted({f"e{i}" for i in range(17)})
    with pytest.raises(rt.errors.Timeout):
        consumer.receive(timeout=1)


def test_a_dedup_window_passes_what_the_plain_rule_passes_across_a_failed_batch(client: rt.Client) -> None:
    """``raytxn.connectors.dedup.dedup_window``: repeats within the window dropped, repeats three
    windows later passed again, ids a window old forgotten; batch 1 fails after sending its
    output and seen ids, and its retry must not take its own aborted marks for earlier events."""
    window_ms = 20_000
    events = sample_events(200, window_ms)
    source, sink, state = new_topic(client, 2, "ev"), new_topic(client, 2, "uniq"), new_topic(client, 2, "seen")
    producer = client.create_producer(source, batching_max_messages=5)
    for key, event_time in events:
        producer.send_async(key.encode(), key=key, event_time=event_time)
    producer.flush()
    failed: list[int] = []

    def fail_once(batch: int) -> None:
        if batch == 1 and not failed:
            failed.append(batch)
            raise RuntimeError("injected: before the commit")

    pipeline = StatefulPipeline(client, source, "dd", sink, state, dedup_window(window_ms), "dedup-window",
                                batch_max_messages=30, before_commit=fail_once)
    try:
        pipeline.run(until_idle=True)
        forgotten_or_kept = dict(pipeline.state)
    finally:
        pipeline.close()
    passed = passed_keys(client, sink, "check")
    assert failed and passed == expected_dedup(events, window_ms) and max(passed.values()) > 1
    assert 0 < len(forgotten_or_kept) < len({key for key, _ in events}) // 2


def test_bad_pipelines_and_transforms_are_refused(client: rt.Client) -> None:
    source, sink, state = topics(client, ["a b"])
    with pytest.raises(rt.errors.TopicNotFound):
        StatefulPipeline(client, source, "x", sink, "no-such-topic", running_wordcount, "bad")
    with pytest.raises(InvalidArgument, match="own"):
        StatefulPipeline(client, source, "x", sink, sink, running_wordcount, "bad")
    wrong = StatefulPipeline(client, source, "x", sink, state, lambda rows, s: ([("k", "not bytes")], {}), "bad",
                             max_attempts=1)
    with pytest.raises(InvalidArgument, match="output"):
        wrong.run(until_idle=True)
    wrong.close()
    assert latest_values(client, sink) == {} and latest_values(client, state) == {}  # nothing committed
