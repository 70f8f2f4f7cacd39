"""What a failed chaos run leaves behind for whoever reads the failure: the client's side of each
anomalous txn and message (every history event naming it, and the errors the workload met in
it), and the stored side (the entry headers of the ledgers those messages are on, and the
partition's snapshots). A chaos failure depends on timing and seldom replays, so the first failure
must carry enough to explain itself.

Reads storage directly, as ``raytxn.ledger`` does; no actor is asked (one may be what failed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import msgspec

from raytxn.client.message import MessageId
from raytxn.ids import partition_stream
from raytxn.ledger.framing import FrameKind, decode_frames, decode_records
from raytxn.ledger.snapshots import join_segments
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import decode_header
from raytxn.protocol.txn_buffer import TxnBufferSnapshot
from raytxn.tools.checker import Anomaly
from raytxn.tools.history import Event, History

MAX_EVENTS = 200  # per failure: the story of a few txns, not the whole history
MAX_ENTRIES = 400  # per partition ledger
MAX_PARTITIONS = 4


def client_story(history: History, anomalies: Iterable[Anomaly], notes: Iterable[tuple]) -> list[str]:
    """Every event that names an anomaly's txn or message (by uid or by message id, so the acks
    of a received input too) or a txn those messages were sent or acked in, then the workload's
    error notes of those txns."""
    anomalies = list(anomalies)
    txns = {a.txn for a in anomalies if a.txn is not None}
    uids = {a.msg_uid for a in anomalies if a.msg_uid}
    events = history.events
    ids = {e.message_id for e in events if getattr(e, "msg_uid", None) in uids and hasattr(e, "message_id")}
    named = {e.seq: e for e in events if getattr(e, "msg_uid", None) in uids or getattr(e, "message_id", None) in ids}
    txns |= {e.txn for e in named.values() if getattr(e, "txn", None) is not None}  # the sends' and acks' txns
    story = [_event_line(e) for e in events if e.seq in named or getattr(e, "txn", None) in txns][:MAX_EVENTS]
    story += [f"error t={t:.3f} {who} {txn} in {where}: {error}" for t, who, txn, where, error in notes if txn in txns]
    return story


def _event_line(event: Event) -> str:
    fields = {k: v for k, v in msgspec.structs.asdict(event).items() if k not in ("seq",)}
    return f"{type(event).__name__} " + " ".join(f"{k}={v}" for k, v in fields.items())


def partitions_of(history: History, anomalies: Iterable[Anomaly]) -> list[tuple[str, int]]:
    """The partitions the anomalous messages were stored or read on (at most MAX_PARTITIONS)."""
    uids = {a.msg_uid for a in anomalies if a.msg_uid}
    found: dict[tuple[str, int], None] = {}
    for event in history.events:
        mid = getattr(event, "message_id", None)
        if getattr(event, "msg_uid", None) in uids and isinstance(mid, MessageId):
            found[(mid.topic, mid.partition)] = None
        for drained in getattr(event, "messages", ()):  # a drain's messages
            if drained.msg_uid in uids:
                found[(drained.message_id.topic, drained.message_id.partition)] = None
    return list(found)[:MAX_PARTITIONS]


def stored_story(storage_url: str, storage_options: dict[str, Any] | None, topic: str, partition: int) -> list[str]:
    """The headers of the partition's ledger entries (position, kind, txn, producer, sequences,
    low watermark) and its snapshots (last position, ongoing and aborted txns)."""
    return asyncio.run(_stored_story(Storage.from_url(storage_url, **(storage_options or {})), topic, partition))


async def _stored_story(storage: Storage, topic: str, partition: int) -> list[str]:
    stream = partition_stream(topic, partition)
    lines = [f"ledger of {topic}-{partition}:"]
    for path in sorted(await storage.list(f"streams/{stream}/ledgers"))[:MAX_ENTRIES]:
        data = await storage.get(path)
        if data is None:
            lines.append(f"  {path}: gone")
            continue
        ledger_id = int(path.rsplit("/", 2)[-2])
        for kind, entry_id, payload in decode_frames(data, path):
            if kind is not FrameKind.ENTRY:
                lines.append(f"  {ledger_id}:{entry_id} {kind.name}")
                continue
            try:
                header = decode_header(decode_records(payload, path)[0], path)
            except Exception as e:  # noqa: BLE001 - damage: say so and go on
                lines.append(f"  {ledger_id}:{entry_id} {kind.name}: {type(e).__name__}")
                continue
            lines.append(f"  {ledger_id}:{entry_id} {header.kind} {header.txn} {header.producer} "
                         f"{header.first_sequence}..{header.last_sequence} lwm={header.low_watermark}")
    names = sorted(await storage.list(f"{stream}/snapshots"))
    by_id: dict[str, list[str]] = {}
    for name in names:
        by_id.setdefault(name.rsplit("/", 2)[-2], []).append(name)
    for snapshot_id, parts in by_id.items():
        try:
            blobs = [await storage.get(name) or b"" for name in parts]
            snap = msgspec.msgpack.decode(join_segments(blobs), type=TxnBufferSnapshot)
            lines.append(f"  snapshot {snapshot_id}: last {snap.last_position} max_read {snap.max_read_position} "
                         f"ongoing {[o.txn for o in snap.ongoing]} aborted "
                         f"{[(a.txn, str(a.first_position), str(a.marker_position)) for a in snap.aborted]}")
        except Exception as e:  # noqa: BLE001 - an incomplete or damaged one: say so
            lines.append(f"  snapshot {snapshot_id}: {type(e).__name__}: {e}")
    return lines
