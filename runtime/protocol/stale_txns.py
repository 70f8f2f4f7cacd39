"""Which pending txns a subscription asks their coordinators about, and what an answer decides.

Why: an ack can reach a subscription after its txn's end did (a network duplicate, a call that
waited out a restart of the subscription while the end went to the successor and found nothing
pending). No end comes for it again, so its messages went to nobody until some later end of the
same coordinator brought a low watermark past it, which may never happen (``raytxn sim --seed 43
--seeds 1 --faults heavy --schedule max_txns=5 --reintroduce acks_after_end_hang``, which turns this
check off, loses an input). Kafka's answer
(KIP-890) asks the coordinator before a txn's first write, a round trip for every txn; this asks
only about txns pending longer than a txn normally lasts here.

What an answer proves (the subscription actor asks ``get_txn``, and ``stats`` for the low
watermark when the coordinator does not know the txn):

* COMMITTED or ABORTED: every participant has answered the end, so what is pending here came after
  it and is part of no commit; ABORTING too, since a logged abort is never reversed. The acks are
  aborted here, which gives their messages back.
* unknown at or below the coordinator's low watermark: ended long ago (or never began), the same.
* unknown above it proves nothing: the answer may come from a zombie incarnation of the
  coordinator, whose table is older than the txn. Every answer used holds for a zombie too (an
  entry's final state is applied only once logged, and a zombie's watermark is at most its
  successor's).
* OPEN: not asked about again before its deadline, when its coordinator has ended it at the latest.

Pure: no I/O, no clock beyond the ``now`` it is given. Its memory is volatile: after a restart
every pending txn waits ``after_s`` again before it is asked about.
"""

from __future__ import annotations

from collections.abc import Iterable

from raytxn.ids import TxnID
from raytxn.protocol.txnlog import TxnState

MAX_PER_ROUND = 64  # txns asked about per round (the oldest first); the rest wait for the next round
ENDED_STATES = frozenset({TxnState.COMMITTED, TxnState.ABORTED, TxnState.ABORTING})


class StaleTxns:
    """``due`` picks the txns to ask about; ``ended`` judges each answer."""

    def __init__(self, after_s: float, max_per_round: int = MAX_PER_ROUND) -> None:
        assert after_s > 0 and max_per_round > 0
        self.after_s = after_s
        self.max_per_round = max_per_round
        self._pending_since: dict[TxnID, float] = {}  # txn -> when ``due`` first saw it pending
        self._ask_again_at: dict[TxnID, float] = {}   # txn -> not asked about before (an open txn's deadline)

    def due(self, pending: Iterable[TxnID], now: float) -> list[TxnID]:
        """Of the txns pending now, those pending for ``after_s`` or more and not waiting for a
        deadline, the oldest first, at most ``max_per_round``. Forgets txns no longer pending."""
        self._pending_since = {txn: self._pending_since.get(txn, now) for txn in pending}
        self._ask_again_at = {txn: at for txn, at in self._ask_again_at.items() if txn in self._pending_since}
        stale = sorted((txn for txn, since in self._pending_since.items()
                        if now - since >= self.after_s and now >= self._ask_again_at.get(txn, now)),
                       key=self._pending_since.__getitem__)
        return stale[:self.max_per_round]

    def ended(self, txn: TxnID, state: str | None, now: float, *, deadline_in_s: float | None = None,
              low_watermark: int | None = None) -> bool:
        """Whether the coordinator's answer proves ``txn`` ended (its acks here are then aborted).
        ``state``: the txn's state there, or None when it does not know the txn (then
        ``low_watermark`` is its watermark); ``deadline_in_s``: a live txn's time to its deadline."""
        if state is None:
            return low_watermark is not None and txn.sequence <= low_watermark
        known = TxnState(state)
        if known is TxnState.OPEN and deadline_in_s is not None:  # it times out then at the latest
            self._ask_again_at[txn] = now + max(0.0, deadline_in_s)
        return known in ENDED_STATES
