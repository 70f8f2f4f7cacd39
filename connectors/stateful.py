"""Exactly-once keyed state for a consume-process-produce loop, in plain Python (issue 58 item 3).

``StatefulPipeline`` runs micro-batches as ``ExactlyOncePipeline`` does (a transactional id
registered once, whose epoch fences any zombie of the same pipeline and holds its leases), and
gives each batch's transform the pipeline's **state**: a compacted state topic, read through a
table view (``Client.table_view``). Per batch, in one transaction:

1. lease the input's next committed ranges (the bulk path), read their rows;
2. ``refresh()`` the state view: it then holds every update committed before, which includes every
   earlier batch's (a batch's commit returns once its markers are written on every participant,
   also on an engine that answers commits once logged: ``commit(until_applied=True)``);
3. ``transform(rows, state)`` returns the output messages and the state updates (a key's new
   value, or None to delete it);
4. send the outputs to the sink and the updates to the state topic, acknowledge the input's
   ranges, all in the transaction, and commit.

So outputs, state updates and input acks commit together or not at all: a batch that fails
anywhere is aborted and tried again from the same ranges, and the state it sees is the committed
one, so an update is never applied twice. A zombie's commit is fenced by the epoch. The view is a
materialization at a committed position only (the lesson of KIP-892 and KAFKA-20685): nothing of
an aborted batch is in it, because aborted data never reaches a table view.

Batches run one at a time: a batch reads the state its predecessor committed, so its commit
cannot overlap the next batch as ``ExactlyOncePipeline``'s does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from raytxn.client.transaction import UNENDED_STATES
from raytxn.connectors.batches import BATCH_COLUMNS, BatchHandle, lease_batch
from raytxn.errors import Fenced, InvalidArgument, RaytxnError

POLL_S = 0.2
Output = tuple[str | None, bytes]
Transform = Callable[[list[dict[str, Any]], Mapping[str, bytes]], tuple[Iterable[Output], Mapping[str, bytes | None]]]

__all__ = ["StateSnapshot", "StatefulBatchStats", "StatefulPipeline"]


class StateSnapshot(Mapping[str, bytes]):
    """The state a batch's transform sees: the committed value of every key (read-only)."""

    def __init__(self, view: Any) -> None:
        self._view = view

    def __getitem__(self, key: str) -> bytes:
        value = self._view.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._view.items())

    def __len__(self) -> int:
        return len(self._view)


@dataclass
class StatefulBatchStats:
    batch: int
    rows_in: int
    rows_out: int
    state_updates: int
    txn: str
    attempt: int
    batch_s: float


def _outputs(produced: Iterable[Output]) -> list[Output]:
    out = []
    for item in produced:
        if not (isinstance(item, tuple) and len(item) == 2 and (item[0] is None or isinstance(item[0], str))
                and isinstance(item[1], bytes | bytearray)):
            raise InvalidArgument(f"a transform's output is (key or None, bytes), got {item!r}")
        out.append((item[0], bytes(item[1])))
    return out


def _updates(updates: Mapping[str, bytes | None]) -> dict[str, bytes]:
    if not isinstance(updates, Mapping):
        raise InvalidArgument(f"a transform's state updates are a mapping of key to bytes or None, got {updates!r}")
    checked = {}
    for key, value in updates.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, bytes | bytearray)):
            raise InvalidArgument(f"a state update is str -> bytes or None, got {key!r} -> {value!r}")
        checked[key] = b"" if value is None else bytes(value)  # an empty value is a tombstone
    return checked


@dataclass
class StatefulPipeline:
    client: Any
    source: str
    subscription: str
    sink: str
    state_topic: str
    transform: Transform
    pipeline_id: str
    batch_max_messages: int | None = 1000
    txn_timeout_s: float = 120.0
    lease_timeout_s: float = 120.0
    max_attempts: int = 5
    before_commit: Callable[[int], None] | None = None  # called with the batch number (tests, demos)
    stats: list[StatefulBatchStats] = field(default_factory=list)
    epoch: int | None = field(default=None, init=False)
    _view: Any = field(default=None, init=False, repr=False)
    _producers: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for topic in (self.source, self.sink, self.state_topic):
            self.client.get_topic(topic)  # TopicNotFound now, not at the first batch
        if self.state_topic in (self.source, self.sink):
            raise InvalidArgument("the state topic must be a topic of its own, not the source or the sink")

    @property
    def state(self) -> StateSnapshot:
        """The committed state (as the next batch will see it after its refresh)."""
        return StateSnapshot(self._state_view())

    def _state_view(self) -> Any:
        if self._view is None:
            self._view = self.client.table_view(self.state_topic)
        return self._view

    def _producer(self, topic: str) -> Any:
        if topic not in self._producers:
            self._producers[topic] = self.client.create_producer(topic)
        return self._producers[topic]

    def run_batch(self, batch: int | None = None, attempt: int = 0) -> StatefulBatchStats | None:
        """One micro-batch in one transaction, committed; None when there was no input."""
        t0 = time.perf_counter()
        batch = len(self.stats) if batch is None else batch
        if self.epoch is None:
            self.epoch = self.client.register_transactional_id(self.pipeline_id)  # fences any zombie
        handle = lease_batch(self.client, self.source, self.subscription, self.pipeline_id, self.epoch,
                             max_messages=self.batch_max_messages, wait_s=POLL_S,
                             lease_timeout_s=self.lease_timeout_s)
        if handle.count == 0:
            return None
        txn = None
        try:
            rows = handle.read_all(BATCH_COLUMNS).to_pylist()
            view = self._state_view()
            view.refresh()  # every update committed before this batch, its predecessors' too
            txn = self.client.new_transaction(self.txn_timeout_s, transactional_id=self.pipeline_id,
                                              epoch=self.epoch)
            produced, changed = self.transform(rows, StateSnapshot(view))
            outputs, updates = _outputs(produced), _updates(changed)
            acked = handle.acknowledge_async(txn)
            sink, state = self._producer(self.sink), self._producer(self.state_topic)
            for key, value in outputs:
                sink.send_async(value, key=key, txn=txn)
            for key, value in updates.items():
                state.send_async(value, key=key, txn=txn)
            sink.flush_txn(txn)
            state.flush_txn(txn)
            acked.result()
            if self.before_commit is not None:
                self.before_commit(batch)
            txn.commit(until_applied=True)  # the next batch reads the state it wrote
        except BaseException:
            self._abort(txn, handle)
            raise
        handle.close()
        stats = StatefulBatchStats(batch, len(rows), len(outputs), len(updates), str(txn.id), attempt,
                                   time.perf_counter() - t0)
        self.stats.append(stats)
        return stats

    def _abort(self, txn: Any, handle: BatchHandle) -> None:
        if txn is not None and txn.state in UNENDED_STATES:
            try:
                txn.abort()
            except RaytxnError:
                pass  # it times out instead
        handle.close()

    def run(self, max_batches: int | None = None, until_idle: bool = False) -> list[StatefulBatchStats]:
        """Run micro-batches (forever, ``max_batches`` of them, or until the input is drained),
        each tried up to ``max_attempts`` times; ``Fenced`` stops it (a newer incarnation runs)."""
        while max_batches is None or len(self.stats) < max_batches:
            for attempt in range(self.max_attempts):
                try:
                    result = self.run_batch(attempt=attempt)
                    break
                except Fenced:
                    raise
                except Exception:
                    if attempt + 1 >= self.max_attempts:
                        raise
                    time.sleep(min(2.0, 0.2 * (attempt + 1)))
            if result is None and until_idle:
                break
        return self.stats

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        if self._view is not None:
            self._view.close()
