"""The trace of one simulated run: what happened, in order, with the virtual time of each event.

The same seed must give the same trace byte for byte; ``digest`` is the hash a test compares. An
event is a tuple of strings and numbers rendered with ``repr``: no object ids, no wall time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

MAX_EVENTS = 1_000_000  # a run recording more than this has a runaway loop: stop it
MAX_DETAIL_CHARS = 300
HASH_BLOCK_LINES = 512


class TraceOverflow(RuntimeError):
    pass


class Trace:
    def __init__(self, clock: Callable[[], float], keep: bool = False) -> None:
        self._clock = clock
        self._hash = hashlib.sha256()
        # Lines not hashed yet: hashed in blocks (a hash of the lines joined is the hash of them
        # one by one), as one update per event cost more than the event's formatting.
        self._unhashed: list[str] = []
        self.count = 0
        self.kept: list[str] | None = [] if keep else None  # the lines themselves, for debugging

    def add(self, kind: str, *fields: object, detail: object = None) -> None:
        """Record an event. ``detail`` (e.g. a call's arguments) is shown in kept lines only and
        is not hashed: keeping the lines never changes the digest."""
        self.count += 1
        if self.count > MAX_EVENTS:
            raise TraceOverflow(f"more than {MAX_EVENTS} trace events")
        line = f"{self._clock():.6f} {kind} {' '.join(map(repr, fields))}\n"
        unhashed = self._unhashed
        unhashed.append(line)
        if len(unhashed) >= HASH_BLOCK_LINES:
            self._flush()
        if self.kept is not None:
            shown = "" if detail is None else f"  {repr(detail)[:MAX_DETAIL_CHARS]}"
            self.kept.append(f"{line[:-1]}{shown}\n")

    def _flush(self) -> None:
        self._hash.update("".join(self._unhashed).encode())
        self._unhashed.clear()

    def digest(self) -> str:
        self._flush()
        return self._hash.hexdigest()
