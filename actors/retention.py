"""What a partition's retention reads from storage: its topic's catalog entry (the policy and the
subscription names) and each subscription's persisted cursor. The decision is
``raytxn.protocol.retention``'s; the partition actor runs it on a timer and trims.

Everything comes from storage, not from the other actors: a subscription that is down or
restarting still holds its data back, and only what a subscription would recover to (its
persisted cursor, never the newer one in its memory) counts as acked.
"""

from __future__ import annotations

from raytxn.actors.subscription import CURSOR_PROPERTY, pending_ack_stream
from raytxn.ids import Position
from raytxn.ledger import read_metadata
from raytxn.ledger.storage import Storage
from raytxn.protocol.catalog import CATALOG_KEY, CATALOG_STREAM, Catalog, EntryState, TopicInfo, decode_catalog
from raytxn.protocol.subscription_state import decode_persisted


async def read_catalog(storage: Storage) -> Catalog:
    meta = await read_metadata(storage, CATALOG_STREAM)
    return decode_catalog(None if meta is None else meta.properties.get(CATALOG_KEY))


async def persisted_mark(storage: Storage, topic: str, partition: int, subscription: str) -> Position | None:
    """The subscription's persisted mark-delete bound (``acked_below``) on the partition; None
    when it has persisted no cursor yet (it is being created, or being deleted)."""
    stream = pending_ack_stream(topic, partition, subscription)
    meta = await read_metadata(storage, stream)
    raw = None if meta is None else meta.properties.get(CURSOR_PROPERTY)
    return None if raw is None else decode_persisted(raw, stream).cursor.acked_below


async def topic_and_marks(storage: Storage, topic: str,
                          partition: int) -> tuple[TopicInfo | None, list[Position | None]]:
    """The topic's catalog entry (None: not in the catalog, or being deleted) and the mark of
    every subscription that is or is becoming active (one being deleted holds nothing back)."""
    catalog = await read_catalog(storage)
    info = catalog.topics.get(topic)
    if info is None or info.state is EntryState.DELETING:
        return None, []
    names = catalog.subscription_names(topic, (EntryState.CREATING, EntryState.ACTIVE))
    return info, [await persisted_mark(storage, topic, partition, name) for name in names]
