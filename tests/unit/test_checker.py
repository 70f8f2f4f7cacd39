"""The exactly-once checker: one small hand-built history per anomaly kind (reported, and nothing
else), clean histories that look suspicious but are fine, and a property test over histories of a
simulated correct system, with one injected fault that must be caught with the right kind."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raytxn.client.message import MessageId
from raytxn.ids import TxnID
from raytxn.tools.checker import KINDS, Report, check
from raytxn.tools.history import History

TIMEOUT_S = 10.0
T1, T2, T3 = TxnID(1, 1), TxnID(1, 2), TxnID(2, 1)


def mid(partition: int, entry: int, topic: str = "t") -> MessageId:
    return MessageId(topic, partition, 1, entry, 0)


def only(report: Report, kind: str) -> None:
    assert report.kinds() == {kind}, report.summary()


def clean(report: Report) -> None:
    assert report.clean, report.summary()


def plain(h: History, uid: str, entry: int, t: float, partition: int = 0, topic: str = "t") -> MessageId:
    h.send(uid, topic, partition, None, "p", t)
    h.send_ok(uid, mid(partition, entry, topic), t + 0.01)
    return mid(partition, entry, topic)


def txn_sends(h: History, txn: TxnID, uids_entries: list[tuple[str, int]], t: float, topic: str = "t") -> None:
    h.txn_begin(txn, t)
    for uid, entry in uids_entries:
        h.send(uid, topic, 0, txn, "p", t + 0.01)
        h.send_ok(uid, mid(0, entry, topic), t + 0.02)


def base() -> History:
    """Clean: a plain message consumed and acked, a committed txn of two received (unacked) messages."""
    h = History()
    h.subscribe("c", "s", "t", 0.0, from_earliest=True)
    a = plain(h, "a", 0, 1.0)
    h.receive("c", "s", "t", 0, a, "a", 0, 1.5)
    h.ack("c", "s", a, None, 1.6)
    txn_sends(h, T1, [("b", 1), ("c", 2)], 2.0)
    h.txn_commit(T1, "committed", 3.0, issued_at=2.5)
    h.receive("c", "s", "t", 0, mid(0, 1), "b", 0, 3.1)
    h.receive("c", "s", "t", 0, mid(0, 2), "c", 0, 3.2)
    return h


def drain(h: History, *entries: tuple[int, str], sub: str = "s", topic: str = "t") -> None:
    h.final_state(sub, topic, [(0, mid(0, e, topic), uid) for e, uid in entries])


# --- clean histories -------------------------------------------------------------------------


def test_base_history_is_clean() -> None:
    h = base()
    drain(h, (1, "b"), (2, "c"))
    report = check(h, TIMEOUT_S)
    clean(report)
    assert report.txn_outcomes == {T1: "committed"}
    assert "clean" in report.summary()


def test_retried_send_stored_once_is_clean() -> None:
    h = History()
    h.send("a", "t", 0, None, "p", 1.0)
    h.send_failed("a", ConnectionError("lost reply"), 1.1)  # may have been stored: it was not
    h.send("a", "t", 0, None, "p", 1.2)
    h.send_ok("a", mid(0, 0), 1.3)
    drain(h, (0, "a"))
    clean(check(h, TIMEOUT_S))


def test_failed_send_may_be_stored_or_not() -> None:
    for stored in (True, False):
        h = History()
        h.send("a", "t", 0, None, "p", 1.0)
        h.send_failed("a", "ActorUnavailable", 1.1)
        h.send("b", "t", 0, T1, "p", 1.2)  # in a txn that committed: may be there too
        h.send_failed("b", "ActorUnavailable", 1.3)
        h.txn_commit(T1, "committed", 2.0, issued_at=1.5)
        drain(h, *([(0, "a"), (1, "b")] if stored else []))
        clean(check(h, TIMEOUT_S))


def test_redelivery_after_abort_is_clean() -> None:
    h = History()
    h.subscribe("c", "s", "t", 0.0, from_earliest=True)
    a, b = plain(h, "a", 0, 1.0), plain(h, "b", 1, 1.1)
    h.receive("c", "s", "t", 0, a, "a", 0, 2.0)
    h.txn_begin(T1, 2.1)
    h.ack("c", "s", a, T1, 2.2)
    h.txn_abort(T1, "aborted", 2.4, issued_at=2.3)
    h.receive("c", "s", "t", 0, b, "b", 0, 2.5)
    h.receive("c", "s", "t", 0, a, "a", 0, 2.6)  # back after the abort: no redelivery count, seen before
    h.ack("c", "s", b, None, 2.7, cumulative=True)
    drain(h)
    clean(check(h, TIMEOUT_S))


def test_unknown_commit_resolved_committed() -> None:
    h = History()
    txn_sends(h, T1, [("a", 0), ("b", 1)], 1.0)
    h.txn_commit(T1, "unknown", 2.0)  # the client crashed mid-commit; the coordinator finished it
    drain(h, (0, "a"), (1, "b"))
    report = check(h, TIMEOUT_S)
    clean(report)
    assert report.txn_outcomes[T1] == "committed"


def test_unknown_commit_resolved_aborted_redelivers_its_input() -> None:
    h = History()
    h.subscribe("c", "in", "t", 0.0, from_earliest=True)
    i = plain(h, "i", 0, 1.0)
    h.receive("c", "in", "t", 0, i, "i", 0, 1.5)
    h.txn_begin(T1, 2.0)
    h.ack("c", "in", i, T1, 2.1)
    h.send("o", "out", 0, T1, "p", 2.2)
    h.send_ok("o", mid(0, 0, "out"), 2.3)
    h.consume_transform_produce("i", ["o"], T1)
    h.txn_commit(T1, "unknown", 3.0)
    drain(h, (0, "i"), sub="in")  # the input is back: the txn aborted ...
    drain(h, sub="sink", topic="out")  # ... and its output is not there: all or nothing
    report = check(h, TIMEOUT_S)
    clean(report)
    assert report.txn_outcomes[T1] == "aborted"


def test_consume_transform_produce_retry_after_abort_is_clean() -> None:
    h = History()
    h.subscribe("c", "in", "t", 0.0, from_earliest=True)
    i = plain(h, "i", 0, 1.0)
    for n, (txn, outcome) in enumerate([(T1, "aborted"), (T2, "committed")]):
        start = 2.0 + n
        h.receive("c", "in", "t", 0, i, "i", n, start)
        h.txn_begin(txn, start + 0.1)
        h.ack("c", "in", i, txn, start + 0.2)
        h.send("o-i", "out", 0, txn, "p", start + 0.3)  # output uid derived from the input
        h.send_ok("o-i", mid(0, n, "out"), start + 0.4)
        h.consume_transform_produce("i", ["o-i"], txn)
        h.txn_commit(txn, outcome, start + 0.6, issued_at=start + 0.5)
    drain(h, sub="in")
    drain(h, (1, "o-i"), sub="sink", topic="out")
    clean(check(h, TIMEOUT_S))


def test_reset_restarts_the_order_and_shared_redelivery_is_exempt() -> None:
    h = History()
    h.subscribe("c1", "s", "t", 0.0, from_earliest=True)
    ids = [plain(h, f"m{e}", e, 1.0 + e / 10) for e in range(4)]
    h.receive("c1", "s", "t", 0, ids[2], "m2", 0, 2.0)
    h.reset("c1", "s", 2.1, seek=True)  # seek back to the start
    h.receive("c1", "s", "t", 0, ids[0], "m0", 0, 2.2)
    h.receive("c1", "s", "t", 0, ids[3], "m3", 0, 2.3)
    h.subscribe("c2", "s", "t", 2.4)  # shared: c1's unacked m0 goes to c2 after c1 left
    h.receive("c2", "s", "t", 0, ids[1], "m1", 0, 2.5)
    h.receive("c2", "s", "t", 0, ids[0], "m0", 0, 2.6)
    drain(h, *[(e, f"m{e}") for e in range(4)])
    clean(check(h, TIMEOUT_S))


def test_subscription_from_latest_does_not_owe_older_messages() -> None:
    h = History()
    plain(h, "old", 0, 1.0)
    h.subscribe("c", "s", "t", 2.0)  # at the latest position
    plain(h, "new", 1, 3.0)
    drain(h, (1, "new"))
    clean(check(h, TIMEOUT_S))


def test_slow_delivery_within_the_txn_timeout_is_not_stuck() -> None:
    h = History()
    h.subscribe("c", "s", "t", 0.0, from_earliest=True)
    a = plain(h, "a", 0, 1.0)
    h.receive_timeout("c", "s", 1.0 + TIMEOUT_S)  # blocked behind an open txn, at most its timeout
    h.receive("c", "s", "t", 0, a, "a", 0, 2.0 + TIMEOUT_S)
    drain(h, (0, "a"))
    clean(check(h, TIMEOUT_S, stuck_slack_s=5.0))


def test_recording_is_thread_safe() -> None:
    h = History()

    def produce(worker: int) -> None:
        for n in range(200):
            uid = f"w{worker}-{n}"
            h.send(uid, "t", worker, None, f"p{worker}", float(n))
            h.send_ok(uid, mid(worker, n), n + 0.5)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e.seq for e in h.events] == list(range(1600))
    h.final_state("s", "t", [(w, mid(w, n), f"w{w}-{n}") for w in range(4) for n in range(200)])
    clean(check(h, TIMEOUT_S))


# --- one history per anomaly kind ------------------------------------------------------------


def test_lost_plain_message() -> None:
    h = base()
    plain(h, "x", 3, 4.0)
    drain(h, (1, "b"), (2, "c"))
    report = check(h, TIMEOUT_S)
    only(report, "lost")
    assert [a.msg_uid for a in report.lost] == ["x"]


def test_lost_committed_txn_and_lost_input_of_a_committed_ack_is_not_lost() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)
    h.txn_commit(T2, "committed", 5.0, issued_at=4.5)
    drain(h, (1, "b"), (2, "c"))  # "a" was acked: legitimately gone
    report = check(h, TIMEOUT_S)
    only(report, "lost")
    assert [(a.msg_uid, a.txn) for a in report.lost] == [("x", T2)]


def test_duplicate_retried_send_stored_twice() -> None:
    h = History()
    h.send("a", "t", 0, None, "p", 1.0)
    h.send_failed("a", "ActorUnavailable", 1.1)
    h.send("a", "t", 0, None, "p", 1.2)
    h.send_ok("a", mid(0, 1), 1.3)
    drain(h, (0, "a"), (1, "a"))
    report = check(h, TIMEOUT_S)
    only(report, "duplicate")
    assert report.duplicate[0].msg_uid == "a"


def test_duplicate_input_processed_in_two_committed_txns() -> None:
    h = History()
    h.subscribe("c", "in", "t", 0.0, from_earliest=True)
    i = plain(h, "i", 0, 1.0)
    for n, txn in enumerate([T1, T2]):
        start = 2.0 + n
        h.receive("c", "in", "t", 0, i, "i", n, start)
        h.txn_begin(txn, start + 0.1)
        h.ack("c", "in", i, txn, start + 0.2)
        h.send(f"o{n}", "out", 0, txn, "p", start + 0.3)
        h.send_ok(f"o{n}", mid(0, n, "out"), start + 0.4)
        h.consume_transform_produce("i", [f"o{n}"], txn)
        h.txn_commit(txn, "committed", start + 0.6, issued_at=start + 0.5)
    drain(h, sub="in")
    drain(h, (0, "o0"), (1, "o1"), sub="sink", topic="out")
    report = check(h, TIMEOUT_S)
    only(report, "duplicate")
    assert [a.msg_uid for a in report.duplicate] == ["i"]


def test_duplicate_acked_in_committed_txn_still_in_backlog() -> None:
    h = base()
    h.txn_begin(T2, 4.0)
    h.ack("c", "s", mid(0, 1), T2, 4.1)
    h.txn_commit(T2, "committed", 4.3, issued_at=4.2)
    drain(h, (1, "b"), (2, "c"))
    only(check(h, TIMEOUT_S), "duplicate")


def test_aborted_read() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)
    h.txn_abort(T2, "aborted", 5.0, issued_at=4.5)
    h.receive("c", "s", "t", 0, mid(0, 3), "x", 0, 5.5)
    drain(h, (1, "b"), (2, "c"))
    report = check(h, TIMEOUT_S)
    only(report, "aborted_read")
    assert (report.aborted_read[0].msg_uid, report.aborted_read[0].txn) == ("x", T2)


def test_uncommitted_read_before_the_commit_call() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)
    h.receive("c", "s", "t", 0, mid(0, 3), "x", 0, 4.2)
    h.txn_commit(T2, "committed", 5.0, issued_at=4.5)
    drain(h, (1, "b"), (2, "c"), (3, "x"))
    only(check(h, TIMEOUT_S), "uncommitted_read")


def test_read_after_the_commit_call_before_its_reply_is_fine() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)
    h.receive("c", "s", "t", 0, mid(0, 3), "x", 0, 4.7)  # the coordinator committed, reply in flight
    h.txn_commit(T2, "committed", 5.0, issued_at=4.5)
    drain(h, (1, "b"), (2, "c"), (3, "x"))
    clean(check(h, TIMEOUT_S))


def test_uncommitted_read_of_a_txn_that_never_ended() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)
    h.receive("c", "s", "t", 0, mid(0, 3), "x", 0, 4.2)
    drain(h, (1, "b"), (2, "c"))
    report = check(h, TIMEOUT_S)
    only(report, "uncommitted_read")
    assert report.txn_outcomes[T2] == "aborted"


def test_uncommitted_message_in_the_final_drain() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)  # never committed: it can only time out
    drain(h, (1, "b"), (2, "c"), (3, "x"))
    only(check(h, TIMEOUT_S), "uncommitted_read")


def test_torn_committed_txn() -> None:
    h = base()
    drain(h, (1, "b"))
    report = check(h, TIMEOUT_S)
    only(report, "torn")
    assert report.torn[0].txn == T1


def test_torn_unknown_outcome_partly_visible() -> None:
    h = History()
    txn_sends(h, T1, [("a", 0), ("b", 1)], 1.0)
    h.txn_commit(T1, "unknown", 2.0)
    drain(h, (1, "b"))
    only(check(h, TIMEOUT_S), "torn")


def test_torn_aborted_txn_visible() -> None:
    h = base()
    txn_sends(h, T2, [("x", 3)], 4.0)
    h.txn_commit(T2, "aborted", 5.0, issued_at=4.5)  # e.g. it had timed out
    drain(h, (1, "b"), (2, "c"), (3, "x"))
    report = check(h, TIMEOUT_S)
    only(report, "torn")
    assert report.torn[0].txn == T2


def two_workers_send_one_output(h: History, *, name_producers: bool) -> None:
    """Workers w1 (txn T1) and w2 (txn T2) were both handed input i (a redelivery after a
    subscription restart) and both send its output o-i. w1's send is issued first but answered
    last: w2's is stored at entry 1, w1's at entry 0. T1 aborts (its ack of i conflicts with
    T2's), T2 commits. So the chaos run of stop 26 went, whose drain was reported torn."""
    h.send("o-i", "out", 0, T1, "w1", 2.0)
    h.send("o-i", "out", 0, T2, "w2", 2.1)
    h.send_ok("o-i", mid(0, 1, "out"), 2.2, producer="w2" if name_producers else None)
    h.send_ok("o-i", mid(0, 0, "out"), 2.5, producer="w1" if name_producers else None)
    h.txn_abort(T1, "aborted", 3.0, issued_at=2.9)
    h.txn_commit(T2, "committed", 3.1, issued_at=2.6)


def test_outcomes_of_two_producers_sending_one_uid_go_to_their_own_attempts() -> None:
    h = History()
    two_workers_send_one_output(h, name_producers=True)
    drain(h, (1, "o-i"), sub="sink", topic="out")  # T2's copy: right
    clean(check(h, TIMEOUT_S))
    h = History()
    two_workers_send_one_output(h, name_producers=True)
    drain(h, (0, "o-i"), sub="sink", topic="out")  # T1's copy: the aborted txn shows
    report = check(h, TIMEOUT_S)
    only(report, "torn")
    assert report.torn[0].txn == T1, report.summary()


def test_outcomes_naming_no_producer_while_two_have_sends_under_way_are_malformed() -> None:
    # Before outcomes named their producer, w2's outcome went to w1's attempt (the oldest
    # unresolved one), so T2's stored copy was pinned on the aborted T1 and reported torn.
    h = History()
    two_workers_send_one_output(h, name_producers=False)
    drain(h, (1, "o-i"), sub="sink", topic="out")
    report = check(h, TIMEOUT_S)
    assert "malformed" in report.kinds() and "torn" not in report.kinds(), report.summary()
    assert "w1, w2 have sends of it under way" in report.malformed[0].detail, report.summary()


def test_order() -> None:
    h = History()
    h.subscribe("c", "s", "t", 0.0, from_earliest=True)
    a, b = plain(h, "a", 0, 1.0), plain(h, "b", 1, 1.1)
    h.receive("c", "s", "t", 0, b, "b", 0, 2.0)
    h.receive("c", "s", "t", 0, a, "a", 0, 2.1)
    drain(h, (0, "a"), (1, "b"))
    report = check(h, TIMEOUT_S)
    only(report, "order")
    assert report.order[0].msg_uid == "a"


def test_stuck() -> None:
    h = History()
    h.subscribe("c", "s", "t", 0.0, from_earliest=True)
    a = plain(h, "a", 0, 1.0)
    h.receive_timeout("c", "s", 2.0)
    h.receive_timeout("c", "s", 20.0)  # visible for 19 s > 10 s + 5 s, nothing received
    h.receive("c", "s", "t", 0, a, "a", 0, 21.0)
    drain(h, (0, "a"))
    report = check(h, TIMEOUT_S, stuck_slack_s=5.0)
    only(report, "stuck")
    assert report.stuck[0].msg_uid == "a"


@pytest.mark.parametrize("breakage", ["unknown uid", "outcome without send", "ack of unknown id", "both outcomes",
                                      "id with two uids", "unknown transform output"])
def test_malformed(breakage: str) -> None:
    h = base()
    match breakage:
        case "unknown uid":
            h.receive("c", "s", "t", 0, mid(0, 9), "ghost", 0, 4.0)
        case "outcome without send":
            h.send_ok("ghost", mid(0, 9), 4.0)
        case "ack of unknown id":
            h.ack("c", "s", mid(0, 9), None, 4.0)
        case "both outcomes":
            h.txn_abort(T1, "aborted", 4.0)
        case "id with two uids":
            h.receive("c", "s", "t", 0, mid(0, 1), "c", 1, 4.0)
        case "unknown transform output":
            h.consume_transform_produce("a", ["ghost"], T1)
    drain(h, (1, "b"), (2, "c"))
    report = check(h, TIMEOUT_S)
    only(report, "malformed")
    assert len(report.malformed) == 1, report.summary()


def test_report_summary_names_the_anomaly() -> None:
    h = base()
    plain(h, "x", 3, 4.0)
    drain(h, (1, "b"))
    text = check(h, TIMEOUT_S).summary()
    assert "lost (1)" in text and "msg x" in text and "torn (1)" in text and str(T1) in text
    assert set(KINDS) >= check(h, TIMEOUT_S).kinds()


# --- property test: a simulated correct system, and one injected fault ----------------------

PARTITIONS = {"in": 2, "out": 1}


@dataclass
class Entry:
    uid: str
    txn: TxnID | None
    mid: MessageId
    confirmed: bool  # the workload saw send_ok for it


@dataclass
class SubModel:
    name: str
    topic: str
    consumer: str
    start: dict[int, int]
    cursor: dict[int, int]
    inflight: dict[MessageId, Entry] = field(default_factory=dict)
    redeliver: list[Entry] = field(default_factory=list)
    acked: set[MessageId] = field(default_factory=set)
    deliveries: dict[MessageId, int] = field(default_factory=dict)


# How a txn ends: (action called, real outcome, outcome the client records).
TXN_ENDS = [("commit", "committed", "committed"), ("commit", "committed", "unknown"),
            ("commit", "aborted", "aborted"), ("commit", "aborted", "unknown"),
            ("abort", "aborted", "aborted"), ("abort", "aborted", "unknown")]


class Sim:
    """A dict-based model of partitions with a transaction buffer (reads stop before the first open
    txn, aborted entries are skipped), subscriptions with cursors, pending txn acks and
    redelivery. It records what a workload would see as a list of History calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.t = 0.0
        self.logs: dict[tuple[str, int], list[Entry]] = {(tp, p): [] for tp, n in PARTITIONS.items() for p in range(n)}
        self.state: dict[TxnID, str] = {}  # open, committed, aborted (the truth)
        self.ended: dict[TxnID, tuple[str, str]] = {}  # txn -> (action, recorded outcome)
        self.entries_of: dict[TxnID, list[Entry]] = {}
        self.pending_acks: dict[TxnID, list[tuple[SubModel, Entry]]] = {}
        self.subs = [self.new_sub("s1", "in", "c1", from_earliest=True),
                     self.new_sub("d", "out", "cd", from_earliest=True)]
        self.counter = 0

    def rec(self, method: str, *args: object, **kwargs: object) -> None:
        self.calls.append((method, args, kwargs))

    def tick(self, step: int) -> float:
        self.t = round(self.t + 0.001 + step / 10, 3)
        return self.t

    def new_sub(self, name: str, topic: str, consumer: str, from_earliest: bool) -> SubModel:
        ends = {p: 0 if from_earliest else len(self.logs[topic, p]) for p in range(PARTITIONS[topic])}
        self.rec("subscribe", consumer, name, topic, self.t, from_earliest=from_earliest)
        return SubModel(name, topic, consumer, dict(ends), dict(ends))

    def uid(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def append(self, topic: str, p: int, uid: str, txn: TxnID | None, confirmed: bool) -> Entry:
        log = self.logs[topic, p]
        entry = Entry(uid, txn, MessageId(topic, p, 1, len(log), 0), confirmed)
        log.append(entry)
        if txn is not None:
            self.entries_of[txn].append(entry)
        return entry

    def readable_upto(self, topic: str, p: int) -> int:
        log = self.logs[topic, p]
        return next((i for i, e in enumerate(log) if e.txn is not None and self.state[e.txn] == "open"), len(log))

    def readable(self, entry: Entry) -> bool:
        return entry.txn is None or self.state[entry.txn] == "committed"

    # --- operations (parameters are arbitrary ints, reduced to valid choices) ----------------------

    def plain_send(self, a: int, b: int) -> None:
        p, uid = a % 2, self.uid("m")
        self.rec("send", uid, "in", p, None, "prod", self.tick(0))
        if b % 3:
            entry = self.append("in", p, uid, None, confirmed=True)
            self.rec("send_ok", uid, entry.mid, self.tick(0))
            return
        stored = b % 2 == 0  # a retriable failure: the reply was lost, or the write never happened
        entry = self.append("in", p, uid, None, confirmed=False) if stored else None
        self.rec("send_failed", uid, "ActorUnavailable", self.tick(0))
        if b % 4 == 0:  # the application retries under the same producer sequence: stored once
            self.rec("send", uid, "in", p, None, "prod", self.tick(0))
            if entry is None:
                entry = self.append("in", p, uid, None, confirmed=True)
            entry.confirmed = True
            self.rec("send_ok", uid, entry.mid, self.tick(0))

    def open_txns(self) -> list[TxnID]:
        return [txn for txn, s in self.state.items() if s == "open"]

    def begin(self) -> None:
        txn = TxnID(1, len(self.state))
        self.state[txn], self.entries_of[txn], self.pending_acks[txn] = "open", [], []
        self.rec("txn_begin", txn, self.tick(0))

    def txn_send(self, a: int, b: int) -> None:
        txns = self.open_txns()
        if txns:
            txn, p, uid = txns[a % len(txns)], b % 2, self.uid("x")
            self.rec("send", uid, "in", p, txn, "prod", self.tick(0))
            self.rec("send_ok", uid, self.append("in", p, uid, txn, confirmed=True).mid, self.tick(0))

    def end(self, a: int, b: int, how: tuple[str, str, str] | None = None) -> None:
        txns = self.open_txns()
        if not txns:
            return
        txn = txns[a % len(txns)]
        action, real, recorded = how or TXN_ENDS[b % len(TXN_ENDS)]
        issued = self.tick(0)
        self.state[txn] = real
        self.ended[txn] = (action, recorded)
        for sub, entry in self.pending_acks[txn]:
            if real == "committed":
                sub.acked.add(entry.mid)
            else:
                sub.redeliver.append(entry)
        method = "txn_commit" if action == "commit" else "txn_abort"
        self.rec(method, txn, recorded, self.tick(1), issued_at=issued if b % 2 else None)

    def receive(self, sub: SubModel, a: int) -> None:
        if sub.redeliver:
            entry = sub.redeliver.pop(0)
        else:
            entry = None
            for p in sorted(sub.cursor, key=lambda p: (p - a) % len(sub.cursor)):
                upto = self.readable_upto(sub.topic, p)
                while entry is None and sub.cursor[p] < upto:
                    candidate = self.logs[sub.topic, p][sub.cursor[p]]
                    sub.cursor[p] += 1
                    if self.readable(candidate):
                        entry = candidate
                if entry is not None:
                    break
        if entry is None:
            self.rec("receive_timeout", sub.consumer, sub.name, self.tick(1))
            return
        count = sub.deliveries.get(entry.mid, 0)
        sub.deliveries[entry.mid] = count + 1
        sub.inflight[entry.mid] = entry
        self.rec("receive", sub.consumer, sub.name, sub.topic, entry.mid.partition, entry.mid, entry.uid, count,
                 self.tick(0))

    def pick_inflight(self, sub: SubModel, a: int) -> Entry | None:
        if not sub.inflight:
            return None
        return sub.inflight.pop(sorted(sub.inflight)[a % len(sub.inflight)])

    def plain_ack(self, sub: SubModel, a: int) -> None:
        entry = self.pick_inflight(sub, a)
        if entry is not None:
            sub.acked.add(entry.mid)
            self.rec("ack", sub.consumer, sub.name, entry.mid, None, self.tick(0))

    def transform(self, a: int, b: int) -> None:
        """Consume-transform-produce: ack an input of s1 in an open txn, produce its output there."""
        txns, sub = self.open_txns(), self.subs[0]
        if not txns or not sub.inflight:
            return
        txn, entry = txns[b % len(txns)], self.pick_inflight(sub, a)
        self.rec("ack", sub.consumer, sub.name, entry.mid, txn, self.tick(0))
        self.pending_acks[txn].append((sub, entry))
        out = self.uid("o")
        self.rec("send", out, "out", 0, txn, "pipeline", self.tick(0))
        self.rec("send_ok", out, self.append("out", 0, out, txn, confirmed=True).mid, self.tick(0))
        self.rec("consume_transform_produce", entry.uid, [out], txn)

    def reconnect(self, sub: SubModel) -> None:
        sub.redeliver.extend(sorted(sub.inflight.values(), key=lambda e: e.mid))
        sub.inflight.clear()
        self.rec("reset", sub.consumer, sub.name, self.tick(0))

    def run(self, ops: list[tuple[int, int, int]]) -> None:
        for op, a, b in ops:
            sub = self.subs[0] if a % 2 == 0 or len(self.subs) < 3 else self.subs[2]
            match op:
                case 0 | 1:
                    self.plain_send(a, b)
                case 2:
                    self.begin()
                case 3:
                    self.txn_send(a, b)
                case 4:
                    self.end(a, b)
                case 5 | 6:
                    self.receive(sub, b)
                case 7:
                    self.plain_ack(sub, b)
                case 8:
                    self.transform(a, b)
                case 9:
                    self.reconnect(sub)
                case 10:
                    if len(self.subs) < 3:
                        self.subs.append(self.new_sub("s2", "in", "c2", from_earliest=False))
            self.tick(b % 3)
        while self.open_txns():  # the workload stops: every txn ends (or would time out)
            self.end(0, 0, ("commit", "committed", "committed") if len(self.calls) % 2 else ("abort", "aborted",
                                                                                             "aborted"))

    def drains(self) -> list[tuple[str, tuple, dict]]:
        calls = []
        for sub in self.subs:
            messages = [(p, e.mid, e.uid) for p in sorted(sub.start) for e in self.logs[sub.topic, p][sub.start[p]:]
                        if self.readable(e) and e.mid not in sub.acked]
            calls.append(("final_state", (sub.name, sub.topic, messages), {}))
        return calls


def replay(calls: list[tuple[str, tuple, dict]]) -> History:
    h = History()
    for method, args, kwargs in calls:
        getattr(h, method)(*args, **kwargs)
    return h


OPS = st.lists(st.tuples(st.integers(0, 10), st.integers(0, 7), st.integers(0, 11)), min_size=25, max_size=80)
SIM_TIMEOUT_S = 1000.0  # longer than any simulated run: nothing can look stuck


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_simulated_correct_histories_are_clean(ops: list[tuple[int, int, int]]) -> None:
    sim = Sim()
    sim.run(ops)
    report = check(replay(sim.calls + sim.drains()), SIM_TIMEOUT_S)
    assert report.clean, report.summary()


def inject(sim: Sim, fault: str, pick: int) -> tuple[list, str] | None:
    """``sim``'s history with one ``fault`` injected, and the kind that must be reported (None:
    this history offers nothing to break that way)."""
    calls, drains = list(sim.calls), sim.drains()
    entry_by_mid = {e.mid: e for log in sim.logs.values() for e in log}
    if fault == "drop":  # a stored plain or definitely committed message vanishes from a drain
        victims = [(i, n) for i, (_, (_, _, msgs), _) in enumerate(drains) for n, (_, m, _) in enumerate(msgs)
                   if entry_by_mid[m].confirmed and (entry_by_mid[m].txn is None
                                                     or sim.ended[entry_by_mid[m].txn][1] == "committed")]
        if not victims:
            return None
        i, n = victims[pick % len(victims)]
        name, topic, msgs = drains[i][1]
        victim = entry_by_mid[msgs[n][1]]
        rest = msgs[:n] + msgs[n + 1:]
        drains[i] = ("final_state", (name, topic, rest), {})
        siblings = victim.txn is not None and any(entry_by_mid[m].txn == victim.txn for _, m, _ in rest)
        return calls + drains, "torn" if siblings else "lost"
    if fault == "duplicate":  # a drained message stored a second time
        victims = [(i, n) for i, (_, (_, _, msgs), _) in enumerate(drains) for n in range(len(msgs))]
        if not victims:
            return None
        i, n = victims[pick % len(victims)]
        name, topic, msgs = drains[i][1]
        p, _, uid = msgs[n]
        drains[i] = ("final_state", (name, topic, [*msgs, (p, MessageId(topic, p, 2, 0, 0), uid)]), {})
        return calls + drains, "duplicate"
    if fault == "aborted_read":  # a message of a definitely aborted txn is delivered
        victims = [e for txn, es in sim.entries_of.items() for e in es
                   if sim.state[txn] == "aborted" and (sim.ended[txn][0] == "abort" or sim.ended[txn][1] == "aborted")]
        if not victims:
            return None
        e = victims[pick % len(victims)]
        sub = next(s for s in sim.subs if s.topic == e.mid.topic)
        calls.append(("receive", (sub.consumer, sub.name, sub.topic, e.mid.partition, e.mid, e.uid, 1, sim.t + 1), {}))
        return calls + drains, "aborted_read"
    # reorder: two consecutive first deliveries of one stream (no reset, no other delivery of
    # either message in between) swap places
    streams: dict[tuple, list[int]] = {}
    pairs = []
    delivered: dict[tuple[str, MessageId], list[int]] = {}
    for i, (method, args, _) in enumerate(calls):
        if method == "receive":
            delivered.setdefault((args[1], args[4]), []).append(i)
    for i, (method, args, _) in enumerate(calls):
        if method == "reset":
            streams = {k: v for k, v in streams.items() if k[:2] != (args[1], args[0])}
        elif method == "receive" and args[6] == 0 and delivered[args[1], args[4]][0] == i:
            key = (args[1], args[0], args[2], args[3])
            if key in streams:
                j = streams[key][-1]
                a, b = calls[j][1][4], args[4]
                between = [k for k in delivered[args[1], a] + delivered[args[1], b] if j < k < i]
                if not between:
                    pairs.append((j, i))
            streams.setdefault(key, []).append(i)
    if not pairs:
        return None
    j, i = pairs[pick % len(pairs)]
    calls[j], calls[i] = calls[i], calls[j]
    return calls + drains, "order"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.sampled_from(["drop", "duplicate", "aborted_read", "reorder"]), st.integers(0, 10**6))
def test_injected_fault_is_detected_with_its_kind(ops: list[tuple[int, int, int]], fault: str, pick: int) -> None:
    sim = Sim()
    sim.run(ops)
    injected = inject(sim, fault, pick)
    if injected is None:
        return
    calls, kind = injected
    report = check(replay(calls), SIM_TIMEOUT_S)
    assert report.kinds() == {kind}, f"{fault}: expected {kind}\n{report.summary()}"
