"""A live workload for the restart tests: everything a user runs, recorded for the exactly-once
checker while the engine's actors are restarted under it.

- a plain producer and a transactional one (two messages a transaction) write to ``<run>-in``;
- the Shared subscription ``shared`` (two consumers, plain acks), the Exclusive subscription
  ``excl`` (its consumer acks what it received in one transaction at a time) and the pipeline
  ``pipe`` (consume-transform-produce: each input becomes ``o-<uid>`` on ``<run>-out``, acked in
  the same transaction) read it.

``stop`` stops the producers, lets the consumers take what is left, and closes them; ``check``
drains every subscription (and ``<run>-out`` through a new one) and returns the checker's report.
Every delivery's time is kept per consumer: ``longest_gaps`` is how long each went without one
while the producers ran, the stall the restart tests bound by the transaction timeout.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from typing import Any

import raytxn as rt
from raytxn.errors import RaytxnError, Timeout, TransactionAlreadyAborted, TransactionTimedOut
from raytxn.tools.chaos import drain_into, evidence
from raytxn.tools.checker import Report, check
from raytxn.tools.history import History

MAX_BATCH = 10  # messages one transaction of ``excl`` or ``pipe`` acks at most
MAX_NOTES = 2000
IDLE_S = 3.0    # after the producers stop: consumers that received nothing this long are done
SETTLE_LIMIT_S = 120.0


class LiveWorkload:
    def __init__(self, client: rt.Client, partitions: int = 2, txn_timeout_s: float = 15.0,
                 period_s: float = 0.2) -> None:
        self.client = client
        self.run = f"rr-{uuid.uuid4().hex[:6]}"
        self.source, self.sink = f"{self.run}-in", f"{self.run}-out"
        client.create_topic(self.source, partitions)
        client.create_topic(self.sink, 1)
        self.txn_timeout_s = txn_timeout_s
        self.period_s = period_s
        self.history = History()
        self.deliveries: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter[str] = Counter()
        self.notes: deque[tuple] = deque(maxlen=MAX_NOTES)  # (t, thread, txn, where, error)
        self._producing = threading.Event()
        self._consuming = threading.Event()
        self._lock = threading.Lock()
        self.began = self.producers_stopped = 0.0
        self._phases: list[tuple[str, float]] = []
        self._consumers: dict[str, tuple[str, Any]] = {}  # name -> (subscription, consumer)
        for name, sub, kind in (("w0", "shared", rt.ConsumerType.Shared), ("w1", "shared", rt.ConsumerType.Shared),
                                ("x", "excl", rt.ConsumerType.Exclusive), ("p", "pipe", rt.ConsumerType.Exclusive)):
            consumer = client.subscribe(self.source, sub, consumer_type=kind, consumer_name=name,
                                        initial_position=rt.InitialPosition.Earliest)
            self.history.subscribe(name, sub, self.source, time.monotonic(), from_earliest=True)
            self._consumers[name] = (sub, consumer)
        self._producer_threads = [threading.Thread(target=self._guard(self._plain), daemon=True),
                                  threading.Thread(target=self._guard(self._transactional), daemon=True)]
        self._consumer_threads = [threading.Thread(target=self._guard(self._consume, name), daemon=True)
                                  for name in self._consumers]

    # --- running -----------------------------------------------------------------------------

    def start(self) -> None:
        self.began = time.monotonic()
        self.phase("start")
        for thread in [*self._producer_threads, *self._consumer_threads]:
            thread.start()

    def wait_for_deliveries(self, count: int = 3, timeout_s: float = 120.0) -> None:
        """Until every consumer has had ``count`` deliveries (the workload runs everywhere)."""
        deadline = time.monotonic() + timeout_s
        while min(len(self.deliveries[name]) for name in self._consumers) < count:
            assert time.monotonic() < deadline, f"the workload did not start: {dict(self.deliveries)} {self.errors}"
            time.sleep(0.1)

    def wait_for_more_deliveries(self, more: int = 3, timeout_s: float = 120.0) -> None:
        """Until every consumer has had ``more`` deliveries beyond those it had at the call (each
        counted against its own: the Shared subscription's two consumers share its messages, so
        a count taken from the Exclusive consumer outruns theirs on a long phase)."""
        seen = {name: len(self.deliveries[name]) for name in self._consumers}
        deadline = time.monotonic() + timeout_s
        while any(len(self.deliveries[name]) < seen[name] + more for name in self._consumers):
            assert time.monotonic() < deadline, f"the workload stalled: {dict(self.deliveries)} {self.errors}"
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop producing, let the consumers take what is left (until none got anything for
        ``IDLE_S``), stop them and close them."""
        self._producing.set()
        for thread in self._producer_threads:
            thread.join(timeout=180)
            assert not thread.is_alive(), "a producer did not stop"
        self.producers_stopped = time.monotonic()
        deadline = self.producers_stopped + SETTLE_LIMIT_S
        while time.monotonic() < deadline:
            last = max((times[-1] for times in self.deliveries.values() if times), default=0.0)
            if time.monotonic() - max(last, self.producers_stopped) > IDLE_S:
                break
            time.sleep(0.2)
        self._consuming.set()
        for thread in self._consumer_threads:
            thread.join(timeout=180)
            assert not thread.is_alive(), "a consumer did not stop"
        for _sub, consumer in self._consumers.values():
            consumer.close()

    def phase(self, name: str) -> None:
        """Mark the start of a phase (a rolling restart, a kill): ``gaps_by_phase`` reports each."""
        self._phases.append((name, time.monotonic()))

    def _gaps(self, name: str) -> list[tuple[float, float]]:
        """(from, to) of every stretch without a delivery, from the consumer's first delivery to
        the producers' stop (while there was always something to deliver)."""
        points = [*(t for t in self.deliveries[name] if t <= self.producers_stopped), self.producers_stopped]
        return list(itertools.pairwise(points))

    def longest_gaps(self) -> dict[str, float]:
        """Per consumer, the longest time without a delivery while the producers ran."""
        return {name: max((b - a for a, b in self._gaps(name)), default=0.0) for name in self._consumers}

    def gaps_by_phase(self) -> dict[str, dict[str, float]]:
        """Per phase, per consumer, the longest stretch without a delivery overlapping it."""
        bounds = [*self._phases, ("stop", self.producers_stopped)]
        return {phase: {name: round(max((b - a for a, b in self._gaps(name) if b > start and a < end), default=0.0), 1)
                        for name in self._consumers}
                for (phase, start), (_, end) in itertools.pairwise(bounds)}

    def evidence(self, report: Report) -> list[str]:
        """What the client did and the ledgers hold about ``report``'s anomalies."""
        return evidence(self.client, self.history, report.anomalies(), self.notes)

    def check(self) -> Report:
        """Drain every subscription (the sink through a new one) and judge the history."""
        for sub, kind in (("shared", rt.ConsumerType.Shared), ("excl", rt.ConsumerType.Exclusive),
                          ("pipe", rt.ConsumerType.Exclusive)):
            drain_into(self.history, self.client, self.source, sub, time.monotonic, kind)
        drain_into(self.history, self.client, self.sink, "verify", time.monotonic)
        return check(self.history, txn_timeout_s=self.txn_timeout_s)

    # --- the threads -------------------------------------------------------------------------

    def _guard(self, work: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                work(*args)
            except BaseException as e:  # a thread's crash fails the test through ``errors``
                self._note(f"thread crashed: {e!r}")
                raise
        return run

    def _note(self, what: BaseException | str, txn: Any = None, where: str = "") -> None:
        """Count an error; keep it for the evidence (``chaos.evidence``) of a failed check."""
        with self._lock:
            self.errors[what if isinstance(what, str) else type(what).__name__] += 1
            self.notes.append((time.monotonic() - self.began, threading.current_thread().name,
                               None if txn is None else txn.id, where, repr(what)[:300]))

    def _plain(self) -> None:
        producer = self.client.create_producer(self.source, producer_name=f"{self.run}-plain", send_timeout_s=120)
        i = 0
        while not self._producing.is_set():
            try:
                self._send(producer, self.source, f"plain-{i}", f"plain-{i}", None)
            except RaytxnError as e:
                self._note(e)
            i += 1
            time.sleep(self.period_s)
        producer.close()

    def _transactional(self) -> None:
        producer = self.client.create_producer(self.source, producer_name=f"{self.run}-txn", send_timeout_s=120)
        i = 0
        while not self._producing.is_set():
            try:
                txn = self.client.new_transaction(timeout=self.txn_timeout_s)
            except RaytxnError as e:
                self._note(e)
                continue
            self.history.txn_begin(txn.id, time.monotonic())
            try:
                for j in range(2):
                    self._send(producer, self.source, f"txn-{i}-{j}", f"txn-{i}-{j}", txn)
            except RaytxnError as e:
                self._note(e, txn, "send")
                self._abort(txn)
            else:
                self._commit(txn)
            i += 1
            time.sleep(self.period_s * 2)
        producer.close()

    def _consume(self, name: str) -> None:
        sub, consumer = self._consumers[name]
        sink = (self.client.create_producer(self.sink, producer_name=f"{self.run}-pipe", send_timeout_s=120)
                if sub == "pipe" else None)
        rewinds = 0
        while not self._consuming.is_set():
            try:
                batch = [consumer.receive(timeout=1)]
            except Timeout:
                self.history.receive_timeout(name, sub, time.monotonic(), topic=self.source)
                continue
            except RaytxnError as e:
                self._note(e)
                continue
            while sub != "shared" and len(batch) < MAX_BATCH:
                try:
                    batch.append(consumer.receive(timeout=0))
                except Timeout:
                    break
            if consumer.rewinds_seen != rewinds:  # the subscription restarted: its order starts over
                rewinds = consumer.rewinds_seen
                self.history.reset(name, sub, time.monotonic())
            for msg in batch:
                now = time.monotonic()
                self.history.receive(name, sub, self.source, msg.message_id().partition, msg.message_id(),
                                     msg.value().decode(), msg.redelivery_count(), now)
                self.deliveries[name].append(now)
            if sub == "shared":
                self._ack_plain(name, consumer, batch[0])
            else:
                self._ack_in_txn(name, sub, consumer, batch, sink)
        if sink is not None:
            sink.close()

    def _send(self, producer: Any, topic: str, uid: str, key: str, txn: Any) -> None:
        """Send ``uid`` (in ``txn``, or plainly) and record the attempt and its outcome."""
        txn_id = None if txn is None else txn.id
        self.history.send(uid, topic, None, txn_id, producer.producer_name, time.monotonic())
        try:
            message_id = producer.send(uid.encode(), key=key, txn=txn)
        except RaytxnError as e:
            self.history.send_failed(uid, e, time.monotonic(), producer=producer.producer_name)
            raise
        self.history.send_ok(uid, message_id, time.monotonic(), producer=producer.producer_name)

    def _ack_plain(self, name: str, consumer: Any, msg: Any) -> None:
        self.history.ack(name, "shared", msg.message_id(), None, time.monotonic())
        try:
            consumer.acknowledge(msg)
        except RaytxnError as e:
            self._note(e)

    def _ack_in_txn(self, name: str, sub: str, consumer: Any, batch: list[Any], sink: Any) -> None:
        try:
            txn = self.client.new_transaction(timeout=self.txn_timeout_s)
        except RaytxnError as e:
            self._note(e)
            for msg in batch:
                consumer.negative_acknowledge(msg)
            return
        self.history.txn_begin(txn.id, time.monotonic())
        try:
            for msg in batch:
                uid = msg.value().decode()
                outputs = []
                if sink is not None:
                    outputs.append(f"o-{uid}")
                    self._send(sink, self.sink, outputs[0], uid, txn)
                self.history.ack(name, sub, msg.message_id(), txn.id, time.monotonic())
                consumer.acknowledge(msg, txn=txn)
                if sink is not None:
                    self.history.consume_transform_produce(uid, outputs, txn.id, subscription=sub, t=time.monotonic())
        except RaytxnError as e:
            self._note(e, txn, "send or ack")
            self._abort(txn)
            for msg in batch:
                consumer.negative_acknowledge(msg)
            return
        if not self._commit(txn):
            for msg in batch:
                consumer.negative_acknowledge(msg)

    def _commit(self, txn: Any) -> bool:
        issued = time.monotonic()
        try:
            txn.commit()
        except (TransactionAlreadyAborted, TransactionTimedOut) as e:
            self._note(e, txn, "commit")
            self.history.txn_commit(txn.id, "aborted", time.monotonic(), issued_at=issued)
            return False
        except RaytxnError as e:
            self._note(e, txn, "commit")
            self.history.txn_commit(txn.id, "unknown", time.monotonic(), issued_at=issued)
            return False
        self.history.txn_commit(txn.id, "committed", time.monotonic(), issued_at=issued)
        return True

    def _abort(self, txn: Any) -> None:
        issued = time.monotonic()
        try:
            txn.abort()
            self.history.txn_abort(txn.id, "aborted", time.monotonic(), issued_at=issued)
        except RaytxnError as e:
            self._note(e, txn, "abort")
            self.history.txn_abort(txn.id, "unknown", time.monotonic(), issued_at=issued)
