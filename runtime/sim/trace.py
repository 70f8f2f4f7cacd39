"""The trace of one simulated run: what happened, in order, with the virtual time of each event.

The same seed must give the same trace byte for byte; ``digest`` is the hash a test compares. An
event is a tuple of strings and numbers rendered with ``repr``: no object ids, no wall time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

MAX_EVENTS = 1_000_000  # a run recording more than this has a runaway loop: stop it
MAX_DETAIL_CHARS = 300


class TraceOverflow(RuntimeError):
    pass


class Trace:
    def __init__(self, clock: Callable[[], float], keep: bool = False) -> None:
        self._clock = clock
        self._hash = hashlib.sha256()
        self.count = 0
        self.kept: list[str] | None = [] if keep else None  # the lines themselves, for debugging

    def add(self, kind: str, *fields: object, detail: object = None) -> None:
        """Record an event. ``detail`` (e.g. a call's arguments) is shown in kept lines only and
        is not hashed: keeping the lines never changes the digest."""
        self.count += 1
        if self.count > MAX_EVENTS:
            raise TraceOverflow(f"more than {MAX_EVENTS} trace events")
        line = f"{self._clock():.6f} {kind} {' '.join(map(repr, fields))}"
        self._hash.update(line.encode() + b"\n")
        if self.kept is not None:
            shown = "" if detail is None else f"  {repr(detail)[:MAX_DETAIL_CHARS]}"
            self.kept.append(f"{line}{shown}\n")

    def digest(self) -> str:
        return self._hash.hexdigest()
