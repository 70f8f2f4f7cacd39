"""Test-only switches that bring back bugs this project fixed (and the classic bugs of compaction
and keyed state its design avoids), so that the deterministic simulator
(``raytxn.sim``) can show it finds them: tests/unit/test_sim_bugs.py, and
``raytxn sim --faults PROFILE --reintroduce NAME``.

Each switch names one historical fix. The engine reads it at the place of that fix and, only when
it is on, does what it did before the fix. Every switch is off unless ``reintroduced`` turns it on
for a block (tests, the simulator's command); nothing in the engine or the client ever sets one,
so production code always runs the fixed path. Plain module state with no imports of the engine:
the pure protocol layer may read it (a dict lookup; no I/O, no clock).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

REINTRODUCED: dict[str, bool] = {
    # 1149ba3: a rewind (a consumer closed, a negative ack) left the queued messages from the
    # rewind point in the queue, and a read landing after a rewind queued its entries. An
    # Exclusive successor got later messages first, and its cumulative ack covered messages
    # never delivered to anyone (lost). Read in protocol/subscription_state.py.
    # Also skips the given-back check below, which came later and alone refuses the successor's
    # ack too: the switch brings back the subscription as it was before the fix.
    "consumer_swap_loss": False,
    # Found by the simulator (consumer-swap with forgotten txns): an abort that gave messages back
    # after a successor consumer got later ones, and the successor's cumulative ack in a txn
    # covered the given-back messages nobody received. Read in protocol/subscription_state.py.
    "given_back_cumulative_ack": False,
    # f49da2f: the coordinator retried an end for a participant whose topic (or subscription)
    # was deleted forever: the txn stayed COMMITTING/ABORTING and pinned the low watermark.
    # Read in actors/participants.py.
    "deleted_topic_stuck": False,
    # Found by the simulator (pipelined, seeds 50, 61, 138...): a producer re-created with the same
    # name (its client crashed) asked each partition for its last sequence, which counted only
    # durable appends; an append of the dead client still being written got the same sequence
    # ids as the new producer's first batch: an overlap refused for good, or, for the same range,
    # a duplicate acknowledged for messages never stored. Read in actors/partition.py.
    "restarted_producer_collision": False,
    # Left open by that fix, closed by producer epochs: a dead client's append still in the
    # network (or waiting for its predecessor) reached the partition after the new producer of
    # the same name had asked where to continue, and collided with the new one's first batch the
    # same way. With this on, ``init_producer`` answers as ``last_sequence`` did: epoch 0, the
    # highest sequence stored or being stored, plus one. Read in actors/partition.py.
    "no_producer_epochs": False,
    # Found by the simulator (heavy, capped runs): an ack that reached a subscription after its
    # txn's end had (a retry through a restart, a call delivered late) stayed pending with no end
    # to come, and its messages went to nobody. Fixed by the stale-txn check, which asks the
    # coordinator about such txns; with this on the check asks nothing and aborts nothing. Read in
    # actors/subscription.py.
    "acks_after_end_hang": False,
    # --- The classic bugs of compaction and keyed state (issue 58): not this project's history
    # but what its design avoids, brought back so that the simulator's compaction and stateful
    # profiles show they find them (tests/unit/test_sim_compaction.py, test_sim_stateful.py).
    # Aborted writes enter the compaction's key map (KAFKA-13727, KAFKA-8351, Pulsar #21464):
    # the fold ignores the aborted spans. Read in protocol/compaction.py.
    "compaction_keeps_aborted": False,
    # A partition compacts itself up to its last entry, not its max_read_position: data of open
    # txns enters the compacted ledger. Read in actors/compaction.py.
    "compaction_past_max_read": False,
    # Retention trims a compacted partition's live ledger past its published horizon, as far as
    # its subscriptions acked: the latest values above the horizon are gone from the compacted
    # view and its tail. Read in protocol/retention.py.
    "compacted_trim_past_horizon": False,
    # A partition's snapshot carries no producer dedup state: after a restart, a resent batch
    # stored before the snapshot (its entries never replayed) is stored again. Read in
    # protocol/txn_buffer.py.
    "snapshot_without_dedup": False,
    # Transactional ids without fencing (Pulsar's transactions have none): registering an id
    # neither aborts its open txn nor fences the older epoch's calls, so a zombie commits. Read in
    # protocol/coordinator_state.py.
    "no_tid_fencing": False,
    # A table view's live reads skip no aborted data: an aborted txn's values reach the table,
    # and a stateful pipeline's next batch builds on them. Read in ledger/compacted.py.
    "table_view_reads_aborted": False,
}


def active() -> tuple[str, ...]:
    """The names of the switches that are on, sorted."""
    return tuple(sorted(name for name, on in REINTRODUCED.items() if on))


def check_names(names: tuple[str, ...] | list[str]) -> None:
    """``ValueError`` for a name that is no switch (a typo must not run the fixed engine silently)."""
    unknown = [name for name in names if name not in REINTRODUCED]
    if unknown:
        raise ValueError(f"no reintroducible bug named {', '.join(unknown)}; known: {', '.join(REINTRODUCED)}")


@contextmanager
def reintroduced(*names: str) -> Iterator[None]:
    """Turn the switches ``names`` on for the block; every switch is as before afterwards, also
    when the block raises."""
    check_names(names)
    saved = dict(REINTRODUCED)
    try:
        for name in names:
            REINTRODUCED[name] = True
        yield
    finally:
        REINTRODUCED.update(saved)
