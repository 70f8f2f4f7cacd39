"""Stand-in participants for tests and benchmarks of the coordinator protocol.

``RecordingParticipant`` is a real Ray actor registered under a partition's or subscription's
actor name, so the coordinator reaches it exactly as it will reach the real ones. It records every
end it takes, counts every attempt, and can be told to fail the next calls: as a restarting actor
does (retriable), or refusing the end as a broken participant would (``InvalidTxnState``).
"""

from __future__ import annotations

import ray

from raytxn.errors import ActorUnavailable, InvalidTxnState
from raytxn.ids import NAMESPACE, TxnID
from raytxn.protocol.txnlog import EndAction


class RecordingParticipant:
    def __init__(self) -> None:
        self._calls: list[tuple[TxnID, EndAction, int]] = []
        self._attempts = 0
        self._fail_next = 0
        self._refuse = False
        self._readies = 0

    def ready(self) -> dict:
        self._readies += 1
        return {}

    def readies(self) -> int:
        """``ready`` calls taken (a coordinator's ``ActorRef.prefetch`` makes one)."""
        return self._readies

    async def end_txn(self, txn: TxnID, action: EndAction, low_watermark: int) -> None:
        self._attempts += 1
        if self._fail_next > 0:
            self._fail_next -= 1
            if self._refuse:
                raise InvalidTxnState(f"participant told to refuse {action} of {txn}")
            raise ActorUnavailable("participant told to fail")
        self._calls.append((txn, action, low_watermark))

    def fail_next(self, times: int, refuse: bool = False) -> None:
        """Fail the next ``times`` ends: retriably, or (``refuse``) with a non-retriable error."""
        self._fail_next = times
        self._refuse = refuse

    def attempts(self) -> int:
        """Ends received, failed ones included."""
        return self._attempts

    def reset(self) -> None:
        self._calls.clear()
        self._attempts = 0
        self._readies = 0
        self._fail_next = 0
        self._refuse = False

    def calls(self) -> list[tuple[TxnID, EndAction, int]]:
        return list(self._calls)


RecordingParticipantActor = ray.remote(num_cpus=0, max_restarts=-1)(RecordingParticipant)


def start_participant(name: str) -> ray.actor.ActorHandle:
    return RecordingParticipantActor.options(name=name, namespace=NAMESPACE, lifetime="detached").remote()
