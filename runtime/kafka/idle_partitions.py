"""The partitions a gateway knows to hold nothing past where their consumers fetch: their ends,
kept true by one long-polling watch per partition instead of a read per Fetch.

A Kafka consumer names every assigned partition in every Fetch (librdkafka never opens a KIP-227
fetch session; a client that does still has each of its partitions checked on every Fetch), and
the gateway read each from its partition actor: one engine call per partition per Fetch, data or
not, which made idle partitions most of the cost of a consumer of many (``tools/profile_idle_fetch``).

Here, once two reads in a row found a partition at its end with nothing to give (at the same
offset: a busy partition found at its end between two appends is read as before), the gateway
keeps the partition's marks (log start, last stable offset, high watermark) and one watch call to
it that waits for its high watermark to move (``kafka_read`` at the high watermark, uncommitted,
waiting ``WATCH_S``). Every append and every transaction marker moves the high watermark, and
nothing else moves the last stable offset. While the watch stands and has seen nothing move, a
fetch at that end is answered from the marks without an engine call, and a Fetch waiting for
data waits on the watch rather than calling the partition again. When the watch returns data,
other marks or an error, the partition is forgotten and the next fetch reads it.

Only with the engine's authentication off: a read is where the partition actor checks the
connection's right to consume (``authorization``), so with it on every fetch still reads.

Bounded: ``MAX_WATCHED`` partitions at once; a partition no fetch asked for in ``UNUSED_S`` is
no longer watched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from raytxn.waiting import Flag

log = logging.getLogger(__name__)
WATCH_S = 10.0     # one watch call waits this long for the end to move, then the next one is made
UNUSED_S = 30.0    # a partition no fetch asked for this long is no longer watched
MAX_WATCHED = 10_000
MARKS = ("log_start", "last_stable", "high_watermark")

PartitionCall = Callable[..., Awaitable[Any]]  # ``call(topic, partition, method, *args)``


@dataclass
class _Watched:
    marks: dict[str, int]
    used_at: float
    moved: Flag = field(default_factory=Flag)  # set once the marks may be stale: never cleared
    task: asyncio.Task | None = None


class IdlePartitions:
    def __init__(self, call: PartitionCall, clock: Callable[[], float] = time.monotonic) -> None:
        self._call, self._clock = call, clock
        self._watched: dict[tuple[str, int], _Watched] = {}
        self._empty_at: dict[tuple[str, int], int] = {}  # the offset a read last found a partition empty at
        # answered: fetches answered from the marks; watches: watch calls made; forgotten: by why
        self.stats: dict[str, Any] = {"answered": 0, "watches": 0, "forgotten": {}}

    def __len__(self) -> int:
        return len(self._watched)

    def answer(self, topic: str, partition: int, offset: int, committed: bool) -> dict[str, Any] | None:
        """A read's answer for a fetch at ``offset``, if the partition is known to hold nothing past
        it (``kafka_read``'s shape, no entries); else None: read it."""
        watched = self._live(topic, partition, offset, committed)
        if watched is None:
            return None
        watched.used_at = self._clock()
        self.stats["answered"] += 1
        return {**watched.marks, "entries": [], "compacted": [], "aborted": [], "out_of_range": False}

    def moved(self, topic: str, partition: int, offset: int, committed: bool) -> asyncio.Future | None:
        """A future done once the partition's end moves, if it is watched at ``offset``; else None."""
        watched = self._live(topic, partition, offset, committed)
        return None if watched is None else watched.moved.future()

    def _live(self, topic: str, partition: int, offset: int, committed: bool) -> _Watched | None:
        watched = self._watched.get((topic, partition))
        if watched is None or watched.moved.is_set():
            return None
        return watched if offset == watched.marks["last_stable" if committed else "high_watermark"] else None

    def learn(self, topic: str, partition: int, offset: int, committed: bool, read: dict[str, Any]) -> None:
        """After a read of ``offset`` (``kafka_read``'s answer): watch the partition once two reads
        in a row found it at the same end with nothing to give (a busy partition, found at its end
        between two appends now and then, is read as before: its next read would find data)."""
        key = (topic, partition)
        if "error" in read or read["out_of_range"] or read["entries"] or read.get("compacted"):
            self._empty_at.pop(key, None)
            return
        marks = {mark: read[mark] for mark in MARKS}
        if offset != marks["last_stable" if committed else "high_watermark"]:
            return
        if self._empty_at.get(key) != offset:
            if len(self._empty_at) >= MAX_WATCHED:
                self._empty_at.clear()  # a bound; a partition idle still is seen twice again soon
            self._empty_at[key] = offset
            return
        known = self._watched.get(key)
        if (known is not None and not known.moved.is_set()) or len(self._watched) >= MAX_WATCHED:
            return  # watched already (a fetch that read it just before the watch began), or full
        del self._empty_at[key]
        watched = _Watched(marks, self._clock())
        self._watched[key] = watched
        watched.task = asyncio.get_running_loop().create_task(self._watch(key, watched))

    async def _watch(self, key: tuple[str, int], watched: _Watched) -> None:
        reason = "error"
        try:
            while True:  # bounded: each turn waits up to WATCH_S, and an unused partition ends it
                if self._clock() - watched.used_at > UNUSED_S:
                    reason = "unused"
                    break
                self.stats["watches"] += 1
                read = await self._call(*key, "kafka_read", watched.marks["high_watermark"], 1, False, WATCH_S)
                if read["entries"] or read["out_of_range"] or any(read[m] != watched.marks[m] for m in MARKS):
                    reason = "moved"
                    break
        except asyncio.CancelledError:
            reason = "cancelled"
            raise
        except Exception as e:  # noqa: BLE001 - a partition restarting or deleted: read it next time
            log.info("watch of %s-%d ended: %r", *key, e)
        finally:
            watched.moved.set()
            if self._watched.get(key) is watched:
                del self._watched[key]
            forgotten = self.stats["forgotten"]
            forgotten[reason] = forgotten.get(reason, 0) + 1  # keys: the few reasons above

    def forget(self, topic: str) -> None:
        """Stop watching a topic's partitions (deleted or made again here)."""
        for key in [k for k in self._watched if k[0] == topic]:
            self._end(self._watched[key])

    def close(self) -> None:
        for watched in list(self._watched.values()):
            self._end(watched)

    @staticmethod
    def _end(watched: _Watched) -> None:
        watched.moved.set()  # no answer from it from now on, before its task has run its last step
        if watched.task is not None:
            watched.task.cancel()
