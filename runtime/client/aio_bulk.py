"""The bulk path and compacted topics in ``raytxn.aio``: leases, table views and compacted readers,
awaited.

Each holds the sync object (its ``sync``) and awaits that object's own machinery, never a copy:

* leasing, a lease's acks, its release and renewal, a table view's refresh and a compacted
  reader's next look are coroutines of the client loop (the sync forms run them there and wait);
  here the caller's loop awaits their futures. A cancelled caller stops waiting; an ack in a
  transaction goes on and its outcome is the transaction's, as with ``AsyncConsumer.acknowledge``;
* a range chunk's read decodes a whole range into Arrow (CPU work, its own short-lived loop):
  it runs on the client's worker threads (``AsyncClient.workers``), as ``RangeChunk.read`` does
  in a Spark or Ray task;
* what only reads memory (a table view's ``get``, ``items``, ``position``; a lease set's
  ``chunks``; a reader's ``seek``) is the sync call itself: it never waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from raytxn.client.aio import AsyncClient, AsyncTransaction, _settled, _sync_txn
from raytxn.client.leases import DEFAULT_CHUNK_ENTRIES, LeaseSet, RangeChunk
from raytxn.client.reader import CompactedReader
from raytxn.client.table_view import Listener, TableView
from raytxn.client.transaction import Transaction
from raytxn.errors import InvalidArgument, Timeout
from raytxn.protocol.lease import Lease

if TYPE_CHECKING:
    import pyarrow as pa


class AsyncLeaseSet:
    """A ``LeaseSet`` awaited (``AsyncClient.lease_ranges``); ``sync`` is the lease set itself."""

    def __init__(self, client: AsyncClient, leases: LeaseSet) -> None:
        self._client = client
        self.sync = leases

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    def __bool__(self) -> bool:
        return bool(self.sync)

    @property
    def leases(self) -> dict[int, Lease]:
        return self.sync.leases

    @property
    def entries(self) -> int:
        return self.sync.entries

    def chunks(self, max_entries: int = DEFAULT_CHUNK_ENTRIES, min_chunks: int = 1) -> list[RangeChunk]:
        """``LeaseSet.chunks`` (a plan made in memory: nothing to await)."""
        return self.sync.chunks(max_entries, min_chunks)

    async def read(self, chunk: RangeChunk, columns: Sequence[str] | None = None) -> pa.Table:
        """``chunk.read(columns)`` on a worker thread: the chunk's visible messages as one table."""
        return await self._client._offload(chunk.read, columns)

    async def read_all(self, columns: Sequence[str] | None = None,
                       max_entries: int = DEFAULT_CHUNK_ENTRIES) -> pa.Table:
        """Every leased range read, chunks at once on the workers; one table in partition and
        append order."""
        import pyarrow as pa

        from raytxn.ledger.ranges import range_schema

        tables = await asyncio.gather(*(self.read(chunk, columns) for chunk in self.chunks(max_entries)))
        return pa.concat_tables(tables) if tables else range_schema(columns).empty_table()

    async def acknowledge(self, txn: AsyncTransaction | Transaction) -> None:
        """``LeaseSet.acknowledge``: every range's end acked cumulatively in ``txn``."""
        sync_txn = _sync_txn(txn)
        if sync_txn is None:
            raise InvalidArgument("acknowledge takes a transaction; acknowledge_plain acks outside one")
        await _settled(self.sync.acknowledge_async(sync_txn))

    async def acknowledge_plain(self) -> None:
        await asyncio.wrap_future(self.sync.acknowledge_plain_async())

    async def release(self) -> None:
        await asyncio.wrap_future(self.sync.release_async())

    async def renew(self, timeout_s: float = 60.0) -> None:
        await asyncio.wrap_future(self.sync.renew_async(timeout_s))


class AsyncTableView:
    """A ``TableView`` awaited (``AsyncClient.table_view``); ``sync`` is the view itself. Reads
    are of memory and never wait; ``refresh`` awaits the view's own refresh on the client loop.
    Listeners are called on the client loop's thread, as the sync view calls them: hand work to
    your loop with ``loop.call_soon_threadsafe``."""

    def __init__(self, client: AsyncClient, view: TableView) -> None:
        self._client = client
        self.sync = view

    @property
    def topic(self) -> str:
        return self.sync.topic

    def get(self, key: str) -> bytes | None:
        return self.sync.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.sync

    def __len__(self) -> int:
        return len(self.sync)

    def __iter__(self) -> Iterator[str]:
        return iter(self.sync)

    def items(self) -> dict[str, bytes]:
        return self.sync.items()

    @property
    def position(self) -> dict[int, int]:
        return self.sync.position

    def listen(self, listener: Listener, existing: bool = False) -> None:
        self.sync.listen(listener, existing)

    async def refresh(self, timeout_s: float | None = 60.0) -> dict[int, int]:
        """Apply everything committed before this call; returns ``position`` then (``Timeout``
        after ``timeout_s``)."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.sync.refresh_future()), timeout_s)
        except TimeoutError:
            raise Timeout(f"the table view of {self.topic!r} did not refresh within {timeout_s}s") from None

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncTableView:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncCompactedReader:
    """A ``CompactedReader`` awaited (``AsyncClient.compacted_reader``); ``sync`` is the reader.

    ``async for record in reader`` reads on as records commit, until the reader is closed (the
    sync reader's ``for`` stops at what is committed now; ``read_available`` does that here).
    One look at the partition at a time: calls made at once share it, and a ``seek`` made while
    one is under way drops what it read."""

    def __init__(self, client: AsyncClient, reader: CompactedReader) -> None:
        self._client = client
        self.sync = reader
        self._looking = asyncio.Lock()  # one look at a time: two would queue the same records twice
        self._seeks = 0  # a look that began before a seek is stale when it comes back

    @property
    def position(self) -> int:
        return self.sync.position

    def seek(self, offset: int) -> None:
        self.sync.seek(offset)
        self._seeks += 1

    async def has_message_available(self) -> bool:
        """Whether a record is ready (looks at what committed since the last look when none is)."""
        reader = self.sync
        reader._check_open()
        if reader._read:
            return True
        async with self._looking:
            if not reader._read:
                seeks = self._seeks
                read = await asyncio.wait_for(asyncio.wrap_future(reader._poll_async()), self._client.sync.deadline_s)
                if seeks == self._seeks and not reader._closed:
                    reader._took(read)
        return bool(reader._read)

    async def read_next(self, timeout: float | None = None) -> dict[str, Any]:
        """The next record; waits up to ``timeout`` seconds (None: for ever), then ``Timeout``."""
        reader = self.sync
        deadline = None if timeout is None else time.monotonic() + timeout
        while not await self.has_message_available():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Timeout(f"no record on {reader.topic}/{reader.partition} at offset {reader.position} "
                              f"within {timeout}s")
            await asyncio.sleep(reader.poll_interval_s if left is None else min(reader.poll_interval_s, left))
        return reader._take()

    async def read_available(self, max_records: int = 10_000) -> list[dict[str, Any]]:
        """Up to ``max_records`` records committed by now, without waiting for more (maybe none)."""
        if type(max_records) is not int or max_records < 1:
            raise InvalidArgument(f"max_records must be an int >= 1, got {max_records!r}")
        taken: list[dict[str, Any]] = []
        while len(taken) < max_records and await self.has_message_available():
            taken.append(self.sync._take())
        return taken

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncCompactedReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while not self.sync._closed:
            try:
                record = await self.read_next()
            except InvalidArgument:
                if self.sync._closed:
                    return  # closed while it waited
                raise
            yield record
