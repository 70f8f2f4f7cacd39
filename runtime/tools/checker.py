"""The exactly-once checker: judge a recorded ``History`` against docs/design.md §7.

``check(history, txn_timeout_s)`` returns a ``Report`` of anomalies by kind. Pure Python: no Ray,
no I/O, no clock (every time comes from the history, in float seconds).

Vocabulary
----------
- An **attempt** is one ``send`` of a msg_uid. ``send_ok`` / ``send_failed`` resolve the oldest
  unresolved attempt of that uid by the producer they name (by anyone when they name none, and
  then only one producer may have one unresolved, else ``malformed``). An attempt with
  ``send_ok`` is *stored*; a failed or unresolved one *may* be stored (a retriable failure after
  the write, a crash): absent is fine, present is fine when it was plain or its txn committed.
- A stored message is **attributed** to the attempt whose ``send_ok`` named its message id, else
  to the uid's attempts on that topic (and partition) that have no ``send_ok`` ("may be stored"),
  else to all the uid's attempts on that topic (a second stored copy). When several attempts
  could explain a message, the checker takes the most innocent one.
- Every txn gets an **effective outcome**. A recorded "committed" or "aborted" outcome (of commit
  or abort) is final (both recorded: malformed). A txn whose ends are all "unknown" committed if a
  commit was issued and one of its messages was read (a receive or a drain): reads are the evidence;
  else it aborted if a commit was never issued (only abort), or if one of its stored messages is
  missing from a drain that had to show it, or if a message it acked is still in that
  subscription's drain; else it is *undecided*: either outcome is accepted. A txn with no end
  at all never issued a commit: it aborts by timeout.
- The **commit issue time** of a txn is the ``issued_at`` of its first commit, or, when not
  recorded, a lower bound: the latest begin/send/ack the workload issued in the txn before it
  recorded the commit (a workload issues those before it calls commit).
- A subscription's **scope** is the messages it must show: all of them when it started from the
  earliest message (or when it appears only in a final drain), else those whose send was issued
  at or after it started (its first ``subscribe``; without one, its first receive). After a
  ``reset(seek=True)`` only sends issued after the last seek are in scope (a seek may skip).
- A message is **consumed** by a subscription when an ack there covers one of its ids
  (individual, or cumulative on its partition at or after it) and that ack is plain, or its txn
  committed or is undecided.

The rules (one anomaly per subject)
-----------------------------------
- ``lost``: a stored attempt, plain or of a committed txn, in the scope of a drained subscription
  and on a drained partition, not consumed there, whose uid is not in the drain; when other
  messages of its txn are in that drain it is reported as ``torn`` instead.
- ``duplicate``: (a) a uid read (received or drained, anywhere) under two message ids that both
  count (attributed to a plain or committed/undecided attempt), counting the ids of its stored
  plain/committed attempts too; (b) an input (a ``consume_transform_produce`` input, or a message
  acked individually in a subscription) consumed in two distinct committed txns; (c) a message
  acked in a committed txn and still in that subscription's drain (without a later seek).
- ``aborted_read``: a receive of a message attributed only to aborted txns.
- ``uncommitted_read``: a receive of a message whose txn's commit was issued after the receive
  (the commit completes at the coordinator before the client hears of it, so only a receive before
  the commit *call* is certain to be early), or whose txn never ended; also a drain showing a
  message of a txn that never ended.
- ``torn``: per drained subscription, a committed txn some of whose expected messages are in the
  drain and some not; or an aborted txn with any message in a drain.
- ``order``: per (subscription, consumer, topic, partition), in recording order, a first delivery
  whose message id is below an earlier first delivery in that stream since the consumer's last
  reset. Redeliveries (redelivery_count > 0, or an id any consumer of the subscription received
  before) are exempt, and so are the subscriptions ``check`` is told are Key_Shared (order per
  key there, judged by the caller).
- ``stuck``: a consumer recorded ``receive_timeout`` at time b while a message m of its
  subscription had been visible (plain: its send_ok time; txn: when its "committed" outcome came
  back) and unreceived for more than txn_timeout_s + stuck_slack_s, and the whole subscription
  (every consumer) had received nothing in that time either. m must be in the subscription's scope,
  received by it for the first time after b (or never, and still in its drain: proof it was
  deliverable), and on a partition that consumer has received from (or it has received nothing
  there at all). A message received once and redelivered later is not considered (conservative);
  an open txn may block a partition up to its timeout, hence the limit.
- ``malformed``: the history contradicts itself (outcome of an unknown send, an unknown uid read,
  a message id carrying two uids, an ack of an id never seen, a txn both committed and aborted,
  topic/partition mismatches, transform links naming unknown uids). Malformed events are left out
  of every other check.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass, field

from raytxn.client.message import MessageId
from raytxn.protocol.txnlog import EndAction
from raytxn.tools.history import (
    Acked,
    Event,
    FinalState,
    History,
    Received,
    ReceiveTimedOut,
    Reset,
    SendFailed,
    SendOk,
    Sent,
    Subscribed,
    Transformed,
    TxnBegun,
    TxnEnded,
)

KINDS: tuple[str, ...] = ("lost", "duplicate", "aborted_read", "uncommitted_read", "torn", "order", "stuck",
                          "malformed")
COMMITTED, ABORTED, UNDECIDED = "committed", "aborted", "undecided"


@dataclass(frozen=True)
class Anomaly:
    """One finding: ``subject`` names what it is about (a message, txn, subscription)."""

    kind: str
    subject: str
    detail: str
    msg_uid: str | None = None
    txn: Hashable | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}"


@dataclass
class Report:
    """Anomalies by kind, plus what the checker concluded about every txn."""

    lost: list[Anomaly] = field(default_factory=list)
    duplicate: list[Anomaly] = field(default_factory=list)
    aborted_read: list[Anomaly] = field(default_factory=list)
    uncommitted_read: list[Anomaly] = field(default_factory=list)
    torn: list[Anomaly] = field(default_factory=list)
    order: list[Anomaly] = field(default_factory=list)
    stuck: list[Anomaly] = field(default_factory=list)
    malformed: list[Anomaly] = field(default_factory=list)
    txn_outcomes: dict[Hashable, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.anomalies()

    def kinds(self) -> set[str]:
        """The kinds with at least one anomaly."""
        return {kind for kind in KINDS if getattr(self, kind)}

    def anomalies(self) -> list[Anomaly]:
        return [a for kind in KINDS for a in getattr(self, kind)]

    def summary(self, max_per_kind: int = 10) -> str:
        outcome_counts = defaultdict(int)
        for outcome in self.txn_outcomes.values():
            outcome_counts[outcome] += 1
        txns = ", ".join(f"{n} {o}" for o, n in sorted(outcome_counts.items()))
        head = (f"exactly-once check of {self.counts.get('events', 0)} events, {self.counts.get('attempts', 0)} sends, "
                f"{self.counts.get('receives', 0)} receives, {len(self.txn_outcomes)} txns ({txns or 'none'})")
        found = self.anomalies()
        if not found:
            return head + ": clean"
        lines = [f"{head}: {len(found)} anomalies"]
        for kind in KINDS:
            items = getattr(self, kind)
            if items:
                lines.append(f"  {kind} ({len(items)}):")
                lines.extend(f"    {a.subject}: {a.detail}" for a in items[:max_per_kind])
                if len(items) > max_per_kind:
                    lines.append(f"    ... {len(items) - max_per_kind} more")
        return "\n".join(lines)


def check(history: History | Iterable[Event], txn_timeout_s: float, *, stuck_slack_s: float = 5.0,
          key_shared: Collection[str] = ()) -> Report:
    """Judge ``history``. ``txn_timeout_s``: the longest txn timeout the workload used (an open txn
    may legitimately block a partition that long); ``stuck_slack_s``: what else may delay a
    delivery on top (abort round trips, ack-timeout redelivery, actor restarts). ``key_shared``:
    the subscriptions consumed Key_Shared, left out of the ``order`` rule: there order holds per
    key, not per consumer (a message waits while its key's earlier ones are held by another
    consumer, and other keys' later messages pass it), which needs the keys the history does not
    record; the caller judges it (the simulator does, ``raytxn.sim.keyshared``)."""
    events = history.events if isinstance(history, History) else tuple(history)
    return _Checker(sorted(events, key=lambda e: e.seq), txn_timeout_s + stuck_slack_s, frozenset(key_shared)).run()


# --- internals -----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Attempt:
    sent: Sent
    message_id: MessageId | None = None  # set by send_ok
    ok_t: float | None = None
    resolved: bool = False

    @property
    def uid(self) -> str:
        return self.sent.msg_uid

    @property
    def txn(self) -> Hashable | None:
        return self.sent.txn


@dataclass(eq=False)
class _Txn:
    txn: Hashable
    op_times: list[tuple[int, float]] = field(default_factory=list)  # (seq, t) of begin/sends/acks
    ends: list[TxnEnded] = field(default_factory=list)
    state: str = UNDECIDED
    commit_issued_at: float = -math.inf
    committed_at: float | None = None  # when a "committed" outcome came back: visible from then
    contradictory: bool = False  # recorded both committed and aborted (malformed)

    @property
    def never_ended(self) -> bool:
        return not self.ends


@dataclass
class _Sub:
    """One (subscription, topic)."""

    start: float | None = None  # first subscribe
    from_earliest: bool = False
    first_receive: float | None = None


@dataclass
class _Consumption:
    """The acks of one subscription that count: individual ids, and per partition the highest
    cumulative ack."""

    ids: set[MessageId] = field(default_factory=set)
    cumulative: dict[tuple[str, int], MessageId] = field(default_factory=dict)

    def add(self, ack: Acked) -> None:
        mid = ack.message_id
        if not ack.cumulative:
            self.ids.add(mid)
        elif (mid.topic, mid.partition) not in self.cumulative or self.cumulative[mid.topic, mid.partition] < mid:
            self.cumulative[mid.topic, mid.partition] = mid

    def covers(self, mid: MessageId) -> bool:
        upto = self.cumulative.get((mid.topic, mid.partition))
        return mid in self.ids or (upto is not None and mid <= upto)


def _covers(ack: Acked, mid: MessageId) -> bool:
    if ack.cumulative:
        return (ack.message_id.topic, ack.message_id.partition) == (mid.topic, mid.partition) and mid <= ack.message_id
    return ack.message_id == mid


class _Checker:
    def __init__(self, events: list[Event], stuck_after_s: float, key_shared: frozenset[str] = frozenset()) -> None:
        self.events = events
        self.stuck_after_s = stuck_after_s
        self.key_shared = key_shared
        self.report = Report()
        self.seen: set[tuple[str, str]] = set()  # (kind, subject): one anomaly per subject
        self.attempts: list[_Attempt] = []
        self.attempts_by_uid: dict[str, list[_Attempt]] = defaultdict(list)
        # Recording order between threads is loose (a receive may be recorded before the producer
        # thread recorded its send): "never sent" means nowhere in the history.
        self.sent_uids = {e.msg_uid for e in events if isinstance(e, Sent)}
        self.attempt_by_mid: dict[MessageId, _Attempt] = {}
        self.uid_of_mid: dict[MessageId, str] = {}
        self.ids_of_uid: dict[str, set[MessageId]] = defaultdict(set)
        self.txns: dict[Hashable, _Txn] = {}
        self.subs: dict[tuple[str, str], _Sub] = defaultdict(_Sub)
        self.receives: list[Received] = []
        self.timeouts: list[ReceiveTimedOut] = []
        self.resets: list[Reset] = []
        self.acks: list[Acked] = []
        self.links: list[Transformed] = []
        self.drains: list[FinalState] = []
        self.drained_uid: dict[int, dict[MessageId, str]] = {}  # drain seq -> its ids and their uids
        self.consumer_topics: dict[tuple[str, str], set[str]] = defaultdict(set)  # (consumer, sub) -> topics
        self.last_seek: dict[str, float] = {}  # subscription -> time of its last seek
        self.attempts_by_txn: dict[Hashable, list[_Attempt]] = defaultdict(list)
        self.acks_by_sub: dict[str, list[Acked]] = defaultdict(list)
        self.acks_by_txn: dict[Hashable, list[Acked]] = defaultdict(list)
        self.consumption: dict[str, _Consumption] = {}

    # --- plumbing --------------------------------------------------------------------------------

    def flag(self, kind: str, subject: str, detail: str, msg_uid: str | None = None, txn: Hashable = None) -> None:
        if (kind, subject) not in self.seen:
            self.seen.add((kind, subject))
            getattr(self.report, kind).append(Anomaly(kind, subject, detail, msg_uid, txn))

    def txn_info(self, txn: Hashable) -> _Txn:
        if txn not in self.txns:
            self.txns[txn] = _Txn(txn)
        return self.txns[txn]

    def note_uid(self, mid: MessageId, uid: str, what: str) -> bool:
        """Remember that ``mid`` carries ``uid``; False (and malformed) if it carried another."""
        known = self.uid_of_mid.setdefault(mid, uid)
        if known != uid:
            self.flag("malformed", f"message {mid}", f"{what} says it carries {uid!r}, earlier {known!r}", uid)
            return False
        self.ids_of_uid[uid].add(mid)
        return True

    def run(self) -> Report:
        self.index()
        self.validate_late()
        self.resolve_txns()
        self.check_reads()
        self.check_drains()
        self.check_duplicates()
        self.check_order()
        self.check_stuck()
        self.report.txn_outcomes = {t.txn: t.state for t in self.txns.values()}
        self.report.counts = {"events": len(self.events), "attempts": len(self.attempts),
                              "receives": len(self.receives)}
        return self.report

    # --- pass 1: index, with the checks that need recording order ---------------------------------

    def index(self) -> None:
        for event in self.events:
            match event:
                case Sent():
                    attempt = _Attempt(event)
                    self.attempts.append(attempt)
                    self.attempts_by_uid[event.msg_uid].append(attempt)
                    self.attempts_by_txn[event.txn].append(attempt)
                    if event.txn is not None:
                        self.txn_info(event.txn).op_times.append((event.seq, event.t))
                case SendOk() | SendFailed():
                    self.index_send_outcome(event)
                case TxnBegun():
                    self.txn_info(event.txn).op_times.append((event.seq, event.t))
                case TxnEnded():
                    self.txn_info(event.txn).ends.append(event)
                case Subscribed():
                    sub = self.subs[event.subscription, event.topic]
                    if sub.start is None:
                        sub.start, sub.from_earliest = event.t, event.from_earliest
                    self.consumer_topics[event.consumer, event.subscription].add(event.topic)
                case Received():
                    self.index_receive(event)
                case ReceiveTimedOut():
                    self.timeouts.append(event)
                case Acked():
                    self.acks.append(event)
                    if event.txn is not None:
                        self.txn_info(event.txn).op_times.append((event.seq, event.t))
                case Reset():
                    self.resets.append(event)
                    if event.seek:
                        self.last_seek[event.subscription] = event.t
                case Transformed():
                    self.links.append(event)
                    self.txn_info(event.txn)
                case FinalState():
                    self.index_drain(event)

    def index_send_outcome(self, event: SendOk | SendFailed) -> None:
        pending = [a for a in self.attempts_by_uid.get(event.msg_uid, ())
                   if not a.resolved and event.producer in (None, a.sent.producer)]
        what = "send_ok" if isinstance(event, SendOk) else "send_failed"
        by = "" if event.producer is None else f" by {event.producer}"
        if not pending:
            self.flag("malformed", f"msg {event.msg_uid}", f"{what} at t={event.t} without an unresolved send{by}",
                      event.msg_uid)
            return
        if event.producer is None and len(producers := {a.sent.producer for a in pending}) > 1:
            # Sends of one uid by two producers at once: which one this outcome belongs to is a
            # guess, and a wrong guess pins one txn's message on another txn.
            self.flag("malformed", f"msg {event.msg_uid}", f"{what} at t={event.t} names no producer, and "
                      f"{', '.join(sorted(producers))} have sends of it under way", event.msg_uid)
            return
        attempt = pending[0]
        attempt.resolved = True
        if isinstance(event, SendFailed):
            return
        mid, sent = event.message_id, attempt.sent
        if mid.topic != sent.topic or (sent.partition is not None and mid.partition != sent.partition):
            self.flag("malformed", f"msg {event.msg_uid}", f"send to {sent.topic}-{sent.partition} stored at {mid}",
                      event.msg_uid)
            return
        if not self.note_uid(mid, event.msg_uid, "send_ok"):
            return
        attempt.message_id, attempt.ok_t = mid, event.t
        self.attempt_by_mid.setdefault(mid, attempt)

    def index_receive(self, event: Received) -> None:
        mid = event.message_id
        if event.msg_uid not in self.sent_uids:
            self.flag("malformed", f"msg {event.msg_uid}", f"received as {mid} but never sent", event.msg_uid)
            return
        if (mid.topic, mid.partition) != (event.topic, event.partition):
            self.flag("malformed", f"receive {event.seq}", f"received on {event.topic}-{event.partition} as {mid}",
                      event.msg_uid)
            return
        if not self.note_uid(mid, event.msg_uid, "a receive"):
            return
        self.receives.append(event)
        sub = self.subs[event.subscription, event.topic]
        if sub.first_receive is None:
            sub.first_receive = event.t
        self.consumer_topics[event.consumer, event.subscription].add(event.topic)

    def index_drain(self, event: FinalState) -> None:
        kept, seen_ids = [], set()
        for drained in event.messages:
            mid = drained.message_id
            subject = f"drain of {event.subscription} on {event.topic}"
            if drained.msg_uid not in self.sent_uids:
                self.flag("malformed", f"msg {drained.msg_uid}", f"in the {subject} as {mid} but never sent",
                          drained.msg_uid)
            elif (mid.topic, mid.partition) != (event.topic, drained.partition) or (
                    event.partitions is not None and drained.partition not in event.partitions):
                self.flag("malformed", f"msg {drained.msg_uid}", f"{subject} lists {mid} under partition "
                          f"{drained.partition} (drained partitions {event.partitions})", drained.msg_uid)
            elif mid not in seen_ids and self.note_uid(mid, drained.msg_uid, f"the {subject}"):
                seen_ids.add(mid)  # the drain is a set of entries: a repeat is the reader's redelivery
                kept.append(drained)
        self.drained_uid[event.seq] = {d.message_id: d.msg_uid for d in kept}
        self.drains.append(FinalState(seq=event.seq, t=event.t, subscription=event.subscription, topic=event.topic,
                                      messages=tuple(kept), partitions=event.partitions))

    def validate_late(self) -> None:
        """Checks that need the whole history: acks and links may name ids recorded later."""
        valid_acks = []
        for ack in self.acks:
            if ack.message_id in self.uid_of_mid:
                valid_acks.append(ack)
            else:
                self.flag("malformed", f"ack {ack.seq}", f"{ack.consumer} on {ack.subscription} acked "
                          f"{ack.message_id}, an id never sent, received or drained")
        self.acks = valid_acks
        valid_links = []
        for link in self.links:
            bad = [uid for uid in link.output_msg_uids
                   if not any(a.txn == link.txn for a in self.attempts_by_uid.get(uid, ()))]
            if link.input_msg_uid not in self.attempts_by_uid:
                self.flag("malformed", f"msg {link.input_msg_uid}", "transform input never sent",
                          link.input_msg_uid, link.txn)
            elif bad:
                self.flag("malformed", f"transform of {link.input_msg_uid}", f"outputs {bad} never sent in "
                          f"{link.txn}", link.input_msg_uid, link.txn)
            else:
                valid_links.append(link)
        self.links = valid_links

    # --- attribution and txn outcomes ------------------------------------------------------------

    def candidates(self, uid: str, mid: MessageId) -> list[_Attempt]:
        """The attempts that could have stored ``mid`` (see the module doc)."""
        exact = self.attempt_by_mid.get(mid)
        if exact is not None:
            return [exact]
        on_topic = [a for a in self.attempts_by_uid.get(uid, ()) if a.sent.topic == mid.topic
                    and a.sent.partition in (None, mid.partition)]
        unconfirmed = [a for a in on_topic if a.message_id is None]
        return unconfirmed or on_topic

    def in_scope(self, name: str, attempt: _Attempt) -> bool:
        sub = self.subs[name, attempt.sent.topic]
        if name in self.last_seek:
            return attempt.sent.t > self.last_seek[name]
        if sub.start is not None:
            return sub.from_earliest or attempt.sent.t >= sub.start
        if sub.first_receive is not None:
            return attempt.sent.t >= sub.first_receive
        return True  # a subscription seen only in its final drain: a fresh reader from the earliest

    def index_consumption(self, effective: tuple[str, ...]) -> None:
        """Index the acks that count as consumption: plain ones and those of txns in ``effective``."""
        self.consumption = defaultdict(_Consumption)
        for ack in self.acks:
            if ack.txn is None or self.txns[ack.txn].state in effective:
                self.consumption[ack.subscription].add(ack)

    def consumed_in(self, name: str, uid: str) -> bool:
        """An ack indexed by ``index_consumption`` in subscription ``name`` covers one of ``uid``'s ids."""
        consumption = self.consumption.get(name)
        return consumption is not None and any(consumption.covers(mid) for mid in self.ids_of_uid.get(uid, ()))

    def resolve_txns(self) -> None:
        for ack in self.acks:
            self.acks_by_sub[ack.subscription].append(ack)
            if ack.txn is not None:
                self.acks_by_txn[ack.txn].append(ack)
        read_txns: set[Hashable] = set()  # txns one of whose messages was read: commit evidence
        reads = [(r.msg_uid, r.message_id) for r in self.receives]
        reads += [(d.msg_uid, d.message_id) for fs in self.drains for d in fs.messages]
        for uid, mid in reads:
            txns = {a.txn for a in self.candidates(uid, mid)}
            if len(txns) == 1 and None not in txns:
                read_txns.add(txns.pop())

        for info in self.txns.values():
            outcomes = {e.outcome for e in info.ends} - {"unknown"}
            commits = [e for e in info.ends if e.action is EndAction.COMMIT]
            # Without issued_at, the latest op issued in the txn before the commit was recorded
            # bounds the call from below.
            issued = [e.issued_at if e.issued_at is not None
                      else max((t for seq, t in info.op_times if seq < e.seq), default=-math.inf) for e in commits]
            info.commit_issued_at = min(issued, default=-math.inf)
            committed_ends = [e.t for e in info.ends if e.outcome == "committed"]
            info.committed_at = min(committed_ends, default=None)
            if len(outcomes) > 1:
                self.flag("malformed", f"txn {info.txn}", "recorded both committed and aborted", txn=info.txn)
                info.state, info.contradictory = UNDECIDED, True
            elif outcomes:
                info.state = outcomes.pop()
            elif info.never_ended or not commits:
                info.state = ABORTED  # no commit was ever issued: it ends aborted (by abort or timeout)
            elif info.txn in read_txns:
                info.state = COMMITTED
            else:
                info.state = UNDECIDED  # settled below if absences show it aborted
        self.index_consumption((COMMITTED,))  # the states still settling do not count as consumption
        for info in self.txns.values():
            if info.state == UNDECIDED and not info.contradictory and self.shows_abort(info.txn):
                info.state = ABORTED
        self.index_consumption((COMMITTED, UNDECIDED))

    def shows_abort(self, txn: Hashable) -> bool:
        """An undecided txn aborted if a drain that must show one of its stored messages lacks it,
        or still shows a message it acked. Only plain acks and decided txns count as consumption."""
        for fs in self.drains:
            uids = {d.msg_uid for d in fs.messages}
            for attempt in self.attempts_by_txn.get(txn, ()):
                if self.drain_must_show(fs, attempt) and attempt.uid not in uids:
                    if not self.consumed_in(fs.subscription, attempt.uid):
                        return True
            seek = self.last_seek.get(fs.subscription)
            acks = [a for a in self.acks_by_txn.get(txn, ())
                    if a.subscription == fs.subscription and (seek is None or a.t > seek)]
            if self.drain_has_acked(fs, acks):
                return True
        return False

    def drain_has_acked(self, fs: FinalState, acks: list[Acked]) -> list[tuple[Acked, MessageId, str]]:
        """The (ack, id, uid) of messages in ``fs`` that one of ``acks`` covers."""
        found = []
        for ack in acks:
            if not ack.cumulative:
                uid = self.drained_uid[fs.seq].get(ack.message_id)
                if uid is not None:
                    found.append((ack, ack.message_id, uid))
            else:
                found.extend((ack, d.message_id, d.msg_uid) for d in fs.messages if _covers(ack, d.message_id))
        return found

    def drain_must_show(self, fs: FinalState, attempt: _Attempt) -> bool:
        """``attempt`` is stored, in ``fs``'s scope and on a drained partition (ignoring acks)."""
        mid = attempt.message_id
        return (mid is not None and mid.topic == fs.topic and (fs.partitions is None or mid.partition in fs.partitions)
                and self.in_scope(fs.subscription, attempt))

    def must_be_visible(self, attempt: _Attempt) -> bool:
        return attempt.message_id is not None and (attempt.txn is None or self.txns[attempt.txn].state == COMMITTED)

    def verdict(self, cands: list[_Attempt], at: float | None) -> str:
        """"ok", "uncommitted" or "aborted" for a read at ``at`` (None: a final drain) of a message
        that one of ``cands`` stored: the most innocent explanation wins."""
        found = set()
        for attempt in cands:
            if attempt.txn is None:
                return "ok"
            info = self.txns[attempt.txn]
            if info.state in (COMMITTED, UNDECIDED):
                if at is not None and at < info.commit_issued_at:
                    found.add("uncommitted")
                else:
                    return "ok"
            else:
                found.add("uncommitted" if info.never_ended else "aborted")
        return "uncommitted" if "uncommitted" in found else "aborted" if found else "ok"

    # --- the checks ------------------------------------------------------------------------------

    def check_reads(self) -> None:
        for r in self.receives:
            cands = self.candidates(r.msg_uid, r.message_id)
            verdict = self.verdict(cands, r.t)
            txns = sorted({str(a.txn) for a in cands})
            where = f"{r.consumer} on {r.subscription} received {r.message_id} at t={r.t}"
            if verdict == "aborted":
                self.flag("aborted_read", f"msg {r.msg_uid}", f"{where}, but {', '.join(txns)} aborted",
                          r.msg_uid, cands[0].txn)
            elif verdict == "uncommitted":
                issued = ", ".join(f"{a.txn} commit issued at t={self.txns[a.txn].commit_issued_at}"
                                   if self.txns[a.txn].ends else f"{a.txn} never ended" for a in cands)
                self.flag("uncommitted_read", f"msg {r.msg_uid}", f"{where}, but {issued}", r.msg_uid, cands[0].txn)

    def check_drains(self) -> None:
        for fs in self.drains:
            where = f"drain of {fs.subscription} on {fs.topic}"
            present_uids = {d.msg_uid for d in fs.messages}
            present_txns: set[Hashable] = set()
            for d in fs.messages:
                cands = self.candidates(d.msg_uid, d.message_id)
                present_txns.update(a.txn for a in cands)
                verdict = self.verdict(cands, None)
                if verdict == "aborted":
                    txn = cands[0].txn
                    self.flag("torn", f"txn {txn} in {where}", f"aborted, yet {d.msg_uid} ({d.message_id}) is there",
                              d.msg_uid, txn)
                elif verdict == "uncommitted":
                    self.flag("uncommitted_read", f"msg {d.msg_uid}", f"in the {where} ({d.message_id}) but "
                              f"{cands[0].txn} never ended", d.msg_uid, cands[0].txn)
            missing_by_txn: dict[Hashable, list[_Attempt]] = defaultdict(list)
            for attempt in self.attempts:
                if (self.must_be_visible(attempt) and self.drain_must_show(fs, attempt)
                        and attempt.uid not in present_uids and not self.consumed_in(fs.subscription, attempt.uid)):
                    missing_by_txn[attempt.txn].append(attempt)
            for txn, missing in missing_by_txn.items():
                if txn is not None and txn in present_txns:
                    uids = ", ".join(a.uid for a in missing)
                    self.flag("torn", f"txn {txn} in {where}", f"committed, partly visible: missing {uids}",
                              missing[0].uid, txn)
                    continue
                for attempt in missing:
                    how = "plain send acknowledged" if txn is None else f"{txn} committed"
                    self.flag("lost", f"msg {attempt.uid} on {fs.subscription}",
                              f"{how} (stored at {attempt.message_id}), not consumed, missing from the {where}",
                              attempt.uid, txn)

    def check_duplicates(self) -> None:
        # (a) one logical message visible under two ids
        counted: dict[str, set[MessageId]] = defaultdict(set)
        reads = [(r.msg_uid, r.message_id) for r in self.receives]
        reads += [(d.msg_uid, d.message_id) for fs in self.drains for d in fs.messages]
        for uid, mid in reads:
            if self.verdict(self.candidates(uid, mid), None) == "ok":
                counted[uid].add(mid)
        for attempt in self.attempts:
            if self.must_be_visible(attempt):
                counted[attempt.uid].add(attempt.message_id)
        for uid, ids in counted.items():
            if len(ids) > 1:
                self.flag("duplicate", f"msg {uid}", f"stored and visible under {len(ids)} ids: "
                          f"{', '.join(map(str, sorted(ids)))}", uid)
        # (b) one input consumed in two committed txns (per subscription: two subscriptions are two
        # independent consumers)
        committed_by_input: dict[tuple[str | None, str], set[Hashable]] = defaultdict(set)
        for ack in self.acks:
            if ack.txn is not None and not ack.cumulative and self.txns[ack.txn].state == COMMITTED:
                committed_by_input[ack.subscription, self.uid_of_mid[ack.message_id]].add(ack.txn)
        for link in self.links:
            if self.txns[link.txn].state == COMMITTED:
                committed_by_input[self.link_subscription(link), link.input_msg_uid].add(link.txn)
        for (name, uid), txns in committed_by_input.items():
            if len(txns) > 1:
                self.flag("duplicate", f"input {uid} on {name}", f"consumed in {len(txns)} committed txns: "
                          f"{', '.join(sorted(map(str, txns)))}", uid, next(iter(txns)))
        # (c) consumed in a committed txn, yet still in the backlog
        for fs in self.drains:
            last_seek = self.last_seek.get(fs.subscription)
            acks = [ack for ack in self.acks_by_sub.get(fs.subscription, ())
                    if ack.txn is not None and self.txns[ack.txn].state == COMMITTED
                    and (last_seek is None or ack.t > last_seek)]
            for ack, mid, uid in self.drain_has_acked(fs, acks):
                self.flag("duplicate", f"input {uid} on {fs.subscription}",
                          f"acked in committed {ack.txn}, still in the drain ({mid})", uid, ack.txn)

    def link_subscription(self, link: Transformed) -> str | None:
        """The subscription a transform consumed its input on: named, or the one its txn acked it on."""
        if link.subscription is not None:
            return link.subscription
        ids = self.ids_of_uid.get(link.input_msg_uid, ())
        names = {ack.subscription for ack in self.acks_by_txn.get(link.txn, ())
                 if any(_covers(ack, mid) for mid in ids)}
        return names.pop() if len(names) == 1 else None

    def check_order(self) -> None:
        seen_in_sub: dict[tuple[str, str], set[MessageId]] = defaultdict(set)
        last_first: dict[tuple[str, str, str, int], MessageId] = {}  # stream -> highest first delivery
        by_seq: list[Received | Reset] = sorted([*self.receives, *self.resets], key=lambda e: e.seq)
        for event in by_seq:
            if isinstance(event, Reset):
                for stream in [s for s in last_first if s[:2] == (event.subscription, event.consumer)]:
                    del last_first[stream]
                continue
            if event.subscription in self.key_shared:
                continue
            mid, seen = event.message_id, seen_in_sub[event.subscription, event.topic]
            redelivered = event.redelivery_count > 0 or mid in seen
            seen.add(mid)
            if redelivered:
                continue
            stream = (event.subscription, event.consumer, event.topic, event.partition)
            previous = last_first.get(stream)
            if previous is not None and mid < previous:
                self.flag("order", f"msg {event.msg_uid} on {event.subscription}",
                          f"{event.consumer} got {mid} (first delivery) after {previous}", event.msg_uid)
            else:
                last_first[stream] = mid

    def check_stuck(self) -> None:
        receive_times: dict[tuple[str, str], list[float]] = defaultdict(list)  # (sub, topic) -> times
        first_receive: dict[tuple[str, str], float] = {}  # (sub, uid) -> first time the subscription got it
        served: dict[tuple[str, str, str], set[int]] = defaultdict(set)  # (consumer, sub, topic) -> partitions
        for r in self.receives:
            receive_times[r.subscription, r.topic].append(r.t)
            first_receive[r.subscription, r.msg_uid] = min(r.t, first_receive.get((r.subscription, r.msg_uid), r.t))
            served[r.consumer, r.subscription, r.topic].add(r.partition)
        for times in receive_times.values():
            times.sort()
        drained_uids: dict[tuple[str, str], set[str]] = defaultdict(set)
        for fs in self.drains:
            drained_uids[fs.subscription, fs.topic].update(d.msg_uid for d in fs.messages)
        attempts_by_topic: dict[str, list[_Attempt]] = defaultdict(list)
        for attempt in self.attempts:
            attempts_by_topic[attempt.sent.topic].append(attempt)

        # Per subscription and topic: every message's wait [visible, first received) (open-ended when
        # only the drain shows it), sorted by start, with the running max of the ends, so that an
        # ask at b finds "some message visible before b - limit and still waiting at b" by bisection.
        waits: dict[tuple[str, str], tuple[list[float], list[float], list[tuple[float, float, _Attempt]]]] = {}

        def waits_of(key: tuple[str, str]) -> tuple[list[float], list[float], list[tuple[float, float, _Attempt]]]:
            if key not in waits:
                rows = []
                for attempt in attempts_by_topic.get(key[1], ()):
                    visible = self.visible_at(attempt)
                    if visible is None or not self.in_scope(key[0], attempt):
                        continue
                    first = first_receive.get((key[0], attempt.uid))
                    if first is None and attempt.uid not in drained_uids[key]:
                        continue  # never shown to this subscription: no proof it was deliverable
                    rows.append((visible, math.inf if first is None else first, attempt))
                rows.sort(key=lambda row: row[0])
                running_max, highest = [], -math.inf
                for _, until, _ in rows:
                    highest = max(highest, until)
                    running_max.append(highest)
                waits[key] = ([row[0] for row in rows], running_max, rows)
            return waits[key]

        for ask in sorted(self.timeouts, key=lambda e: e.t):
            topics = [ask.topic] if ask.topic else sorted(self.consumer_topics[ask.consumer, ask.subscription])
            for topic in topics:
                key = (ask.subscription, topic)
                sub, times = self.subs[key], receive_times[key]
                i = bisect.bisect_right(times, ask.t)
                quiet_since = times[i - 1] if i else (sub.start if sub.start is not None else sub.first_receive)
                if quiet_since is None or ask.t - quiet_since <= self.stuck_after_s:
                    continue
                starts, running_max, rows = waits_of(key)
                waiting = bisect.bisect_left(starts, ask.t - self.stuck_after_s)
                if not waiting or running_max[waiting - 1] <= ask.t:
                    continue
                partitions = served.get((ask.consumer, ask.subscription, topic))
                for visible, until, attempt in rows[:waiting]:
                    if until > ask.t and (not partitions or attempt.message_id.partition in partitions):
                        self.flag("stuck", f"subscription {ask.subscription} on {topic} since t={quiet_since}",
                                  f"{ask.consumer} got nothing at t={ask.t} while {attempt.uid} "
                                  f"({attempt.message_id}) had waited since t={max(visible, quiet_since)}: "
                                  f"{ask.t - max(visible, quiet_since):.3f}s > {self.stuck_after_s}s",
                                  attempt.uid, attempt.txn)
                        break

    def visible_at(self, attempt: _Attempt) -> float | None:
        """When ``attempt`` was certainly readable (None: not certain at any recorded time)."""
        if attempt.message_id is None:
            return None
        if attempt.txn is None:
            return attempt.ok_t
        info = self.txns[attempt.txn]
        if info.state != COMMITTED or info.committed_at is None:
            return None
        return max(info.committed_at, attempt.ok_t)
