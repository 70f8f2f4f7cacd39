"""How a coordinator reaches the participants of a transaction.

A participant is a partition (its transaction buffer) or a subscription (its pending-ack handle).
The coordinator only needs one call of each: ``end_txn(txn, action, low_watermark)``, which must
be idempotent (it is retried until it succeeds). Both actor kinds expose exactly that method, so
the resolver below finds them by their Ray actor name; tests register their own participant
actors under the same names.
"""

from __future__ import annotations

from typing import Protocol

import ray

from raytxn.ids import NAMESPACE, TxnID, partition_actor_name, subscription_actor_name
from raytxn.protocol.txnlog import EndAction


class Participant(Protocol):
    async def end_txn(self, txn: TxnID, action: EndAction, low_watermark: int) -> None: ...


class RayActorParticipant:
    """A participant reached through its named actor; the handle is looked up again after a
    failure (the actor may have been replaced)."""

    def __init__(self, actor_name: str, token: str | None = None) -> None:
        self.actor_name = actor_name
        self.token = token  # the engine's own token when auth is on
        self._handle: ray.actor.ActorHandle | None = None

    async def end_txn(self, txn: TxnID, action: EndAction, low_watermark: int) -> None:
        try:
            if self._handle is None:
                # ValueError while the actor does not exist (yet): the caller retries.
                self._handle = ray.get_actor(self.actor_name, namespace=NAMESPACE)
            auth = {} if self.token is None else {"auth": self.token}
            await self._handle.end_txn.remote(txn, action, low_watermark, **auth)
        except BaseException:
            self._handle = None
            raise

    def __repr__(self) -> str:
        return self.actor_name


def partition_participant(topic: str, partition: int, token: str | None = None) -> Participant:
    return RayActorParticipant(partition_actor_name(topic, partition), token)


def subscription_participant(topic: str, partition: int, subscription: str, token: str | None = None) -> Participant:
    return RayActorParticipant(subscription_actor_name(topic, partition, subscription), token)
