"""Property test of the coordinator state machine: random operations with restarts in between
(log encoded to bytes, decoded and replayed into a fresh state, sometimes after a checkpoint that
let the ended transactions' records go) must answer exactly like a simple dict-based model, and
never hand out a sequence twice."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raytxn.errors import (
    ConcurrentTransactions,
    Fenced,
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    RaytxnError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionNotFound,
    TransactionTimedOut,
)
from raytxn.ids import TxnID
from raytxn.protocol.coordinator_state import CoordinatorState, EndResult
from raytxn.protocol.txnlog import (
    AbortReason,
    Checkpoint,
    EndAction,
    Record,
    RegisterTransactionalId,
    TxnState,
    UpdateState,
    decode_record,
    encode_record,
)

TC = 3
MAX_TIMEOUT_MS = 1000
MAX_RECENT_OUTCOMES = 2  # small, so that forgetting (and replaying what was forgotten) happens
OWNERS = ["a", "b"]
TIDS = ["x", "y"]
PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]
SUBSCRIPTIONS = [("t", 0, "s"), ("u", 0, "s"), ("u", 0, "r")]
FINAL = (TxnState.COMMITTED, TxnState.ABORTED)
WRONG_OWNER = st.sampled_from([False, False, False, True])
EPOCH_MODE = st.sampled_from(["implied", "implied", "implied", "current", "old", "future"])


@dataclass
class ModelTxn:
    owner: str
    deadline: int
    tid: str | None
    epoch: int | None
    state: TxnState = TxnState.OPEN
    reason: AbortReason | None = None
    participants: dict[str, list] = field(default_factory=lambda: {"partitions": [], "subscriptions": []})

    @property
    def committed(self) -> bool:
        return self.state in (TxnState.COMMITTING, TxnState.COMMITTED)

    def ended_error(self) -> type[RaytxnError]:
        if self.committed:
            return TransactionAlreadyCommitted
        return {AbortReason.TIMEOUT: TransactionTimedOut, AbortReason.FENCED: Fenced}.get(
            self.reason, TransactionAlreadyAborted)


class Model:
    """What the coordinator should answer: a dict of every txn ever opened, never forgetting."""

    def __init__(self) -> None:
        self.txns: dict[int, ModelTxn] = {}
        self.epochs: dict[str, int] = {}
        self.next_seq = 0  # durable counter: one above the last logged NewTxn (or checkpoint)
        self.reserved = 0  # handed out by a prepare never logged; lost on a restart without checkpoint
        self.completed: list[int] = []  # sequences in the order they finished

    def remembered(self, seq: int) -> bool:
        return seq in self.completed[-MAX_RECENT_OUTCOMES:]

    def open_of(self, tid: str) -> int | None:
        return next((s for s, t in self.txns.items() if t.tid == tid and t.state is TxnState.OPEN), None)

    def new_txn(self, now: int, timeout: int, tid: str | None, epoch: int | None) -> type | int:
        if not 0 < timeout <= MAX_TIMEOUT_MS:
            return InvalidArgument
        if tid is not None:
            if tid not in self.epochs or epoch != self.epochs[tid]:
                return Fenced
            if self.open_of(tid) is not None:
                return ConcurrentTransactions
        return max(self.next_seq, self.reserved)

    def check_live(self, seq: int, owner: str, epoch: int | None, now: int, end: EndAction | None) -> object:
        """The answer of a request needing ``seq`` (None: go on), with ``end`` for prepare_end."""
        txn = self.txns.get(seq)
        final = txn is not None and txn.state in FINAL
        if txn is None or (final and not self.remembered(seq)):
            return TransactionNotFound
        if not final:
            if owner != txn.owner:
                return NotAllowed
            if txn.tid is None and epoch is not None:
                return InvalidArgument
            if txn.tid is not None and (txn.epoch if epoch is None else epoch) != self.epochs[txn.tid]:
                return Fenced
        if txn.state is not TxnState.OPEN:
            if end is not None and (end is EndAction.COMMIT) == txn.committed and txn.reason is not AbortReason.FENCED:
                return EndResult(None, txn.state)
            return txn.ended_error()
        if now >= txn.deadline and end is not EndAction.ABORT:
            return TransactionTimedOut
        return None


def outcome_or_error(call) -> object:
    try:
        return call()
    except RaytxnError as error:
        return type(error)


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = self.fresh_state()
        self.model = Model()
        self.log: list[bytes] = []
        self.now = 0
        self.issued: list[int] = []  # every sequence handed out, across restarts

    @staticmethod
    def fresh_state() -> CoordinatorState:
        return CoordinatorState(TC, max_timeout_ms=MAX_TIMEOUT_MS, max_recent_outcomes=MAX_RECENT_OUTCOMES)

    def log_apply(self, *records: Record | None) -> None:
        for record in records:
            if record is not None:
                self.log.append(encode_record(record))
                self.state.apply(record)

    def pick_txn(self, choice: int) -> int:
        """Mostly a txn the model knows (live ones first), sometimes one never opened."""
        known = sorted(self.model.txns, key=lambda s: (self.model.txns[s].state in FINAL, s))
        if not known or choice % 8 == 0:
            return self.model.next_seq + choice % 3
        return known[choice % min(len(known), 4 if choice % 3 else len(known))]

    def pick_owner(self, seq: int, wrong: bool) -> str:
        txn = self.model.txns.get(seq)
        return "mallory" if wrong or txn is None else txn.owner

    def pick_epoch(self, seq: int, mode: str) -> int | None:
        txn = self.model.txns.get(seq)
        if mode == "implied" or txn is None:
            return None
        base = self.model.epochs.get(txn.tid, 0) if txn.tid is not None else 0
        return base + {"old": -1, "current": 0, "future": 1}[mode]

    # --- operations ------------------------------------------------------------------------

    @initialize()
    def a_few_txns(self) -> None:
        """Start every run with material: a registered id and three open txns, one under it."""
        self.register("x")
        self.new_txn("a", MAX_TIMEOUT_MS, None, False)
        self.new_txn("b", 60, "x", False)
        self.new_txn("a", 20, None, False)

    @rule(owner=st.sampled_from(OWNERS), timeout=st.sampled_from([20, 60, 200, 200, 0, MAX_TIMEOUT_MS + 1]),
          tid=st.sampled_from([None, None, *TIDS]), stale=st.booleans())
    def new_txn(self, owner: str, timeout: int, tid: str | None, stale: bool) -> None:
        epoch = None if tid is None else self.model.epochs.get(tid, 0) - stale
        expected = self.model.new_txn(self.now, timeout, tid, epoch)
        actual = outcome_or_error(lambda: self.state.prepare_new_txn(self.now, timeout, owner, tid, epoch))
        if isinstance(expected, type):
            assert actual is expected
            return
        assert actual.txn == TxnID(TC, expected)
        assert not self.issued or expected > self.issued[-1], "sequence reused"
        self.issued.append(expected)
        self.log_apply(actual)
        self.model.txns[expected] = ModelTxn(owner, self.now + timeout, tid, epoch)
        self.model.next_seq = self.model.reserved = expected + 1

    @rule()
    def abandon_new_txn(self) -> None:
        """A NewTxn prepared but never logged (the log write failed): its sequence is skipped."""
        record = self.state.prepare_new_txn(self.now, 100, "a")
        assert record.txn.sequence == max(self.model.next_seq, self.model.reserved)
        self.model.reserved = record.txn.sequence + 1

    @rule(choice=st.integers(0, 10**6), kind=st.sampled_from(["partitions", "subscriptions"]),
          picks=st.lists(st.integers(0, 2), min_size=1, max_size=3), wrong_owner=WRONG_OWNER, mode=EPOCH_MODE)
    def add(self, choice: int, kind: str, picks: list[int], wrong_owner: bool, mode: str) -> None:
        seq = self.pick_txn(choice)
        owner = self.pick_owner(seq, wrong_owner)
        items = [(PARTITIONS if kind == "partitions" else SUBSCRIPTIONS)[i] for i in picks]
        epoch = self.pick_epoch(seq, mode)
        prepare = self.state.prepare_add_partitions if kind == "partitions" else \
            self.state.prepare_add_subscriptions
        actual = outcome_or_error(lambda: prepare(TxnID(TC, seq), items, owner, self.now, epoch))
        expected = self.model.check_live(seq, owner, epoch, self.now, None)
        if expected is not None:
            assert actual is expected
            return
        known = self.model.txns[seq].participants[kind]
        added = list(dict.fromkeys(item for item in items if item not in known))
        if not added:
            assert actual is None
            return
        assert list(getattr(actual, kind)) == added
        self.log_apply(actual)
        known.extend(added)

    @rule(choice=st.integers(0, 10**6), action=st.sampled_from(list(EndAction)),
          wrong_owner=WRONG_OWNER, mode=EPOCH_MODE)
    def end(self, choice: int, action: EndAction, wrong_owner: bool, mode: str) -> None:
        seq = self.pick_txn(choice)
        owner = self.pick_owner(seq, wrong_owner)
        epoch = self.pick_epoch(seq, mode)
        actual = outcome_or_error(lambda: self.state.prepare_end(TxnID(TC, seq), action, owner, self.now, epoch))
        expected = self.model.check_live(seq, owner, epoch, self.now, action)
        if expected is not None:
            assert actual == expected
            return
        txn = self.model.txns[seq]
        if action is EndAction.COMMIT:
            txn.state, txn.reason = TxnState.COMMITTING, None
        else:
            txn.state = TxnState.ABORTING
            txn.reason = AbortReason.TIMEOUT if self.now >= txn.deadline else AbortReason.CLIENT
        assert actual == EndResult(UpdateState(TxnID(TC, seq), txn.state, self.now, txn.reason), txn.state)
        self.log_apply(actual.record)

    @rule(choice=st.integers(0, 10**6))
    def complete(self, choice: int) -> None:
        seq = self.pick_txn(choice)
        actual = outcome_or_error(lambda: self.state.prepare_complete(TxnID(TC, seq), self.now))
        txn = self.model.txns.get(seq)
        if txn is None or (txn.state in FINAL and not self.model.remembered(seq)):
            assert actual is TransactionNotFound
        elif txn.state is TxnState.OPEN:
            assert actual is InvalidTxnState
        elif txn.state in FINAL:
            assert actual is None
        else:
            txn.state = TxnState.COMMITTED if txn.committed else TxnState.ABORTED
            assert actual == UpdateState(TxnID(TC, seq), txn.state, self.now, txn.reason)
            self.log_apply(actual)
            self.model.completed.append(seq)

    @rule(delta=st.sampled_from([0, 5, 30, 100]))
    def advance(self, delta: int) -> None:
        # The timer fires in its own step: requests in between must still see the timeout.
        self.now += delta

    @rule()
    def fire_timers(self) -> None:
        due = sorted((t.deadline, s) for s, t in self.model.txns.items()
                     if t.state is TxnState.OPEN and t.deadline <= self.now)
        assert self.state.expired(self.now) == [TxnID(TC, s) for _, s in due]
        for _, seq in due:
            self.log_apply(self.state.prepare_timeout(TxnID(TC, seq), self.now))
            self.model.txns[seq].state, self.model.txns[seq].reason = TxnState.ABORTING, AbortReason.TIMEOUT

    @rule(tid=st.sampled_from(TIDS))
    def register(self, tid: str) -> None:
        records = self.state.prepare_register_transactional_id(tid, self.now)
        open_seq = self.model.open_of(tid)
        if open_seq is not None:
            txn = self.model.txns[open_seq]
            txn.state, txn.reason = TxnState.ABORTING, AbortReason.FENCED
        self.model.epochs[tid] = self.model.epochs.get(tid, -1) + 1
        expected: list[Record] = [RegisterTransactionalId(tid, self.model.epochs[tid], self.now)]
        if open_seq is not None:
            expected.insert(0, UpdateState(TxnID(TC, open_seq), TxnState.ABORTING, self.now, AbortReason.FENCED))
        assert records == expected
        self.log_apply(*records)

    @rule(mode=st.sampled_from(["replay", "checkpoint", "checkpoint-drop-registers", "compact"]))
    def restart(self, mode: str) -> None:
        if mode.startswith("checkpoint"):
            self.log = self.trimmed_log(drop_registers=mode.endswith("registers"))
        elif mode == "compact":
            self.log = [encode_record(record) for record in self.state.compacted_records()]
        if mode == "replay":  # an unlogged reservation is forgotten: that sequence was never used
            self.model.reserved = self.model.next_seq
        else:  # a checkpoint covers the reservations too
            self.model.next_seq = max(self.model.next_seq, self.model.reserved)
        before = self.snapshot()
        stats_before = self.state.stats(self.now)
        self.state = self.fresh_state()
        self.state.replay(decode_record(data) for data in self.log)
        assert self.snapshot() == before  # sequence counter and watermark: see the invariant
        if mode == "replay":  # totals count what the log holds: equal only when nothing was trimmed
            assert self.state.stats(self.now) == stats_before

    def trimmed_log(self, drop_registers: bool) -> list[bytes]:
        """Log a checkpoint, then drop the records before it of txns ended before it."""
        checkpoint = self.state.prepare_checkpoint()
        lowest_live = self.state.min_live_sequence()
        keep_from = checkpoint.next_sequence if lowest_live is None else lowest_live
        kept = []
        for data in self.log:
            record = decode_record(data)
            if isinstance(record, Checkpoint) or (drop_registers and isinstance(record, RegisterTransactionalId)):
                continue
            txn = getattr(record, "txn", None)
            if txn is None or txn.sequence >= keep_from:
                kept.append(data)
        self.log_apply(checkpoint)
        return [*kept, self.log[-1]]

    # --- checks ----------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self.state.live_txns(), self.state.transactional_ids(), self.state.recent_outcomes(),
                self.state.next_deadline_ms())

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.state.check_invariants()
        live = {s: t for s, t in self.model.txns.items() if t.state not in FINAL}
        assert {m.txn.sequence: (m.state, m.abort_reason) for m in self.state.live_txns()} == \
            {s: (t.state, t.reason) for s, t in live.items()}
        for meta in self.state.live_txns():
            participants = self.model.txns[meta.txn.sequence].participants
            assert list(meta.partitions) == participants["partitions"]
            assert list(meta.subscriptions) == participants["subscriptions"]
        assert self.state.transactional_ids() == self.model.epochs
        assert self.state.low_watermark == min(live, default=self.model.next_seq) - 1
        assert self.state.next_sequence == self.model.next_seq
        assert [seq for seq, _ in self.state.recent_outcomes()] == self.model.completed[-MAX_RECENT_OUTCOMES:]


CoordinatorMachine.TestCase.settings = settings(
    max_examples=250, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCoordinatorProperties = CoordinatorMachine.TestCase
