"""Kafka transactions on raytxn transactions (Kafka's transaction coordinator, in the gateway).

A Kafka ``transactional.id`` is a raytxn transactional id: InitProducerId registers it with its
raytxn coordinator, which bumps its epoch, aborts its open transaction and fences older epochs
(Kafka's initTransactions); the Kafka epoch handed out is that raytxn epoch. The Kafka producer
id of a transactional id is fixed (``tid_producer_id``), so a restarted producer gets the same id
with a higher epoch, as from Kafka. AddPartitionsToTxn begins the raytxn transaction (under the
id and epoch) with the first partition and registers the partitions; transactional Produce appends
into it; EndTxn commits or aborts it. AddOffsetsToTxn begins it too and notes the consumer group;
TxnOffsetCommit registers the group's subscriptions (``add_subscriptions``) before the gateway
acks in them, so the group's offsets commit or abort with the transaction.

What a gateway keeps per transactional id (the epoch, the open raytxn transaction and its
participants) is a cache of the raytxn coordinator's durable state, so any gateway serves any
request (docs/design.md §6): a gateway that meets a call of an id it does not know, or under another
epoch than it cached, asks the id's coordinator (``describe_transactional_id``) and takes the
open transaction up, under the owner that began it, so a producer goes on as after a Kafka
coordinator failover. EndTxn always asks (``refresh``): the transaction it ends is the one the
coordinator has open, or with none open the id's last one, whose outcome answers (a repeat of
the end that took is success, a timed-out or fenced one an error); AddPartitionsToTxn and
AddOffsetsToTxn ask when the cache made them fail (its txn ended elsewhere, or another gateway
began one). Not kept anywhere: which groups AddOffsetsToTxn named (a taken-up transaction takes
TxnOffsetCommit of any group), and the transaction timeout of an id with no transaction open
(the next one gets the coordinator's default through a gateway that did not see InitProducerId).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raytxn.errors import (
    ConcurrentTransactions,
    Fenced,
    InvalidTxnState,
    NotAuthorized,
    RaytxnError,
    TransactionNotFound,
    TransactionTimedOut,
)
from raytxn.ids import TxnID
from raytxn.kafka import mapping, wire
from raytxn.protocol.txnlog import EndAction

log = logging.getLogger(__name__)
MAX_KAFKA_EPOCH = 32766
PRODUCER_FENCED = 90
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
COORDINATOR_LOAD_IN_PROGRESS = 14

# ``coordinator(transactional_id, method, *args)``: a call to that id's raytxn coordinator;
# ``txn_call(txn, method, *args)``: a call to the coordinator of ``txn``.
CoordinatorCall = Callable[..., Awaitable[Any]]
# ``caller()``: the principal of the connection being served and whether it is a superuser
# ((None, True) with auth off). The gateway's transaction states are shared by its connections, so
# an id registered by one principal must not be written or ended under by another that guessed
# its producer id and epoch (the coordinator only sees the calls that reach it).
Caller = Callable[[], tuple[str | None, bool]]


def _anyone() -> tuple[str | None, bool]:
    return None, True


def tid_producer_id(transactional_id: str) -> int:
    """The Kafka producer id of a transactional id: stable, in [2**61, 2**62), so apart from the
    random ids of idempotent producers (below 2**61) and of fetched raytxn txns (2**62 and up)."""
    digest = hashlib.blake2b(transactional_id.encode(), digest_size=8).digest()
    return (1 << 61) | int.from_bytes(digest, "big") & ((1 << 61) - 1)


@dataclass
class TxnState:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int | None
    txn: TxnID | None = None
    partitions: set[tuple[str, int]] | None = None
    groups: set[str] | None = None  # consumer groups whose offsets may go into the txn
    subscriptions: set[tuple[str, int, str]] | None = None  # (Kafka topic, partition, group) registered
    owner: str | None = None  # of ``txn`` when taken up from its coordinator (None: this gateway's)
    taken_up: bool = False  # ``txn`` was begun through another gateway (or before a restart)
    principal: str | None = None  # the connection principal that registered or took up the id (auth on)


def _code(error: RaytxnError) -> int:
    """The Kafka error code of a failed coordinator call. Kafka clients retry the same request on
    CONCURRENT_TRANSACTIONS (the id's previous transaction has not ended yet) and on
    COORDINATOR_LOAD_IN_PROGRESS, which is what a coordinator that is restarting, or a storage
    outage, is here; any other error aborts the client's transaction or stops it."""
    if isinstance(error, Fenced):
        return PRODUCER_FENCED
    if isinstance(error, NotAuthorized):  # the coordinator checks ids and txns by their principal only
        return wire.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if isinstance(error, (InvalidTxnState, TransactionNotFound, TransactionTimedOut)):
        return INVALID_TXN_STATE
    if isinstance(error, ConcurrentTransactions):
        return CONCURRENT_TRANSACTIONS
    if error.retriable:
        return COORDINATOR_LOAD_IN_PROGRESS
    code = mapping.error_code(error)
    if code == wire.UNKNOWN_SERVER_ERROR:  # the client only sees "unknown": say here what it was
        log.warning("Kafka transaction call failed: %r", error)
    return code


class KafkaTransactions:
    def __init__(self, owner: str, home_call: CoordinatorCall, txn_call: CoordinatorCall,
                 caller: Caller = _anyone, shared: bool = False) -> None:
        """``shared``: this gateway is one of several (``peers``). A producer's requests then go
        to more than one of them (AddPartitionsToTxn and EndTxn to its transaction coordinator,
        Produce to each partition's leader, TxnOffsetCommit to its group's coordinator), so
        another gateway may have ended the transaction this one cached and begun the next: every
        call is checked against the coordinator first (``refresh``), or a Produce would append
        into an ended transaction (acked, and then never visible)."""
        self.owner, self.shared = owner, shared
        self._home_call, self._txn_call, self._caller = home_call, txn_call, caller
        self._states: dict[str, TxnState] = {}

    def cached(self, transactional_id: str) -> TxnState | None:
        """What this gateway cached of the id (None: nothing)."""
        return self._states.get(transactional_id)

    def state(self, transactional_id: str | None, producer_id: int, epoch: int) -> TxnState | int:
        """The state of a call made under (id, producer id, epoch), or the Kafka error code."""
        state = self._states.get(transactional_id or "")
        if state is None or state.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        principal, superuser = self._caller()
        if state.principal is not None and principal != state.principal and not superuser:
            return wire.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        if state.epoch != epoch:
            return wire.INVALID_PRODUCER_EPOCH
        return state

    async def state_of(self, transactional_id: str | None, producer_id: int, epoch: int) -> TxnState | int:
        """``state``, asking the id's coordinator when this gateway does not know the id or knows
        another epoch of it (it restarted since the producer's InitProducerId, or another gateway
        served the producer since): the coordinator's answer replaces what was cached."""
        known = self.state(transactional_id, producer_id, epoch)
        if isinstance(known, TxnState) and self.shared:
            found = await self.refresh(known)
            return found if isinstance(found, int) else known
        if isinstance(known, TxnState) or not transactional_id or producer_id != tid_producer_id(transactional_id):
            return known
        found = await self._describe(transactional_id)
        if isinstance(found, int):
            return found
        if found["epoch"] != epoch:
            return wire.INVALID_PRODUCER_EPOCH
        cached = self._states.get(transactional_id)
        if cached is not None and cached.epoch == epoch:  # (an InitProducerId or a refresh meanwhile)
            return cached
        state = self._states[transactional_id] = taken_up(transactional_id, producer_id, found)
        state.principal = self._caller()[0]  # the coordinator let it describe the id
        if cached is not None and state.timeout_ms is None:
            state.timeout_ms = cached.timeout_ms
        return state

    async def _describe(self, transactional_id: str) -> dict[str, Any] | int:
        """The id's coordinator's view of it, or the Kafka error code."""
        try:
            found = await self._home_call(transactional_id, "describe_transactional_id", transactional_id)
        except RaytxnError as e:
            return _code(e)
        return INVALID_PRODUCER_ID_MAPPING if found is None else found

    async def refresh(self, state: TxnState) -> dict[str, Any] | int:
        """Bring ``state`` in line with its coordinator (another gateway may have begun, grown or
        ended its transaction since this one cached it): the coordinator's answer, or the Kafka
        error code (the epoch moved on: this producer is fenced)."""
        found = await self._describe(state.transactional_id)
        if isinstance(found, int):
            return found
        if found["epoch"] != state.epoch:
            return PRODUCER_FENCED if found["epoch"] > state.epoch else wire.INVALID_PRODUCER_EPOCH
        if found["txn"] != state.txn:
            fresh = taken_up(state.transactional_id, state.producer_id, found)
            state.txn, state.partitions, state.subscriptions = fresh.txn, fresh.partitions, fresh.subscriptions
            state.groups, state.owner, state.taken_up = fresh.groups, fresh.owner, fresh.taken_up
        elif state.txn is not None:  # the same txn: participants another gateway added count too
            assert state.partitions is not None and state.subscriptions is not None
            state.partitions.update((t, p) for t, p in found["partitions"])
            state.subscriptions.update((t, p, g) for t, p, g in found["subscriptions"])
        return found

    async def init_producer_id(self, transactional_id: str, timeout_ms: int) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        try:
            epoch = await self._home_call(transactional_id, "register_transactional_id", transactional_id)
        except RaytxnError as e:
            return _code(e), -1, -1
        if epoch > MAX_KAFKA_EPOCH:
            return wire.INVALID_PRODUCER_EPOCH, -1, -1  # Kafka epochs are int16
        producer_id = tid_producer_id(transactional_id)
        self._states[transactional_id] = TxnState(transactional_id, producer_id, epoch, timeout_ms,
                                                  principal=self._caller()[0])
        return wire.NONE, producer_id, epoch

    async def _begin(self, state: TxnState) -> TxnID:
        """The open raytxn transaction of ``state``, begun now if there is none."""
        if state.txn is None:
            state.txn = await self._home_call(state.transactional_id, "new_txn", state.timeout_ms, self.owner,
                                              state.transactional_id, state.epoch)
            state.partitions, state.groups, state.subscriptions, state.owner = set(), set(), set(), None
            state.taken_up = False
        return state.txn

    async def add_partitions(self, state: TxnState, partitions: list[tuple[str, int]]) -> int:
        return await self._stale_retried(state, lambda: self._add_partitions(state, partitions))

    async def _add_partitions(self, state: TxnState, partitions: list[tuple[str, int]]) -> None:
        await self._begin(state)
        assert state.partitions is not None
        new = [(mapping.raytxn_topic(t), p) for t, p in partitions if (t, p) not in state.partitions]
        if new:
            await self._txn_call(state.txn, "add_partitions", state.txn, new, self._owner(state), state.epoch)
            state.partitions.update(partitions)

    async def add_offsets(self, state: TxnState, group: str) -> int:
        """AddOffsetsToTxn: ``group``'s offsets may go into the transaction (begun now if need be)."""
        error = await self._stale_retried(state, lambda: self._begin(state))
        if error == wire.NONE:
            assert state.groups is not None
            state.groups.add(group)
        return error

    async def _stale_retried(self, state: TxnState, call: Callable[[], Awaitable[Any]]) -> int:
        """``call``'s Kafka error code; once more after a ``refresh`` when it failed as a stale
        cache makes it fail (the cached txn ended, or another gateway began one: its
        coordinator says which)."""
        for attempt in range(2):
            try:
                await call()
                return wire.NONE
            except (ConcurrentTransactions, InvalidTxnState, TransactionNotFound) as e:
                if attempt:
                    return _code(e)
                refreshed = await self.refresh(state)
                if isinstance(refreshed, int):
                    return refreshed
            except RaytxnError as e:
                return _code(e)
        return wire.NONE  # (not reached: the second attempt returns)

    async def add_subscriptions(self, state: TxnState, subscriptions: list[tuple[str, int, str]]) -> int:
        """Register (Kafka topic, partition, group) subscriptions with the transaction's
        coordinator, before anything is acked in them: its end then reaches them."""
        if state.txn is None or state.subscriptions is None:
            return INVALID_TXN_STATE
        new = [s for s in subscriptions if s not in state.subscriptions]
        try:
            if new:
                await self._txn_call(state.txn, "add_subscriptions", state.txn,
                                     [(mapping.raytxn_topic(t), p, g) for t, p, g in new], self._owner(state),
                                     state.epoch)
        except RaytxnError as e:
            return _code(e)
        state.subscriptions.update(new)
        return wire.NONE

    def offsets_txn(self, state: TxnState, group: str) -> TxnID | None:
        """The raytxn txn ``group``'s offsets go into (None: AddOffsetsToTxn did not add the
        group, Kafka's INVALID_TXN_STATE here). A txn taken up from its coordinator takes any
        group: which groups AddOffsetsToTxn named through another gateway is not kept."""
        if state.txn is None or state.groups is None or (group not in state.groups and not state.taken_up):
            return None
        return state.txn

    async def offsets_txn_of(self, state: TxnState, group: str) -> TxnID | int:
        """``offsets_txn``; or, when this gateway is one of several (``shared``) and its cache has
        no txn for the group, the answer after a ``refresh``: TxnOffsetCommit goes to the group's
        coordinating gateway, which need not be the one AddOffsetsToTxn went to. The coordinator
        having the txn open is then what counts (which groups AddOffsetsToTxn named is not kept);
        with none open, the Kafka error INVALID_TXN_STATE."""
        txn = self.offsets_txn(state, group)
        if txn is not None:
            return txn
        if not self.shared:  # one gateway saw every AddOffsetsToTxn: the group was not added
            return INVALID_TXN_STATE
        found = await self.refresh(state)
        if isinstance(found, int):
            return found
        if state.txn is None or state.groups is None:
            return INVALID_TXN_STATE
        state.groups.add(group)
        return state.txn

    def txn_for(self, state: TxnState, topic: str, partition: int) -> TxnID | None:
        """The raytxn txn a transactional batch to (topic, partition) goes into (None: the
        partition was not added, Kafka's INVALID_TXN_STATE)."""
        if state.txn is None or state.partitions is None or (topic, partition) not in state.partitions:
            return None
        return state.txn

    async def end(self, state: TxnState, commit: bool) -> int:
        """EndTxn, of the transaction the id's coordinator has open (the producer may have begun
        it through another gateway, or this one may have restarted: Flink's KafkaSink commits a
        resumed transaction from a new connection with its producer id and epoch alone). With
        none open, the id's last transaction answers: a repeat of the end that took is success,
        one that ended otherwise (timed out, fenced) an error, never a silent success; an id
        that never began one has nothing to end (as Kafka). The transaction stays this id's open
        one until its end is answered: after a transient failure the client sends the same EndTxn
        again, and it must reach the same raytxn transaction (ends are idempotent)."""
        found = await self.refresh(state)
        if isinstance(found, int):
            return found
        txn = state.txn if state.txn is not None else found.get("last_txn")
        if txn is None:
            return wire.NONE  # nothing was added: nothing to end (as Kafka)
        owner = self._owner(state) if state.txn is not None else (found.get("last_owner") or self.owner)
        try:
            await self._txn_call(txn, "end_txn", txn, EndAction.COMMIT if commit else EndAction.ABORT,
                                 owner, state.epoch, state.transactional_id)
        except RaytxnError as e:
            if not e.retriable:
                self._forget_txn(state)
            return _code(e)
        self._forget_txn(state)
        return wire.NONE

    def _owner(self, state: TxnState) -> str:
        return state.owner if state.owner is not None else self.owner

    @staticmethod
    def _forget_txn(state: TxnState) -> None:
        state.txn, state.partitions, state.groups, state.subscriptions = None, None, None, None
        state.owner, state.taken_up = None, False


def taken_up(transactional_id: str, producer_id: int, found: dict[str, Any]) -> TxnState:
    """The state of an id as its coordinator describes it (``describe_transactional_id``). Its
    participants are raytxn names, which are the Kafka ones (``mapping``); the groups whose
    subscriptions are registered are the groups AddOffsetsToTxn named."""
    state = TxnState(transactional_id, producer_id, found["epoch"], found["timeout_ms"])
    if found["txn"] is not None:
        state.txn, state.owner, state.taken_up = found["txn"], found["owner"], True
        state.partitions = {(topic, partition) for topic, partition in found["partitions"]}
        state.subscriptions = {(topic, partition, group) for topic, partition, group in found["subscriptions"]}
        state.groups = {group for _, _, group in state.subscriptions}
    return state
