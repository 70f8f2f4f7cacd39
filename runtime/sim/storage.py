"""Simulated object storage: the four operations of ``raytxn.ledger.storage.Storage`` in memory,
with seeded latency and faults.

Each operation waits a random latency, takes effect at one instant in the middle of it (so two
operations in flight interleave as they would on a real store), then waits the rest. Faults, drawn
from the simulator's one ``random.Random``:

- a put or delete that fails before it takes effect (``StorageUnavailable``);
- a put that takes effect but whose reply is lost (``StorageUnavailable`` all the same: the
  ledger's retry then finds its own bytes there, or another writer's);
- a slow operation (latency times ``slow_factor``);
- a get or list that fails.

Faults stop when ``faults_on`` is cleared (the quiet period at the end of a run). A drawn fault
takes effect only when the run's ``FaultGate`` allows it (always, unless a schedule masks or caps
faults: ``gate.py``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedList

from raytxn.errors import StorageUnavailable
from raytxn.ledger.storage import ObjectExists, ObjectInfo, Storage
from raytxn.sim.gate import FaultGate
from raytxn.sim.loop import SimLoop
from raytxn.sim.trace import Trace


@dataclass(frozen=True)
class StorageFaults:
    """Probabilities per operation, and latencies in seconds."""

    put_fail: float = 0.0
    put_reply_lost: float = 0.0
    get_fail: float = 0.0
    slow: float = 0.0
    latency_s: tuple[float, float] = (0.001, 0.005)
    slow_factor: float = 50.0


class SimStorage(Storage):
    """In-memory objects behind the ``Storage`` interface (a ``Storage`` subclass, so every
    ``isinstance`` and type hint holds)."""

    def __init__(self, rng: random.Random, faults: StorageFaults, trace: Trace, clock_ms: Callable[[], int],
                 gate: FaultGate | None = None, loop: SimLoop | None = None) -> None:
        super().__init__(store=None, url="sim://")
        self._rng = rng
        self._faults = faults
        self._trace = trace
        self._gate = FaultGate(trace) if gate is None else gate
        self._clock_ms = clock_ms
        # The loop's own sleep when the world passes its loop (the same timers, less overhead).
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep if loop is None else loop.sleep
        self._objects: dict[str, tuple[bytes, int]] = {}  # path -> (data, modified ms)
        # The same paths in order: a list reads only its folder's range, not every object stored
        # (a run stores thousands of objects and lists them thousands of times).
        self._paths: SortedList = SortedList()
        self.faults_on = True
        self.injected = 0
        # Called with (path, data) as an object is created: a harness's observers (the compaction
        # profile keeps every compacted generation published, also those deleted since).
        self.on_create: list[Callable[[str, bytes], None]] = []

    # --- the store's own behaviour ---------------------------------------------------------

    def _latency(self) -> float:
        low, high = self._faults.latency_s
        latency = self._rng.uniform(low, high)
        if self.faults_on and self._rng.random() < self._faults.slow and self._gate.allow("slow"):
            latency *= self._faults.slow_factor
        return latency

    def _fails(self, kind: str, what: str, path: str) -> bool:
        """Draws a fault of ``kind`` (the name of its probability in ``StorageFaults``)."""
        probability: float = getattr(self._faults, kind)
        if self.faults_on and probability > 0 and self._rng.random() < probability and self._gate.allow(kind):
            self.injected += 1
            self._trace.add("storage_fault", what, path)
            return True
        return False

    # --- the Storage interface -------------------------------------------------------------

    async def create(self, path: str, data: bytes) -> None:
        latency = self._latency()
        await self._sleep(latency / 2)
        if self._fails("put_fail", "put_fail", path):
            raise StorageUnavailable(f"put {path}: injected failure")
        if path in self._objects:
            await self._sleep(latency / 2)
            raise ObjectExists(path)
        self._objects[path] = (bytes(data), self._clock_ms())
        self._paths.add(path)
        for observer in self.on_create:
            observer(path, self._objects[path][0])
        await self._sleep(latency / 2)
        if self._fails("put_reply_lost", "put_reply_lost", path):
            raise StorageUnavailable(f"put {path}: injected lost reply")

    async def get(self, path: str) -> bytes | None:
        await self._sleep(self._latency())
        if self._fails("get_fail", "get_fail", path):
            raise StorageUnavailable(f"get {path}: injected failure")
        found = self._objects.get(path)
        return None if found is None else found[0]

    async def list_info(self, prefix: str) -> list[ObjectInfo]:
        await self._sleep(self._latency())
        if self._fails("get_fail", "list_fail", prefix):
            raise StorageUnavailable(f"list {prefix}: injected failure")
        infos = []
        for path in self._under(prefix.rstrip("/") + "/"):
            data, modified = self._objects[path]
            infos.append(ObjectInfo(path, len(data), modified))
        return infos  # in path order, as sorting them would give (paths are unique)

    async def list_folders(self, prefix: str) -> list[str]:
        await self._sleep(self._latency())
        if self._fails("get_fail", "list_fail", prefix):
            raise StorageUnavailable(f"list {prefix}: injected failure")
        folder = prefix.rstrip("/") + "/"
        return sorted({folder + path[len(folder):].split("/", 1)[0] for path in self._under(folder)
                       if "/" in path[len(folder):]})

    async def delete(self, paths: list[str]) -> None:
        if not paths:
            return
        latency = self._latency()
        await self._sleep(latency / 2)
        if self._fails("put_fail", "delete_fail", paths[0]):
            raise StorageUnavailable(f"delete {paths[0]}...: injected failure")
        for path in paths:
            if self._objects.pop(path, None) is not None:
                self._paths.remove(path)
        await self._sleep(latency / 2)

    def _under(self, folder: str) -> Iterator[str]:
        """The stored paths that start with ``folder``, in order (they are one range of ``_paths``)."""
        for path in self._paths.irange(minimum=folder):
            if not path.startswith(folder):
                return
            yield path

    # --- for the harness -------------------------------------------------------------------

    def place(self, path: str, data: bytes) -> None:
        """An object stored before the run begins (what a setup wrote): no latency, no fault, and
        no draw of the run's random numbers."""
        assert path not in self._objects, path
        self._objects[path] = (bytes(data), self._clock_ms())
        self._paths.add(path)

    def object_count(self) -> int:
        return len(self._objects)
