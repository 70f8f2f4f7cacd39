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

The partition adds the last bound itself (it needs I/O): never past its newest snapshot, which
recovery replays from. Markers need no rule of their own: a transaction's data precede its
marker, so a trimmed marker never leaves its transaction's data behind, and an aborted txn's
state is dropped exactly when its marker is trimmed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from raytxn.errors import InvalidArgument
from raytxn.ids import Position


class RetentionPolicy(msgspec.Struct, frozen=True):
    """How long acked data stays on a topic. None: that limit is not set."""

    retention_bytes: int | None = None
    retention_s: float | None = None

    @property
    def is_set(self) -> bool:
        return self.retention_bytes is not None or self.retention_s is not None


NO_RETENTION_POLICY = RetentionPolicy()
_FIRST = Position(0, 0)  # the first position a ledger can hold: nothing lies below it


def check_retention(retention_bytes: object, retention_s: object) -> RetentionPolicy:
    """The policy, or ``InvalidArgument`` for a limit that is not a non-negative number."""
    if retention_bytes is not None and (type(retention_bytes) is not int or retention_bytes < 0):
        raise InvalidArgument(f"retention_bytes must be a non-negative int or None, got {retention_bytes!r}")
    if retention_s is not None and (type(retention_s) not in (int, float) or not 0 <= retention_s < float("inf")):
        raise InvalidArgument(f"retention_s must be a non-negative number of seconds or None, got {retention_s!r}")
    return RetentionPolicy(retention_bytes, None if retention_s is None else float(retention_s))


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
