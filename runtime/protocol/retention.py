"""Retention of a partition: how far its ledger may be trimmed. Pure: no I/O, no clock.

The rule is Pulsar's managed-ledger trimming with its per-topic retention policy:

* Data stays while any subscription has not acked it: nothing at or above the slowest
  subscription's persisted mark-delete bound (``acked_below``) is ever trimmed. Only the
  *persisted* bound counts: a subscription restarts from it, so it must still be readable then.
  A subscription that has not persisted a cursor yet holds everything.
* Nothing at or above the partition's readable end (``max_read_position`` + 1) is trimmed: what
  lies beyond is an open transaction's data, or behind it.
* Acked data goes at once, unless the topic's policy keeps it: ``retention_s`` keeps a stored
  object until its newest entry is that old, ``retention_bytes`` keeps the oldest acked objects
  while the partition's stored bytes would fall below it without them. An object goes when
  either limit lets it (Pulsar and Kafka both delete on the first limit reached); an unset
  limit never lets one go. Objects go oldest first, so the first one kept stops the cut.
* A topic with no subscription keeps everything unless it has a policy; with one, all of its
  readable data counts as acked and the policy alone decides (Kafka's model). Pulsar deletes a
  subscription-less topic's data at once, so a consumer subscribing at Earliest afterwards gets
  nothing; here producing first and subscribing later loses nothing unless the topic says so.

A compacted topic (Kafka's ``cleanup.policy=compact``) trims its live ledger only at or below
its published compaction horizon (``compacted_retention_cut``): the compacted ledger holds the
latest value of every key there, the live ledger is the only copy above it. Below the horizon the
rules above still hold (a subscription's unacked backlog stays), except that a compacted topic
without subscriptions and without limits lets everything below the horizon go: its compacted
ledger is what a reader from the start reads.

The partition adds the last bound itself (it needs I/O): never past its newest snapshot, which
recovery replays from. Markers need no rule of their own: a transaction's data precede its
marker, so a trimmed marker never leaves its transaction's data behind, and an aborted txn's
state is dropped exactly when its marker is trimmed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from raytxn import testing_bugs
from raytxn.errors import InvalidArgument
from raytxn.ids import Position
from raytxn.protocol.cursor import next_position


class RetentionPolicy(msgspec.Struct, frozen=True):
    """How long acked data stays on a topic. None: that limit is not set."""

    retention_bytes: int | None = None
    retention_s: float | None = None
    # Kafka's cleanup.policy=compact: keyed appends only, compacted by the partition once
    # ``compaction_threshold_bytes`` of live data lie above the horizon (Pulsar's
    # compaction-threshold), trimmed only below the horizon.
    compacted: bool = False
    compaction_threshold_bytes: int | None = None

    @property
    def is_set(self) -> bool:
        """Whether a limit is set (compaction is not a limit)."""
        return self.retention_bytes is not None or self.retention_s is not None


NO_RETENTION_POLICY = RetentionPolicy()
_FIRST = Position(0, 0)  # the first position a ledger can hold: nothing lies below it


DEFAULT_COMPACTION_THRESHOLD_BYTES = 64 << 20


def check_retention(retention_bytes: object, retention_s: object, compacted: object = False,
                    compaction_threshold_bytes: object = None) -> RetentionPolicy:
    """The policy, or ``InvalidArgument`` for a limit that is not a non-negative number, or a
    compaction threshold (a positive int) on a topic that is not compacted."""
    if type(compacted) is not bool:
        raise InvalidArgument(f"compacted must be a bool, got {compacted!r}")
    if compaction_threshold_bytes is not None:
        if not compacted:
            raise InvalidArgument("compaction_threshold_bytes is for a compacted topic (compacted=True)")
        if type(compaction_threshold_bytes) is not int or compaction_threshold_bytes < 1:
            raise InvalidArgument(f"compaction_threshold_bytes must be a positive int or None, "
                                  f"got {compaction_threshold_bytes!r}")
    elif compacted:
        compaction_threshold_bytes = DEFAULT_COMPACTION_THRESHOLD_BYTES
    if retention_bytes is not None and (type(retention_bytes) is not int or retention_bytes < 0):
        raise InvalidArgument(f"retention_bytes must be a non-negative int or None, got {retention_bytes!r}")
    if retention_s is not None and (type(retention_s) not in (int, float) or not 0 <= retention_s < float("inf")):
        raise InvalidArgument(f"retention_s must be a non-negative number of seconds or None, got {retention_s!r}")
    return RetentionPolicy(retention_bytes, None if retention_s is None else float(retention_s), compacted,
                           compaction_threshold_bytes)  # type: ignore[arg-type]


class StoredObject(msgspec.Struct, frozen=True):
    """One object of the partition's ledger: entries ``[start, end)``, its size, and when it was
    written (the time of its newest entry)."""

    start: Position
    end: Position
    size: int
    written_ms: int


def acked_bound(marks: Sequence[Position | None], readable_end: Position) -> Position | None:
    """Every position below it is acked by every subscription and readable (None: there is no
    subscription). ``marks``: each subscription's persisted ``acked_below``, None for one that
    has persisted none yet (it holds everything)."""
    if not marks:
        return None
    if any(mark is None for mark in marks):
        return Position(-1, -1)
    return min(readable_end, *(mark for mark in marks if mark is not None))


def retention_cut(trimmed_below: Position, readable_end: Position, marks: Sequence[Position | None],
                  policy: RetentionPolicy, objects: Sequence[StoredObject], now_ms: int) -> Position:
    """Where the partition may trim to now: entries below the result may go. Never lower than
    ``trimmed_below``. ``objects``: the ledger's objects in position order (only read when the
    policy is set)."""
    if readable_end.ledger_id < 0:
        return trimmed_below  # nothing written yet
    bound = acked_bound(marks, readable_end)
    if bound is None:
        if not policy.is_set:
            return trimmed_below  # nobody subscribed, nothing says the data may go
        bound = readable_end
    if bound <= max(trimmed_below, _FIRST):
        return trimmed_below
    if not policy.is_set:
        return bound
    remaining = sum(o.size for o in objects)
    cut = trimmed_below
    for stored in objects:
        if stored.start >= bound:
            break
        expired = policy.retention_s is not None and now_ms - stored.written_ms >= policy.retention_s * 1000
        over_size = policy.retention_bytes is not None and remaining - stored.size >= policy.retention_bytes
        if not (expired or over_size):
            break
        cut = max(cut, min(stored.end, bound))
        remaining -= stored.size
    return cut


def compacted_retention_cut(trimmed_below: Position, readable_end: Position, marks: Sequence[Position | None],
                            policy: RetentionPolicy, objects: Sequence[StoredObject], now_ms: int,
                            horizon: Position | None) -> Position:
    """``retention_cut`` for a compacted topic whose newest published compaction covers every
    entry at or before ``horizon`` (None: never compacted, so nothing may go). Never past the
    horizon; without subscriptions or limits, everything below it may go."""
    if horizon is None or readable_end.ledger_id < 0:
        return trimmed_below
    covered = min(next_position(horizon), readable_end)
    if testing_bugs.REINTRODUCED["compacted_trim_past_horizon"] and marks:  # test only: as far as acked
        covered = readable_end
    if not marks and not policy.is_set:
        cut = covered
    else:
        cut = min(retention_cut(trimmed_below, readable_end, marks, policy, objects, now_ms), covered)
    return max(cut, trimmed_below)


def bytes_above(objects: Sequence[StoredObject], horizon: Position | None) -> int:
    """The stored bytes of the objects holding entries past ``horizon`` (all of them for None):
    what a compaction now would fold, against the topic's compaction threshold."""
    return sum(o.size for o in objects if horizon is None or o.end > next_position(horizon))  # end: exclusive


def compaction_due(objects: Sequence[StoredObject], horizon: Position | None, threshold_bytes: int | None,
                   max_read_position: Position) -> bool:
    """Whether a compacted partition compacts itself now: its ``threshold_bytes`` (None: never)
    of stored objects hold entries past the published ``horizon`` (Pulsar's
    ``compaction-threshold``), and something readable lies past it (else a compaction would
    publish a generation holding nothing new)."""
    if threshold_bytes is None or bytes_above(objects, horizon) < threshold_bytes:
        return False
    return max_read_position.ledger_id >= 0 and (horizon is None or max_read_position > horizon)
