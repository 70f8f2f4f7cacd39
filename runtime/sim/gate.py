"""Which drawn faults take effect: the one place a shrunk schedule (``schedule.py``) turns faults off.

Storage, network and the nemesis draw each fault from the run's ``random.Random`` exactly as they
always do, and only then ask the gate whether it happens. Masking a kind or capping the count
therefore draws no random number more or less than the unmasked run: the run stays identical up to
the first fault the gate suppresses, which is what lets a shrinker remove faults one kind or one
count at a time without reshuffling everything before them. An open gate (no mask, no cap) never
suppresses anything and writes nothing to the trace, so default runs are byte-identical to runs
before the gate existed. A cap at or above the number of faults a run had suppresses nothing
either: lowering it to exactly that number gives the same run.
"""

from __future__ import annotations

from collections.abc import Iterable

from raytxn.sim.trace import Trace

# Faults the gate decides, named after the probability that draws them (a delete's failure is drawn
# with put_fail, a list's with get_fail); a zombie is a crash that leaves its process running.
GATED_KINDS: tuple[str, ...] = ("put_fail", "put_reply_lost", "get_fail", "slow",
                                "drop", "reply_lost", "duplicate", "crash", "zombie")


# A zombie is a crash too: masking crashes masks zombies.
_IMPLIED_BY: dict[str, str] = {"zombie": "crash"}


class FaultGate:
    def __init__(self, trace: Trace, masked: Iterable[str] = (), max_faults: int | None = None) -> None:
        self._trace = trace
        self.masked = frozenset(masked)
        self.max_faults = max_faults
        self.counts: dict[str, int] = {}   # faults that took effect, per kind (slow operations too)
        self.total = 0

    def is_masked(self, kind: str) -> bool:
        return kind in self.masked or _IMPLIED_BY.get(kind) in self.masked

    def allow(self, kind: str) -> bool:
        """A fault of ``kind`` was drawn: True (and counted) when it takes effect."""
        if self.is_masked(kind) or (self.max_faults is not None and self.total >= self.max_faults):
            self._trace.add("fault_suppressed", kind)
            return False
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.total += 1
        return True
