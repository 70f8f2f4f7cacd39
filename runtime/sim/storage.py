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
from collections.abc import Callable
from dataclasses import dataclass

from raytxn.errors import StorageUnavailable
from raytxn.ledger.storage import ObjectExists, ObjectInfo, Storage
from raytxn.sim.gate import FaultGate
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
                 gate: FaultGate | None = None) -> None:
        super().__init__(store=None, url="sim://")
        self._rng = rng
        self._faults = faults
        self._trace = trace
        self._gate = FaultGate(trace) if gate is None else gate
        self._clock_ms = clock_ms
        self._objects: dict[str, tuple[bytes, int]] = {}  # path -> (data, modified ms)
        self.faults_on = True
        self.injected = 0

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
        await asyncio.sleep(latency / 2)
        if self._fails("put_fail", "put_fail", path):
            raise StorageUnavailable(f"put {path}: injected failure")
        if path in self._objects:
            await asyncio.sleep(latency / 2)
            raise ObjectExists(path)
        self._objects[path] = (bytes(data), self._clock_ms())
        await asyncio.sleep(latency / 2)
        if self._fails("put_reply_lost", "put_reply_lost", path):
            raise StorageUnavailable(f"put {path}: injected lost reply")

    async def get(self, path: str) -> bytes | None:
        await asyncio.sleep(self._latency())
        if self._fails("get_fail", "get_fail", path):
            raise StorageUnavailable(f"get {path}: injected failure")
        found = self._objects.get(path)
        return None if found is None else found[0]

    async def list_info(self, prefix: str) -> list[ObjectInfo]:
        await asyncio.sleep(self._latency())
        if self._fails("get_fail", "list_fail", prefix):
            raise StorageUnavailable(f"list {prefix}: injected failure")
        folder = prefix.rstrip("/") + "/"
        return sorted(ObjectInfo(path, len(data), modified) for path, (data, modified) in self._objects.items()
                      if path.startswith(folder))

    async def list_folders(self, prefix: str) -> list[str]:
        await asyncio.sleep(self._latency())
        if self._fails("get_fail", "list_fail", prefix):
            raise StorageUnavailable(f"list {prefix}: injected failure")
        folder = prefix.rstrip("/") + "/"
        return sorted({folder + path[len(folder):].split("/", 1)[0] for path in self._objects
                       if path.startswith(folder) and "/" in path[len(folder):]})

    async def delete(self, paths: list[str]) -> None:
        if not paths:
            return
        latency = self._latency()
        await asyncio.sleep(latency / 2)
        if self._fails("put_fail", "delete_fail", paths[0]):
            raise StorageUnavailable(f"delete {paths[0]}...: injected failure")
        for path in paths:
            self._objects.pop(path, None)
        await asyncio.sleep(latency / 2)

    # --- for the harness -------------------------------------------------------------------

    def object_count(self) -> int:
        return len(self._objects)
