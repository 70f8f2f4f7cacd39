"""The retention decision (protocol/retention.py): how far a partition may trim, from its
subscriptions' persisted cursors, its readable end and its topic's retention policy; and the
policy's place in the catalog."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.errors import InvalidArgument
from raytxn.ids import EARLIEST, Position
from raytxn.protocol.catalog import Catalog, decode_catalog, encode_catalog
from raytxn.protocol.retention import (
    DEFAULT_COMPACTION_THRESHOLD_BYTES,
    NO_RETENTION_POLICY,
    RetentionPolicy,
    StoredObject,
    acked_bound,
    bytes_above,
    check_retention,
    compacted_retention_cut,
    compaction_due,
    retention_cut,
)

P = Position
END = P(2, 40)  # readable end: entries up to <2,39> are readable
NOW = 1_000_000


def objects(*sizes_and_ages: tuple[int, int]) -> list[StoredObject]:
    """Objects of 10 entries each in ledger 2, oldest first: (size, age in ms)."""
    return [StoredObject(P(2, 10 * i), P(2, 10 * i + 10), size, NOW - age)
            for i, (size, age) in enumerate(sizes_and_ages)]


def cut(marks: list[Position | None], policy: RetentionPolicy = NO_RETENTION_POLICY,
        stored: list[StoredObject] | None = None, trimmed: Position = EARLIEST,
        end: Position = END) -> Position:
    return retention_cut(trimmed, end, marks, policy, stored or [], NOW)


def test_the_slowest_persisted_cursor_bounds_the_cut() -> None:
    assert cut([P(2, 5), P(1, 7), P(2, 9)]) == P(1, 7)
    assert cut([P(2, 5)]) == P(2, 5)


def test_never_past_the_readable_end() -> None:
    assert cut([P(3, 0)]) == END  # a cursor past max_read (acked gaps): the open txn's data stays
    assert cut([P(3, 0)], end=P(-1, 0)) == EARLIEST  # nothing written yet: nothing to do


def test_a_subscription_without_a_persisted_cursor_holds_everything() -> None:
    assert acked_bound([P(2, 5), None], END) == EARLIEST
    assert cut([P(2, 5), None]) == EARLIEST
    assert cut([P(2, 5), None], RetentionPolicy(retention_bytes=0)) == EARLIEST


def test_never_moves_back() -> None:
    assert cut([P(1, 0)], trimmed=P(1, 5)) == P(1, 5)
    assert cut([P(1, 0)], RetentionPolicy(retention_s=0), objects((10, 0)), trimmed=P(1, 5)) == P(1, 5)


def test_no_subscription_keeps_everything_without_a_policy() -> None:
    assert acked_bound([], END) is None
    assert cut([]) == EARLIEST
    assert cut([], trimmed=P(1, 3)) == P(1, 3)


def test_no_subscription_with_a_policy_lets_the_policy_decide_up_to_the_readable_end() -> None:
    stored = objects((100, 5000), (100, 5000), (100, 10))
    assert cut([], RetentionPolicy(retention_s=1), stored, end=P(2, 30)) == P(2, 20)   # the young one stays
    assert cut([], RetentionPolicy(retention_s=0), stored, end=P(2, 30)) == P(2, 30)
    assert cut([], RetentionPolicy(retention_s=0), stored, end=P(2, 25)) == P(2, 25)  # not past the end


def test_time_policy_keeps_acked_objects_until_they_are_old_enough() -> None:
    stored = objects((100, 9000), (100, 3000), (100, 500))
    marks = [P(2, 30)]
    assert cut(marks, RetentionPolicy(retention_s=10), stored) == EARLIEST
    assert cut(marks, RetentionPolicy(retention_s=5), stored) == P(2, 10)
    assert cut(marks, RetentionPolicy(retention_s=1), stored) == P(2, 20)
    assert cut(marks, RetentionPolicy(retention_s=0.5), stored) == P(2, 30)


def test_size_policy_keeps_at_least_that_many_bytes() -> None:
    stored = objects((100, 0), (100, 0), (100, 0), (100, 0))  # 400 bytes, 40 entries
    marks = [P(2, 40)]
    assert cut(marks, RetentionPolicy(retention_bytes=400), stored, end=P(2, 40)) == EARLIEST
    assert cut(marks, RetentionPolicy(retention_bytes=300), stored, end=P(2, 40)) == P(2, 10)
    assert cut(marks, RetentionPolicy(retention_bytes=150), stored, end=P(2, 40)) == P(2, 20)
    assert cut(marks, RetentionPolicy(retention_bytes=0), stored, end=P(2, 40)) == P(2, 40)


def test_a_policy_never_deletes_what_a_subscription_has_not_acked() -> None:
    stored = objects((100, 9000), (100, 9000), (100, 9000))
    # the cursor sits inside the second object: its acked part goes, nothing above it
    assert cut([P(2, 15)], RetentionPolicy(retention_s=0, retention_bytes=0), stored) == P(2, 15)


def test_either_limit_lets_an_object_go_and_the_first_kept_object_stops_the_cut() -> None:
    stored = objects((100, 9000), (100, 10), (100, 9000))
    marks = [P(2, 30)]
    # young second object, total small: both limits keep it, so the old third one stays too
    assert cut(marks, RetentionPolicy(retention_bytes=250, retention_s=5), stored) == P(2, 10)
    # over the size limit: the young one goes as well
    assert cut(marks, RetentionPolicy(retention_bytes=50, retention_s=5), stored) == P(2, 30)


def test_objects_across_ledgers_and_empty_seal_objects() -> None:
    stored = [StoredObject(P(1, 0), P(1, 5), 50, 0), StoredObject(P(1, 5), P(1, 5), 20, 0),  # SEAL
              StoredObject(P(3, 0), P(3, 4), 50, NOW)]
    assert cut([P(3, 4)], RetentionPolicy(retention_s=1), stored, end=P(3, 4)) == P(1, 5)


@given(st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 30))), max_size=4),
       st.tuples(st.integers(0, 4), st.integers(0, 30)), st.tuples(st.integers(-1, 4), st.integers(-1, 30)),
       st.one_of(st.none(), st.integers(0, 500)), st.one_of(st.none(), st.floats(0, 10)),
       st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20_000)), max_size=5))
def test_the_cut_never_passes_an_unacked_or_unreadable_position(
        raw_marks: list[tuple[int, int] | None], raw_end: tuple[int, int], raw_trimmed: tuple[int, int],
        retention_bytes: int | None, retention_s: float | None, raw_objects: list[tuple[int, int]]) -> None:
    marks = [None if m is None else P(*m) for m in raw_marks]
    end, trimmed = P(*raw_end), P(*raw_trimmed)
    policy = RetentionPolicy(retention_bytes, retention_s)
    stored = [StoredObject(P(i, 0), P(i, 7), size, NOW - age) for i, (size, age) in enumerate(raw_objects)]
    result = retention_cut(trimmed, end, marks, policy, stored, NOW)
    assert result >= trimmed
    if result > trimmed:
        assert result <= end
        assert None not in marks and all(result <= m for m in marks if m is not None)
        assert marks or policy.is_set


def test_check_retention_rejects_bad_limits() -> None:
    assert check_retention(None, None) == NO_RETENTION_POLICY and not NO_RETENTION_POLICY.is_set
    assert check_retention(0, 5) == RetentionPolicy(0, 5.0)
    for bad_bytes, bad_s in [(-1, None), (1.5, None), (True, None), ("10", None), (None, -0.1),
                             (None, float("inf")), (None, float("nan")), (None, "5")]:
        with pytest.raises(InvalidArgument):
            check_retention(bad_bytes, bad_s)


def test_the_catalog_keeps_the_policy() -> None:
    catalog = Catalog().with_topic("kept", 1, 0, RetentionPolicy(1 << 20, 60.0)).with_topic("plain", 2, 0)
    again = decode_catalog(encode_catalog(catalog))
    assert again.topics["kept"].retention == RetentionPolicy(1 << 20, 60.0)
    assert again.topics["plain"].retention == NO_RETENTION_POLICY  # (old catalogs: tests/unit/test_catalog.py)


# --- compacted topics --------------------------------------------------------------------------

COMPACTED = RetentionPolicy(compacted=True, compaction_threshold_bytes=1)


@given(st.lists(st.one_of(st.none(), st.builds(P, st.integers(0, 3), st.integers(0, 50))), max_size=3),
       st.one_of(st.none(), st.builds(P, st.integers(0, 3), st.integers(0, 50))),
       st.sampled_from([COMPACTED, RetentionPolicy(retention_s=0, compacted=True),
                        RetentionPolicy(retention_bytes=0, compacted=True)]))
def test_a_compacted_topic_never_trims_past_its_horizon_nor_past_a_plain_topics_cut(
        marks: list[Position | None], horizon: Position | None, policy: RetentionPolicy) -> None:
    stored = objects((100, 5000), (100, 5000), (100, 5000), (100, 5000))
    got = compacted_retention_cut(EARLIEST, END, marks, policy, stored, NOW, horizon)
    if horizon is None:
        assert got == EARLIEST                                         # never compacted: nothing goes
        return
    assert got <= P(horizon.ledger_id, horizon.entry_id + 1)
    assert got <= END
    if marks:  # with subscriptions, the plain rules still bound it
        assert got <= retention_cut(EARLIEST, END, marks, policy, stored, NOW)


def test_a_compacted_topic_without_subscriptions_or_limits_trims_to_its_horizon() -> None:
    assert compacted_retention_cut(EARLIEST, END, [], COMPACTED, [], NOW, P(2, 19)) == P(2, 20)
    assert compacted_retention_cut(EARLIEST, END, [], COMPACTED, [], NOW, P(9, 0)) == END   # not past the end
    assert compacted_retention_cut(P(2, 25), END, [], COMPACTED, [], NOW, P(2, 19)) == P(2, 25)  # never back
    assert compacted_retention_cut(EARLIEST, END, [P(2, 5)], COMPACTED, [], NOW, P(2, 19)) == P(2, 5)
    assert compacted_retention_cut(EARLIEST, END, [None], COMPACTED, [], NOW, P(2, 19)) == EARLIEST


def test_the_bytes_a_compaction_would_fold_are_those_past_the_horizon() -> None:
    stored = objects((100, 0), (200, 0), (300, 0))                     # <2,0..9>, <2,10..19>, <2,20..29>
    assert bytes_above(stored, None) == 600
    assert bytes_above(stored, P(2, 9)) == 500
    assert bytes_above(stored, P(2, 15)) == 500                        # the object holding <2,16> still counts
    assert bytes_above(stored, P(2, 29)) == 0


def test_a_compaction_is_due_past_the_threshold_with_something_readable_past_the_horizon() -> None:
    stored = objects((100, 0), (200, 0), (300, 0))                     # <2,0..9>, <2,10..19>, <2,20..29>
    assert compaction_due(stored, None, 600, P(2, 29))
    assert not compaction_due(stored, None, 601, P(2, 29))             # under the threshold
    assert not compaction_due(stored, None, None, P(2, 29))            # no threshold: never
    assert compaction_due(stored, P(2, 9), 500, P(2, 29))
    assert not compaction_due(stored, P(2, 9), 500, P(2, 9))           # nothing readable past the horizon
    assert not compaction_due(stored, P(2, 9), 500, P(-1, -1))         # nothing readable at all
    assert not compaction_due(stored, P(2, 19), 500, P(2, 29))         # 300 bytes above it


def test_compaction_settings_are_checked() -> None:
    assert check_retention(None, None, True) == RetentionPolicy(None, None, True, DEFAULT_COMPACTION_THRESHOLD_BYTES)
    assert check_retention(None, None, True, 5).compaction_threshold_bytes == 5
    assert not check_retention(None, None).compacted and not check_retention(None, None, True).is_set
    for args in ((False, 5), (True, 0), (True, -1), (True, 1.5), ("yes", None), (1, None)):
        with pytest.raises(InvalidArgument):
            check_retention(None, None, *args)
    catalog = Catalog().with_topic("t", 1, 0, check_retention(None, None, True, 7))
    assert decode_catalog(encode_catalog(catalog)).topics["t"].retention.compaction_threshold_bytes == 7
