"""Two workloads beside the driver's own, each off unless a ``Workload`` turns it on (the profiles
"consumer-swap" and "topic-delete"), so the other profiles keep their traces:

- ``exclusive_turns`` (``Workload.exclusive_turns``): the pipeline's input is consumed by a
  succession of Exclusive consumers per partition. Each one fetches (its receiver queue), lets the
  application take a prefix of what came, transforms that in one txn with a *cumulative* ack of
  the last one taken, and closes, so the rest of its prefetched messages go back to the
  subscription while later ones may already be queued there: the next consumer must get those
  back first, or its cumulative ack covers messages nobody received (bug 1149ba3).
- ``doomed_topic`` (``Workload.doomed_topics``): txns that write to and ack on a topic of their
  own, which is deleted while they end: each end either reaches the topic's actors or finds them
  gone, and must count that participant as done, or the txn never ends and pins its
  coordinator's low watermark (bug f49da2f).
"""

from __future__ import annotations

import asyncio
from typing import Any

from raytxn.client.coordinator_client import CoordinatorClient
from raytxn.client.message import MessageId
from raytxn.client.transaction import TxnClientState
from raytxn.errors import RaytxnError, TopicNotFound
from raytxn.ids import SUPERVISOR_NAME, Position
from raytxn.protocol.entry_format import decode_message
from raytxn.sim.driver import (
    CALL_DEADLINE_S,
    FETCH_WAIT_S,
    MAX_FETCH,
    SUB_PIPE,
    TOPIC_IN,
    TOPIC_OUT,
    Driver,
)

TURN_POLLS = 3             # fetches a consumer makes for its first messages before it gives up its turn
TURN_BUSY_WAIT_S = 0.5     # after the subscription refused a consumer (another is attached)
DOOMED_SUB = "s"           # the one subscription of each doomed topic
DOOMED_START_S = (0.2, 2.5)  # when a doomed topic's txns begin: inside the default fault window
MAX_DOOMED_TXNS = 3        # txns open on a doomed topic when it is deleted
RACE_S = 0.02              # the ends and the deletion start within this of each other

Taken = tuple[MessageId, str, int, int]  # (id, uid, batch size, redelivery count)


def doomed_topic_name(index: int) -> str:
    return f"gone-{index}"


# --- Exclusive consumers taking turns, with cumulative acks --------------------------------


async def exclusive_turns(d: Driver, partition: int) -> None:
    """Consumers ``x<partition>.<turn>`` of the pipeline's input partition, one after another
    (see the module docstring), until the driver's workers would be done."""
    ref = d._subscription(TOPIC_IN, partition, SUB_PIPE)
    coordinators = d.coordinator_client(f"owner-turns-{partition}")
    turn = 0
    while not d.workers_done() and not d._txn_cap_reached():
        turn += 1
        consumer = f"x{partition}.{turn}"
        try:
            await ref.call_async("subscribe", consumer, consumer, "Exclusive", deadline_s=None)
        except RaytxnError as error:  # NotAllowed: a consumer is still attached there; wait for it
            d.counts.error(error)
            await asyncio.sleep(TURN_BUSY_WAIT_S)
            continue
        d.history.subscribe(consumer, SUB_PIPE, TOPIC_IN, d.now(), from_earliest=True)
        taken = await _take_some(d, ref, consumer, partition)
        if taken:
            await _transform_cumulatively(d, ref, coordinators, consumer, partition, taken)
        # Closing gives back what the application did not take (the receiver queue is dropped).
        await ref.call_async("close_consumer", consumer, deadline_s=None)


async def _take_some(d: Driver, ref: Any, consumer: str, partition: int) -> list[Taken]:
    """Fetch until messages come (at most ``TURN_POLLS`` times); the application takes a random
    prefix of them (received, in order), the rest stays in the receiver queue."""
    for _ in range(TURN_POLLS):
        try:
            reply = await ref.call_async("fetch", consumer, MAX_FETCH, FETCH_WAIT_S, deadline_s=CALL_DEADLINE_S)
        except Exception as error:  # noqa: BLE001 - as the consumer's fetch loop: this turn ends
            d._unexpected(f"fetch {consumer}", error)
            d.counts.error(error)
            return []
        if not reply["registered"]:  # the subscription restarted without this consumer: its turn ends
            return []
        fetched = _decode(partition, reply["messages"])
        if not fetched:
            d.history.receive_timeout(consumer, SUB_PIPE, d.now(), topic=TOPIC_IN)
            continue
        taken = fetched[:d.rng.randint(0, len(fetched))]
        for mid, uid, _size, redeliveries in taken:
            d.history.receive(consumer, SUB_PIPE, TOPIC_IN, partition, mid, uid, redeliveries, d.now())
            d.last_received = d.now()
        return taken
    return []


def _decode(partition: int, wire: list) -> list[Taken]:
    fetched = []
    for ledger_id, entry_id, batch_size, _publish_ms, indexes, counts, records in wire:
        for k, batch_index in enumerate(indexes):
            mid = MessageId(TOPIC_IN, partition, ledger_id, entry_id, batch_index)
            fetched.append((mid, decode_message(records[k]).value.decode(), batch_size, counts[k] if counts else 0))
    return fetched


async def _transform_cumulatively(d: Driver, ref: Any, coordinators: CoordinatorClient, consumer: str,
                                  partition: int, taken: list[Taken]) -> None:
    """One txn: an output per input taken, and one cumulative ack of the last of them."""
    out_partition = d.rng.randrange(d.w.partitions)
    if not d._may_begin():  # a shrunk schedule's cap: closing the consumer gives them back
        return
    try:
        txn = await coordinators.begin_txn_async(d.w.txn_timeout_ms, [(TOPIC_OUT, out_partition)],
                                                 [(TOPIC_IN, partition, SUB_PIPE)])
    except Exception as error:  # noqa: BLE001 - nothing acked: closing the consumer gives them back
        d._unexpected("begin_txn", error)
        d.counts.error(error)
        return
    machine = d._machine(txn)
    outputs = [f"{uid}>{consumer}" for _, uid, _, _ in taken]  # one consumer, one attempt per input
    if not await d.append(f"w-{consumer}", TOPIC_OUT, out_partition, outputs, txn):
        machine.transition_to(TxnClientState.ABORT_ONLY, cause=RuntimeError("send failed"), if_allowed=True)
    last, _, batch_size, _ = taken[-1]
    d.history.ack(consumer, SUB_PIPE, last, txn, d.now(), cumulative=True)
    await d.ack_in_txn(ref, consumer, last, batch_size, True, txn, machine)
    for (_, uid, _, _), output in zip(taken, outputs, strict=True):
        d.history.consume_transform_produce(uid, [output], txn, subscription=SUB_PIPE, t=d.now())
    if await d.finish(txn, machine, coordinators):
        d.transformed.update(uid for _, uid, _, _ in taken)


# --- a topic deleted under open transactions -------------------------------------------------


async def doomed_topic(d: Driver, index: int) -> None:
    """Open txns that write to (and one that acks on) the topic ``gone-<index>`` and to the
    output, then end them while the topic is deleted (see the module docstring)."""
    topic = doomed_topic_name(index)
    await asyncio.sleep(d.rng.uniform(*DOOMED_START_S))
    coordinators = d.coordinator_client(f"owner-{topic}")
    await d.append(f"seeder-{topic}", topic, 0, [f"{topic}-in"], None)
    received = await _receive_one(d, topic)
    txns = []
    for n in range(d.rng.randint(1, MAX_DOOMED_TXNS)):
        out_partition = d.rng.randrange(d.w.partitions)
        if not d._may_begin():  # a shrunk schedule's cap
            break
        try:
            txn = await coordinators.begin_txn_async(d.w.txn_timeout_ms, [(TOPIC_OUT, out_partition), (topic, 0)],
                                                     [(topic, 0, DOOMED_SUB)])
        except Exception as error:  # noqa: BLE001 - no txn: nothing to end
            d._unexpected("begin_txn", error)
            d.counts.error(error)
            continue
        machine = d._machine(txn)
        producer = f"p-{topic}"
        if not (await d.append(producer, TOPIC_OUT, out_partition, [f"{topic}-{n}-out"], txn)
                and await d.append(producer, topic, 0, [f"{topic}-{n}"], txn)):
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=RuntimeError("send failed"), if_allowed=True)
        if n == 0 and received is not None:
            await _ack_in(d, topic, received, txn, machine)
        txns.append((txn, machine))

    async def delete() -> None:
        await asyncio.sleep(d.rng.uniform(0, RACE_S))
        d._trace("delete_topic", topic)
        try:
            await d._ref(SUPERVISOR_NAME).call_async("delete_topic", topic, deadline_s=None)
        except TopicNotFound:  # a retry after the deletion finished
            pass
        d._trace("deleted_topic", topic)

    async def finish(txn: Any, machine: Any) -> None:
        await asyncio.sleep(d.rng.uniform(0, RACE_S))
        await d.end(txn, machine, d.rng.random() >= d.w.abort, coordinators)

    await asyncio.gather(delete(), *(finish(txn, machine) for txn, machine in txns))


async def _receive_one(d: Driver, topic: str) -> Taken | None:
    """The doomed topic's one plain message, from a Shared consumer of its subscription."""
    consumer = f"c-{topic}"
    ref = d._subscription(topic, 0, DOOMED_SUB)
    try:
        await ref.call_async("subscribe", consumer, consumer, "Shared", deadline_s=CALL_DEADLINE_S)
        d.history.subscribe(consumer, DOOMED_SUB, topic, d.now(), from_earliest=True)
        for _ in range(TURN_POLLS):
            reply = await ref.call_async("fetch", consumer, 1, FETCH_WAIT_S, deadline_s=CALL_DEADLINE_S)
            for ledger_id, entry_id, batch_size, _ms, indexes, counts, records in reply["messages"]:
                mid = MessageId(topic, 0, ledger_id, entry_id, indexes[0])
                uid = decode_message(records[0]).value.decode()
                redeliveries = counts[0] if counts else 0
                d.history.receive(consumer, DOOMED_SUB, topic, 0, mid, uid, redeliveries, d.now())
                return mid, uid, batch_size, redeliveries
    except Exception as error:  # noqa: BLE001 - the txns then ack nothing there
        d._unexpected(f"receive on {topic}", error)
        d.counts.error(error)
    return None


async def _ack_in(d: Driver, topic: str, received: Taken, txn: Any, machine: Any) -> None:
    mid, _, batch_size, _ = received
    consumer = f"c-{topic}"
    d._requests += 1
    d.history.ack(consumer, DOOMED_SUB, mid, txn, d.now())
    try:
        await d._subscription(topic, 0, DOOMED_SUB).call_async(
            "ack", consumer, [(Position(mid.ledger_id, mid.entry_id), mid.batch_index, batch_size)], False, txn,
            deadline_s=CALL_DEADLINE_S, request_id=f"{consumer}-{d._requests}", ranges=None)
    except Exception as error:  # noqa: BLE001 - conflict or away: the txn cannot commit
        d._unexpected(f"ack {txn}", error)
        d.counts.error(error)
        machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
