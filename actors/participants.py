"""How a coordinator ends a transaction on its participants.

A participant is a partition (its transaction buffer) or a subscription (its pending-ack handle),
reached by its actor name through ``ActorRef``, so its failures are sorted by the one
classification in ``raytxn.client.rpc``. Both kinds take the one call ``end_txn(txn, action,
low_watermark)``, idempotent, so it may be sent again whenever an attempt's outcome is unknown.
Tests register stand-in participant actors under the same names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from raytxn import testing_bugs
from raytxn.client.rpc import ActorRef, retry_async
from raytxn.errors import ActorNotFound
from raytxn.ids import TxnID, partition_actor_name, subscription_actor_name
from raytxn.protocol.txnlog import EndAction


def participant_name(kind: str, ident: tuple) -> str:
    """The actor name of a ``("partition", (topic, p))`` or ``("subscription", (topic, p, name))``."""
    return partition_actor_name(*ident) if kind == "partition" else subscription_actor_name(*ident)


async def end_on_participant(participant: ActorRef, txn: TxnID, action: EndAction, low_watermark: Callable[[], int],
                             deleted: Callable[[], Awaitable[bool]], on_retry: Callable[[], None],
                             delays_s: tuple[float, float]) -> bool:
    """Send the end until the participant has it: True, or False when it was deleted.

    Retriable failures (the actor restarting, or not there because it is being re-created) are
    retried with the shared backoff (``delays_s``) for as long as they last. When no actor of that
    name exists, ``deleted()`` asks whether its topic or subscription is gone: then nothing is left
    to end. Any other error is final and raised as it is (Ray's wrapper removed)."""

    async def attempt() -> bool:
        try:
            # The watermark is read per attempt: a retry may tell the participant more.
            await participant.attempt_async("end_txn", txn, action, low_watermark())
        except ActorNotFound:
            # (The switch is test-only, off in production: it brings back bug f49da2f, an end
            # retried forever, for the simulator.)
            if not testing_bugs.REINTRODUCED["deleted_topic_stuck"] and await deleted():
                return False
            raise
        return True

    return await retry_async(attempt, None, on_retry=on_retry, what=f"{participant.name}.end_txn",
                             delays_s=delays_s)
