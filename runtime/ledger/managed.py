"""Managed ledgers: one durable, append-only stream of entries per name, on object storage.

A stream is a list of ledgers (``streams/<stream>/meta``, see ``metadata.py``); a ledger is a run of
objects ``streams/<stream>/ledgers/<ledger id>/<first entry id>``, each holding one or more framed
entries (``framing.py``). Positions ``(ledger_id, entry_id)`` are totally ordered.

Writing. Exactly one incarnation writes a stream. Opening for write seals every ledger the
previous incarnation left open (a SEAL frame created at the first free entry id), then wins a
compare-and-set of the metadata that adds a fresh ledger. Every object is a conditional create at
the next entry id, so a zombie writer's next put collides with the seal or with the new
incarnation's objects and fails with ``Fenced``; nothing it writes after the seal is ever read,
because readers stop at the seal and at the metadata's ``last_entry_id``.

Group commit. Appends queue up; one flusher puts them, several entries per object, one put in
flight at a time (so a crash can never leave a hole: objects exist for a prefix of entry ids).
Appends arriving during a put share the next put, up to ``max_batch_bytes`` /
``max_batch_entries``; an idle ledger puts the first append at once (``max_delay_ms`` 0). Waiting a
fixed delay for company cost every append that delay and bought nothing: measured on file://,
64 concurrent appenders made 41k appends/s with no delay vs 24k with 1 ms, and a lone appender
waited 0.7 ms instead of 1.9 ms. An append resolves only after its put is durable.

Lingering entries. An entry nobody waits for soon (a coordinator's record that only closes the
books on a txn already answered) may be appended with ``linger_s``: it is queued but does not wake
the flusher, so it goes in the put of the next ordinary append, or in a put of its own once
``linger_s`` has passed, the queue is full, or someone calls ``flush_lingering`` or ``flush``. It
is an entry like any other (its own position, in queue order, ``on_durable`` in order); only its
put is shared. Under a steady load that saves the put it would have cost.

Reading checks that objects are contiguous and that each frame's CRC and entry id are right; a
missing, truncated or corrupted object raises ``CorruptLedger`` naming it, never a silent skip.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec
from sortedcontainers import SortedDict

from raytxn.errors import CorruptLedger, Fenced, InvalidArgument, MessageTooLarge, PositionTrimmed, StorageUnavailable
from raytxn.ids import EARLIEST, Position, check_stream_name
from raytxn.ledger.framing import FrameKind, decode_frames, decode_records, encode_frame, encode_records
from raytxn.ledger.loads import ObjectLoads
from raytxn.ledger.metadata import LedgerInfo, StreamMetadata, compare_and_set, read_metadata
from raytxn.ledger.storage import ObjectExists, ObjectInfo, Storage
from raytxn.metrics import LedgerMetrics
from raytxn.waiting import settled_within


@dataclass
class LedgerConfig:
    """Tuning of a managed ledger. The defaults favour throughput with low added latency."""

    group_commit: bool = True          # False: one put per append (for comparison)
    max_delay_ms: float = 0.0          # how long the first append of a batch waits for company
    max_batch_bytes: int = 1 << 20     # a larger entry flushes the batch, then goes alone
    max_batch_entries: int = 2000
    max_entry_bytes: int = 8 << 20     # MessageTooLarge above this
    max_entries_per_ledger: int = 50_000  # then roll to a new ledger (trimming frees whole ledgers)
    cache_bytes: int = 32 << 20        # decoded objects kept for reads (the tail, mostly)
    read_objects_in_flight: int = 8    # gets a read keeps going at once (objects are <= 1 MiB mostly)
    append_timeout_s: float | None = 60.0  # an append not durable by then raises StorageUnavailable
    retry_backoff_s: tuple[float, float] = (0.05, 1.0)


# A read-only reader (a range read, a compacted read) keeps few decoded objects: it reads each once.
READER_CONFIG = LedgerConfig(cache_bytes=4 << 20)


class Entry(msgspec.Struct, frozen=True):
    """One ledger entry: a batch of records at a position."""

    position: Position
    records: list[bytes]


def ledger_prefix(stream: str, ledger_id: int) -> str:
    return f"streams/{stream}/ledgers/{ledger_id:012d}"


def chunk_path(stream: str, ledger_id: int, first_entry_id: int) -> str:
    return f"{ledger_prefix(stream, ledger_id)}/{first_entry_id:012d}"


def _first_of(path: str) -> int:
    return int(path.rsplit("/", 1)[1])


_LEDGER_END = 1 << 62  # the end of a ledger another writer still has open: unknown


OPEN_ATTEMPTS = 20  # reads of the record an open may need while a zombie still rolls or trims


class StoredChunk(NamedTuple):
    """One object of a ledger: entries ``[start, end)``, its size, and when it was written."""

    start: Position
    end: Position
    size: int
    written_ms: int


class _Pending(msgspec.Struct):
    records: list[bytes]
    payload: bytes
    future: asyncio.Future
    on_durable: Callable[[Position], None] | None = None
    lingers: bool = False  # it does not wake the flusher (see "Lingering entries")


class ManagedLedger:
    """A stream opened for writing (one incarnation) or for reading only."""

    def __init__(self, storage: Storage, stream: str, config: LedgerConfig, meta: StreamMetadata,
                 writable: bool) -> None:
        self.storage = storage
        self.stream = stream
        self.config = config
        self._meta = meta
        self.writable = writable
        self._meta_lock = asyncio.Lock()
        # Per ledger: first entry id of each object -> its last entry id (-1 until known).
        self._chunks: dict[int, SortedDict] = {}
        self._cache: OrderedDict[tuple[int, int], list[Entry]] = OrderedDict()
        self._cache_sizes: dict[tuple[int, int], int] = {}
        self._cache_used = 0
        self._pending: deque[_Pending] = deque()
        self._pending_bytes = 0
        self._pending_eager = 0  # entries queued that do not linger: the flusher runs while there are some
        # Lingering entries are queued and none is due yet: what makes them due after their linger.
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering_due = False  # the queued lingering entries go in the next put
        self._flusher: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self.faults: Any = None  # the owning actor's FaultPoints: "ledger.before_put" fires there
        self._metrics = LedgerMetrics(stream)
        self._swept_below: int | None = None  # ledgers below it are deleted (None: not known yet)
        current = meta.ledgers[-1] if writable else None
        self._current = current
        self._next_entry_id = 0
        self._last_confirmed = self._compute_last_position()
        if current is not None:
            self._chunks[current.ledger_id] = SortedDict()

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, storage: Storage, stream: str, config: LedgerConfig | None = None, *,
                   writable: bool = True) -> ManagedLedger:
        """Open ``stream``. For writing: recover (seal what the last incarnation left open) and
        become the one writer, or raise ``Fenced`` if another incarnation won the race."""
        check_stream_name(stream)
        config = config or LedgerConfig()
        for _ in range(OPEN_ATTEMPTS):
            meta = await read_metadata(storage, stream)
            if not writable:
                return cls(storage, stream, config, meta or StreamMetadata(), writable=False)
            try:
                new_meta = await _recovered(storage, stream, meta or StreamMetadata())
            except _StreamMoved:
                continue  # the last writer, a zombie, rolled or trimmed meanwhile: read the record again
            await compare_and_set(storage, stream, new_meta)
            return cls(storage, stream, config, new_meta, writable=True)
        raise Fenced(f"stream {stream}: another incarnation kept changing it while this one opened it")

    async def refresh(self) -> None:
        """Re-read the metadata (readers following a stream someone else writes)."""
        if self.writable:
            raise InvalidArgument("the writer's metadata is always current")
        self._meta = await read_metadata(self.storage, self.stream) or StreamMetadata()
        self._last_confirmed = self._compute_last_position()

    # --- what the stream holds -------------------------------------------------------------

    @property
    def incarnation(self) -> int:
        return self._meta.incarnation

    @property
    def ledgers(self) -> list[LedgerInfo]:
        return [msgspec.structs.replace(info) for info in self._meta.ledgers]

    @property
    def properties(self) -> dict[str, bytes]:
        return dict(self._meta.properties)

    @property
    def trimmed_below(self) -> Position:
        return self._meta.trimmed_below

    @property
    def cached_objects(self) -> int:
        """Objects kept decoded for reads (at most ``config.cache_bytes`` of them, and the last)."""
        return len(self._cache)

    @property
    def last_position(self) -> Position:
        """The last durable entry (for a reader: as of the last refresh or read)."""
        return self._last_confirmed

    @property
    def current_ledger_id(self) -> int | None:
        return self._current.ledger_id if self._current else None

    @property
    def lingering_entries(self) -> int:
        """Entries queued that linger for company (not yet due to be put)."""
        return 0 if self._lingering_due else len(self._pending) - self._pending_eager

    def _compute_last_position(self) -> Position:
        for info in reversed(self._meta.ledgers):
            if info.closed and info.last_entry_id >= 0:
                return Position(info.ledger_id, info.last_entry_id)
        return EARLIEST

    # --- appending -------------------------------------------------------------------------

    async def append(self, records: Sequence[bytes] | bytes,
                     on_durable: Callable[[Position], None] | None = None) -> Position:
        """Append one entry (a batch of records); returns its position once it is durable.

        ``on_durable(position)`` runs as soon as the entry is durable, synchronously and in entry
        order, before any appender is woken: state machines apply logged records there, so they
        apply in exactly the order a replay of the ledger will. If it raises, that append fails
        with the error (the caller's state no longer matches its log: it must stop)."""
        return await self.durable(self.enqueue(records, on_durable))

    def enqueue(self, records: Sequence[bytes] | bytes, on_durable: Callable[[Position], None] | None = None,
                linger_s: float = 0.0) -> asyncio.Future:
        """Queue one entry, as ``append`` does, without waiting: its position comes through the
        future (await it with ``durable``). The queue order is the log order, so callers that
        prepare a record and queue it with no await in between log in the order they prepared.

        With ``linger_s`` > 0 the entry lingers (module docstring): it waits up to that long for
        the put of a later entry."""
        if isinstance(records, (bytes, bytearray, memoryview)):
            records = [bytes(records)]
        if not self.writable:
            raise InvalidArgument(f"stream {self.stream} is open for reading only")
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise InvalidArgument(f"stream {self.stream} is closed")
        records = list(records)
        payload = encode_records(records)
        if len(payload) > self.config.max_entry_bytes:
            raise MessageTooLarge(f"entry of {len(payload)} bytes exceeds {self.config.max_entry_bytes}")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        lingers = linger_s > 0
        self._pending.append(_Pending(records, payload, future, on_durable, lingers))
        self._pending_bytes += len(payload)
        if not lingers:
            self._pending_eager += 1
        elif self._queue_full():
            self._lingering_due = True  # the bound: lingering entries never queue past one put
        elif self._linger_timer is None and not self._lingering_due:
            self._linger_timer = loop.call_later(linger_s, self.flush_lingering)
        if self._flusher is None and (not lingers or self._lingering_due):
            self._start_flusher()
        return future

    async def durable(self, queued: asyncio.Future) -> Position:
        """Wait for an entry ``enqueue`` queued to be durable; its position."""
        # Wait for the entry without owning it: a caller cancelled or timed out leaves it queued
        # (``asyncio.wait_for(asyncio.shield(...))`` does the same with a task, two futures and
        # four callbacks more per append; appends are a large part of every actor's work).
        if not await settled_within(queued, self.config.append_timeout_s):
            raise StorageUnavailable(f"append to {self.stream} not durable after {self.config.append_timeout_s}s"
                                     f"{self.storage.full_note()}; it may still be written")
        return queued.result()

    def flush_lingering(self) -> None:
        """Put the lingering entries now (with whatever else is queued), without waiting."""
        self._cancel_linger_timer()
        if len(self._pending) > self._pending_eager:
            self._lingering_due = True
            if self._flusher is None:
                self._start_flusher()

    def _start_flusher(self) -> None:
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    def _cancel_linger_timer(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None

    def _queue_full(self) -> bool:
        return (self._pending_bytes >= self.config.max_batch_bytes
                or len(self._pending) >= self.config.max_batch_entries)

    def _put_due(self) -> bool:
        """Whether the queue holds something to put now: an entry that does not linger, or
        lingering ones that are due."""
        return bool(self._pending) and (self._pending_eager > 0 or self._lingering_due)

    def _take_batch(self) -> list[_Pending]:
        limit_entries = self.config.max_batch_entries if self.config.group_commit else 1
        batch: list[_Pending] = []
        size = 0
        while self._pending and len(batch) < limit_entries:
            item = self._pending[0]
            if batch and size + len(item.payload) > self.config.max_batch_bytes:
                break
            self._pending.popleft()
            self._pending_bytes -= len(item.payload)
            self._pending_eager -= not item.lingers
            batch.append(item)
            size += len(item.payload)
        if len(self._pending) == self._pending_eager:  # no lingering entry is left waiting
            self._lingering_due = False
            self._cancel_linger_timer()
        # A lingering entry left queued is due or has a timer: none waits without an end.
        assert self._lingering_due or self._linger_timer is not None or len(self._pending) == self._pending_eager
        return batch

    async def _flush_loop(self) -> None:
        batch: list[_Pending] = []
        try:
            while self._put_due():  # lingering entries left alone wait for their timer or company
                full = self._queue_full()
                if self.config.group_commit and self.config.max_delay_ms > 0 and not full:
                    await asyncio.sleep(self.config.max_delay_ms / 1000)
                batch = self._take_batch()
                assert self._current is not None
                if self._next_entry_id > 0 and (self._next_entry_id + len(batch)
                                                 > self.config.max_entries_per_ledger):
                    await self._roll()
                await self._write_batch(batch)
                batch = []
        except BaseException as e:
            failure = e if isinstance(e, (Fenced, CorruptLedger)) else Fenced(
                f"writer of {self.stream} stopped: {e!r}")
            self._failure = failure
            for item in [*batch, *self._pending]:
                if not item.future.done():
                    item.future.set_exception(failure)
            self._pending.clear()
            self._pending_bytes = 0
            self._pending_eager = 0
            self._lingering_due = False
            self._cancel_linger_timer()
            if not isinstance(e, Exception):
                raise
        finally:
            self._flusher = None

    async def _write_batch(self, batch: list[_Pending]) -> None:
        current = self._current
        assert current is not None
        first = self._next_entry_id
        version = self.storage.write_format
        data = b"".join(encode_frame(FrameKind.ENTRY, first + i, item.payload, version)
                        for i, item in enumerate(batch))
        path = chunk_path(self.stream, current.ledger_id, first)
        await self._put_retrying(path, data)
        last = first + len(batch) - 1
        self._next_entry_id = last + 1
        self._last_confirmed = Position(current.ledger_id, last)
        self._chunks[current.ledger_id][first] = last
        entries = [Entry(Position(current.ledger_id, first + i), item.records) for i, item in enumerate(batch)]
        self._cache_put((current.ledger_id, first), entries, len(data))
        for entry, item in zip(entries, batch, strict=True):
            if item.on_durable is not None:
                try:
                    item.on_durable(entry.position)
                except Exception as e:  # noqa: BLE001 - handed to that appender, who must stop
                    if not item.future.done():
                        item.future.set_exception(e)
                    continue
            if not item.future.done():
                item.future.set_result(entry.position)

    async def _put_retrying(self, path: str, data: bytes) -> None:
        """Create ``path`` with ``data``, retrying storage outages with backoff until it lands.

        A retry may find the object there because an earlier attempt landed but its reply was
        lost; the same bytes mean success, other bytes mean another incarnation wrote: Fenced."""
        from raytxn.faults import InjectedFault

        delay, max_delay = self.config.retry_backoff_s
        started = time.perf_counter()  # the latency appenders wait for: retries included
        while True:
            try:
                if self.faults is not None:
                    await self.faults.hit("ledger.before_put", stream=self.stream, path=path)
                await self.storage.create(path, data)
                self._metrics.put_latency((time.perf_counter() - started) * 1000)
                return
            except ObjectExists as e:
                try:  # the read that tells a lost reply from another writer is retried like the put
                    existing = await self.storage.get(path)
                except StorageUnavailable:
                    existing = None
                else:
                    if existing == data:
                        self._metrics.put_latency((time.perf_counter() - started) * 1000)
                        return
                    raise Fenced(f"stream {self.stream}: {path} was written by another incarnation") from e
            except (StorageUnavailable, InjectedFault):  # an injected fault stands for a storage error
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)

    async def _roll(self) -> None:
        """Close the current ledger (SEAL, then metadata) and continue in a new one."""
        current = self._current
        assert current is not None
        seal = encode_frame(FrameKind.SEAL, self._next_entry_id, b"", version=self.storage.write_format)
        await self._put_retrying(chunk_path(self.stream, current.ledger_id, self._next_entry_id), seal)
        async with self._meta_lock:
            meta = self._meta
            new_id = meta.next_ledger_id
            closed = LedgerInfo(current.ledger_id, True, self._next_entry_id - 1, current.created_ms)
            new = LedgerInfo(new_id, created_ms=int(time.time() * 1000))
            updated = msgspec.structs.replace(meta, version=meta.version + 1,
                                              ledgers=[*meta.ledgers[:-1], closed, new],
                                              next_ledger_id=new_id + 1)
            self._meta = await compare_and_set(self.storage, self.stream, updated,
                                               retry_backoff_s=self.config.retry_backoff_s)
        self._current = new
        self._next_entry_id = 0
        self._chunks[new_id] = SortedDict()

    async def flush(self) -> None:
        """Wait until everything appended so far is durable (lingering entries too)."""
        self.flush_lingering()
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        if self._failure is not None:
            raise self._failure

    async def check_still_writer(self) -> None:
        """Raise ``Fenced`` if another incarnation opened this stream after this one did.

        A write finds that out by itself (its create collides with the seal). This is for an
        answer that writes nothing yet vouches for the stream's state - an end acknowledged for a
        txn this incarnation never saw: a zombie would vouch for data only its successor holds."""
        if not self.writable:
            raise InvalidArgument(f"stream {self.stream} is open for reading only")
        if self._failure is not None:
            raise self._failure
        latest = await read_metadata(self.storage, self.stream)
        if latest is None or latest.incarnation != self._meta.incarnation:
            raise Fenced(f"stream {self.stream}: incarnation {self._meta.incarnation} was replaced by "
                         f"{None if latest is None else latest.incarnation}")

    # --- metadata updates ------------------------------------------------------------------

    async def set_properties(self, updates: dict[str, bytes | None]) -> None:
        """Change the stream's small properties (``None`` deletes a key) by compare-and-set."""
        if not self.writable:
            raise InvalidArgument(f"stream {self.stream} is open for reading only")
        async with self._meta_lock:
            props = dict(self._meta.properties)
            for key, value in updates.items():
                if value is None:
                    props.pop(key, None)
                else:
                    props[key] = value
            updated = msgspec.structs.replace(self._meta, version=self._meta.version + 1, properties=props)
            self._meta = await compare_and_set(self.storage, self.stream, updated,
                                               retry_backoff_s=self.config.retry_backoff_s)

    async def trim(self, below: Position) -> Position:
        """Delete every entry before ``below`` (clamped to the end of the stream); returns the new
        trim point. Whole closed ledgers go, and objects of the ledger ``below`` falls in that lie
        entirely before it."""
        if not self.writable:
            raise InvalidArgument(f"stream {self.stream} is open for reading only")
        below = min(below, Position(self._last_confirmed.ledger_id, self._last_confirmed.entry_id + 1))
        async with self._meta_lock:
            meta = self._meta
            if below <= meta.trimmed_below:
                return meta.trimmed_below
            gone = [info for info in meta.ledgers[:-1]
                    if Position(info.ledger_id, info.last_entry_id) < below]
            kept = [info for info in meta.ledgers if info not in gone]
            updated = msgspec.structs.replace(meta, version=meta.version + 1, ledgers=kept,
                                              trimmed_below=below)
            self._meta = await compare_and_set(self.storage, self.stream, updated,
                                               retry_backoff_s=self.config.retry_backoff_s)
        for info in gone:
            self._chunks.pop(info.ledger_id, None)
        await self._delete_ledgers_below(kept[0].ledger_id)
        # Objects of the ledger holding `below` that end before it.
        if any(info.ledger_id == below.ledger_id for info in kept):
            index = await self._chunk_index(below.ledger_id)
            firsts = list(index.keys())
            doomed = [f for f, nxt in itertools.pairwise(firsts) if nxt <= below.entry_id]
            await self.storage.delete([chunk_path(self.stream, below.ledger_id, f) for f in doomed])
            for f in doomed:
                del index[f]
                self._cache_drop((below.ledger_id, f))
        for key in [k for k in self._cache if Position(k[0], k[1]) < below and k[0] != below.ledger_id]:
            self._cache_drop(key)
        return below

    async def _delete_ledgers_below(self, first_kept: int) -> None:
        """Delete the objects of every ledger below ``first_kept``: those just trimmed, and those
        an interrupted trim (metadata updated, objects not yet deleted) or a reopening that
        dropped an empty ledger left. The first trim of a writer looks at every ledger folder
        (earlier writers' leftovers); later ones at the ledger ids passed since."""
        if self._swept_below is None:
            folders = await self.storage.list_folders(f"streams/{self.stream}/ledgers")
            ids: Iterable[int] = sorted(int(f.rsplit("/", 1)[1]) for f in folders if f.rsplit("/", 1)[1].isdigit())
        else:
            ids = range(self._swept_below, first_kept)
        tombstones = self._meta.tombstones
        for ledger_id in ids:
            if ledger_id < first_kept:
                paths = await self.storage.list(ledger_prefix(self.stream, ledger_id))
                if ledger_id in tombstones:  # the SEAL that fences a zombie stays (see metadata.py)
                    seal = chunk_path(self.stream, ledger_id, tombstones[ledger_id])
                    paths = [path for path in paths if path != seal]
                await self.storage.delete(paths)
        self._swept_below = first_kept

    async def stored_objects(self) -> list[StoredChunk]:
        """The objects of the stream's ledgers, in position order: the entries each holds, its
        size and when it was written (the store's clock). A SEAL object holds no entries."""
        by_ledger: dict[int, list[ObjectInfo]] = {}
        for info in await self.storage.list_info(f"streams/{self.stream}/ledgers"):
            ledger_id, first = info.path.rsplit("/", 2)[1:]
            if ledger_id.isdigit() and first.isdigit():
                by_ledger.setdefault(int(ledger_id), []).append(info)
        chunks: list[StoredChunk] = []
        for ledger in self._meta.ledgers:
            objects = by_ledger.get(ledger.ledger_id, [])
            if not objects:  # a ledger nothing was written to yet
                continue
            last = self._known_last(ledger)
            ends = [_first_of(o.path) for o in objects[1:]] + [_LEDGER_END if last is None else last + 1]
            for stored, end in zip(objects, ends, strict=True):
                first = _first_of(stored.path)
                chunks.append(StoredChunk(Position(ledger.ledger_id, first),
                                          Position(ledger.ledger_id, max(first, end)), stored.size,
                                          stored.modified_ms))
        return chunks

    async def close(self) -> None:
        """Flush, seal the current ledger and record it closed. The stream can be reopened."""
        if not self.writable or self._closed:
            self._closed = True
            return
        await self.flush()
        self._closed = True
        current = self._current
        assert current is not None
        seal = encode_frame(FrameKind.SEAL, self._next_entry_id, b"", version=self.storage.write_format)
        await self._put_retrying(chunk_path(self.stream, current.ledger_id, self._next_entry_id), seal)
        async with self._meta_lock:
            meta = self._meta
            closed = LedgerInfo(current.ledger_id, True, self._next_entry_id - 1, current.created_ms)
            ledgers = [*meta.ledgers[:-1]] + ([closed] if closed.last_entry_id >= 0 else [])
            updated = msgspec.structs.replace(meta, version=meta.version + 1, ledgers=ledgers)
            self._meta = await compare_and_set(self.storage, self.stream, updated,
                                               retry_backoff_s=self.config.retry_backoff_s)

    # --- reading ---------------------------------------------------------------------------

    async def read(self, start: Position, max_entries: int = 1000, end: Position | None = None) -> list[Entry]:
        """Entries at or after ``start`` (and at or before ``end``), in order, at most
        ``max_entries``. Reads stop at the last durable entry; ``PositionTrimmed`` below the trim
        point."""
        if max_entries <= 0:
            return []
        if start < self._meta.trimmed_below:
            start = max(start, Position(start.ledger_id, 0))
            if start < self._meta.trimmed_below:
                raise PositionTrimmed(f"{self.stream}: {start} is below the trim point "
                                      f"{self._meta.trimmed_below}")
        out: list[Entry] = []
        for info in list(self._meta.ledgers):
            if info.ledger_id < start.ledger_id:
                continue
            if end is not None and info.ledger_id > end.ledger_id:
                break
            from_entry = start.entry_id if info.ledger_id == start.ledger_id else 0
            from_entry = max(from_entry, self._first_readable(info.ledger_id))
            try:
                await self._read_ledger(info, from_entry, end, max_entries, out)
            except CorruptLedger:
                if start < self._meta.trimmed_below:  # a trim overtook this read: not corruption
                    raise PositionTrimmed(f"{self.stream}: {start} was trimmed during the read (now "
                                          f"below {self._meta.trimmed_below})") from None
                raise
            if len(out) >= max_entries:
                break
        return out

    def _first_readable(self, ledger_id: int) -> int:
        trimmed = self._meta.trimmed_below
        return trimmed.entry_id if trimmed.ledger_id == ledger_id else 0

    def _known_last(self, info: LedgerInfo) -> int | None:
        """Last entry of a ledger when known: closed ledgers, and the one this writer owns."""
        if info.closed:
            return info.last_entry_id
        if self._current is not None and info.ledger_id == self._current.ledger_id:
            return self._next_entry_id - 1
        return None  # open ledger of another (possibly crashed) writer: read its tail

    async def _read_ledger(self, info: LedgerInfo, from_entry: int, end: Position | None,
                           max_entries: int, out: list[Entry]) -> None:
        last = self._known_last(info)
        if end is not None and end.ledger_id == info.ledger_id:
            last = end.entry_id if last is None else min(last, end.entry_id)
        if last is not None and from_entry > last:
            return
        index = await self._chunk_index(info.ledger_id, refresh=last is None)
        pos = index.bisect_right(from_entry) - 1
        if pos < 0:
            if last is None and not index:
                return
            expected = chunk_path(self.stream, info.ledger_id, from_entry)
            raise CorruptLedger(f"missing ledger object {expected}", expected)
        # A copy (a write may add a chunk while a load awaits) of only the chunks this read can
        # reach: the first may end before ``from_entry``, every later one holds an entry at least
        # (or seals the ledger). A copy of the whole index cost every read O(chunks).
        firsts = list(index.islice(pos, pos + max_entries + 1))
        # Entry ids are contiguous in a ledger, so the objects starting at or below ``reach`` are
        # ones this read needs: their gets go out together (loads.py). Where a get is a round trip
        # (S3), a 20-entry read of 11 objects one after the other waited for 11 of them.
        reach = from_entry + max_entries - len(out) - 1
        reach = reach if last is None else min(reach, last)
        needed = max(1, bisect.bisect_right(firsts, reach))  # firsts is ascending
        async with ObjectLoads(functools.partial(self._load_chunk, info.ledger_id), firsts, needed,
                               self.config.read_objects_in_flight) as loads:
            await self._check_entries(info, from_entry, last, max_entries, out, firsts, loads)

    async def _check_entries(self, info: LedgerInfo, from_entry: int, last: int | None, max_entries: int,
                             out: list[Entry], firsts: list[int], loads: ObjectLoads) -> None:
        """The entries of the objects ``firsts`` (loaded in order by ``loads``), checked contiguous,
        from ``from_entry`` up to ``last``, into ``out`` until it holds ``max_entries``."""
        expected_first = firsts[0]
        for first in firsts:
            if first != expected_first:
                missing = chunk_path(self.stream, info.ledger_id, expected_first)
                raise CorruptLedger(f"missing ledger object {missing}", missing)
            entries, sealed_at = await loads.next()
            for entry in entries:
                if entry.position.entry_id < from_entry:
                    continue
                if last is not None and entry.position.entry_id > last:
                    return
                out.append(entry)
                if len(out) >= max_entries:
                    return
            if sealed_at is not None:
                if last is not None and sealed_at <= last:
                    path = chunk_path(self.stream, info.ledger_id, first)
                    raise CorruptLedger(f"ledger sealed at {sealed_at} in {path} but metadata says "
                                        f"entries up to {last}", path)
                break
            expected_first = entries[-1].position.entry_id + 1 if entries else first
            if last is not None and expected_first > last:
                return
        if last is not None and (not out or out[-1].position < Position(info.ledger_id, last)):
            missing = chunk_path(self.stream, info.ledger_id, expected_first)
            raise CorruptLedger(f"missing ledger object {missing} (entries up to {last} expected)", missing)
        if last is None and (out and out[-1].position.ledger_id == info.ledger_id):
            self._last_confirmed = max(self._last_confirmed, out[-1].position)

    async def _chunk_index(self, ledger_id: int, refresh: bool = False) -> SortedDict:
        index = self._chunks.get(ledger_id)
        if index is None or (refresh and not (self._current and self._current.ledger_id == ledger_id)):
            paths = await self.storage.list(ledger_prefix(self.stream, ledger_id))
            index = SortedDict({_first_of(p): -1 for p in paths if not p.rsplit("/", 1)[1].startswith(".")})
            self._chunks[ledger_id] = index
        return index

    async def _load_chunk(self, ledger_id: int, first: int) -> tuple[list[Entry], int | None]:
        """The data entries of one object, and the entry id of a SEAL in it (else None)."""
        key = (ledger_id, first)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached, None
        path = chunk_path(self.stream, ledger_id, first)
        data = await self.storage.get(path)
        if data is None:
            raise CorruptLedger(f"missing ledger object {path}", path)
        entries: list[Entry] = []
        sealed_at: int | None = None
        for i, (kind, entry_id, payload) in enumerate(decode_frames(data, path)):
            if entry_id != first + i:
                raise CorruptLedger(f"{path}: frame {i} has entry id {entry_id}, expected {first + i}", path)
            if kind == FrameKind.SEAL:
                sealed_at = entry_id
                break
            if kind != FrameKind.ENTRY:
                raise CorruptLedger(f"{path}: unexpected frame kind {kind.name}", path)
            entries.append(Entry(Position(ledger_id, entry_id), decode_records(payload, path)))
        if sealed_at is None:
            self._cache_put(key, entries, len(data))
        return entries, sealed_at

    def _cache_put(self, key: tuple[int, int], entries: list[Entry], size: int) -> None:
        self._cache_drop(key)
        self._cache[key] = entries
        self._cache_sizes[key] = size
        self._cache_used += size
        while self._cache_used > self.config.cache_bytes and len(self._cache) > 1:
            oldest = next(iter(self._cache))
            self._cache_drop(oldest)

    def _cache_drop(self, key: tuple[int, int]) -> None:
        if key in self._cache:
            del self._cache[key]
            self._cache_used -= self._cache_sizes.pop(key)


class _StreamMoved(Exception):
    """An object of the ledger being sealed vanished: its writer (a zombie) trimmed it away."""


async def _recovered(storage: Storage, stream: str, meta: StreamMetadata) -> StreamMetadata:
    """The record a new writer creates from ``meta``: every ledger the last one left open sealed
    (and its SEAL kept as a tombstone, see metadata.py), and a fresh ledger to write."""
    ledgers: list[LedgerInfo] = []
    tombstones = dict(meta.tombstones)
    for info in meta.ledgers:
        if not info.closed:
            last = await _seal(storage, stream, info.ledger_id)
            tombstones[info.ledger_id] = last + 1
            info = LedgerInfo(info.ledger_id, closed=True, last_entry_id=last, created_ms=info.created_ms)
        if info.last_entry_id >= 0:  # empty ledgers hold nothing worth listing
            ledgers.append(info)
    new_id = meta.next_ledger_id
    ledgers.append(LedgerInfo(new_id, created_ms=int(time.time() * 1000)))
    return StreamMetadata(version=meta.version + 1, incarnation=meta.incarnation + 1, ledgers=ledgers,
                          trimmed_below=meta.trimmed_below, next_ledger_id=new_id + 1,
                          properties=dict(meta.properties), tombstones=tombstones)


async def _seal(storage: Storage, stream: str, ledger_id: int) -> int:
    """Seal a ledger another incarnation left open; returns its last entry id (-1 if empty).

    Finds the first free entry id after the last object and creates a SEAL there. Losing that race
    to the zombie's own put just means scanning again: whatever it wrote before the seal counts."""
    prefix = ledger_prefix(stream, ledger_id)
    while True:
        paths = await storage.list(prefix)
        tail = -1
        if paths:
            path = paths[-1]
            data = await storage.get(path)
            if data is None:  # listed, then deleted: only a writer's trim deletes ledger objects
                raise _StreamMoved(path)
            frames = decode_frames(data, path)
            first = _first_of(path)
            for i, (kind, entry_id, _payload) in enumerate(frames):
                if entry_id != first + i:
                    raise CorruptLedger(f"{path}: frame {i} has entry id {entry_id}", path)
                if kind == FrameKind.SEAL:
                    return entry_id - 1
                tail = entry_id
        try:
            await storage.create(f"{prefix}/{tail + 1:012d}",
                                 encode_frame(FrameKind.SEAL, tail + 1, b"", version=storage.write_format))
            return tail
        except ObjectExists:
            continue
