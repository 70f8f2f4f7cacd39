"""Named fault points inside actors.

Every actor owns a ``FaultPoints`` and calls ``await faults.hit("coordinator.after_log_committing",
txn=...)`` at each durable step. Nothing happens unless a fault is armed for that point (armed
from a driver through the actor's ``arm_fault`` method). Actions:

- ``crash``: end the actor's process at once (``os._exit``), as a machine or process loss would;
- ``raise``: raise ``InjectedFault`` (retriable) at that point;
- ``delay``: sleep ``delay_s`` there;
- ``drop_reply``: fail the call with ``ReplyDropped`` (retriable) at that point. Points named
  ``after_...``/``..._before_reply`` sit after a durable step, so the work is done but the caller
  cannot tell, as with a lost reply.

Arming lives in the actor's memory, so a crash disarms (the new incarnation starts clean). A
seeded ``random.Random`` decides ``probability`` so a schedule replays exactly.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field

from raytxn.auth import Access, AuthTarget, guarded
from raytxn.errors import ActorUnavailable, InvalidArgument

ACTIONS = ("crash", "raise", "delay", "drop_reply")


class InjectedFault(ActorUnavailable):
    """Raised by an armed ``raise`` fault point."""


class ReplyDropped(ActorUnavailable):
    """Raised by an armed ``drop_reply`` fault point: the work was done, the reply is lost."""


@dataclass
class ArmedFault:
    point: str
    action: str
    times: int = 1                 # how many hits fire; -1 = unlimited
    probability: float = 1.0
    match: dict[str, object] = field(default_factory=dict)  # fire only if these kwargs match
    delay_s: float = 1.0
    fired: int = 0

    def matches(self, context: dict[str, object]) -> bool:
        return all(str(context.get(k)) == str(v) for k, v in self.match.items())


class FaultPoints:
    """The fault points of one actor incarnation."""

    def __init__(self, seed: int | None = None) -> None:
        self._armed: dict[str, list[ArmedFault]] = {}
        self._rng = random.Random(seed)
        self.hits: dict[str, int] = {}

    def arm(self, point: str, action: str = "crash", times: int = 1, probability: float = 1.0,
            match: dict[str, object] | None = None, delay_s: float = 1.0) -> None:
        if action not in ACTIONS:
            raise InvalidArgument(f"unknown fault action {action!r}; use one of {ACTIONS}")
        if not 0.0 <= probability <= 1.0 or times == 0 or times < -1:
            raise InvalidArgument("probability must be in [0, 1] and times >= 1 or -1")
        self._armed.setdefault(point, []).append(
            ArmedFault(point, action, times, probability, dict(match or {}), delay_s))

    def disarm(self, point: str | None = None) -> None:
        if point is None:
            self._armed.clear()
        else:
            self._armed.pop(point, None)

    def armed(self) -> list[dict[str, object]]:
        return [vars(f).copy() for faults in self._armed.values() for f in faults]

    async def hit(self, point: str, **context: object) -> None:
        """Called by the actor at ``point``; fires the first armed fault that matches."""
        self.hits[point] = self.hits.get(point, 0) + 1
        faults = self._armed.get(point)
        if not faults:
            return
        for fault in faults:
            if not fault.matches(context) or self._rng.random() >= fault.probability:
                continue
            fault.fired += 1
            if fault.times != -1 and fault.fired >= fault.times:
                faults.remove(fault)
            await self._fire(fault, context)
            return

    async def _fire(self, fault: ArmedFault, context: dict[str, object]) -> None:
        if fault.action == "crash":
            os._exit(17)
        if fault.action == "delay":
            await asyncio.sleep(fault.delay_s)
            return
        if fault.action == "raise":
            raise InjectedFault(f"injected fault at {fault.point} {context}")
        raise ReplyDropped(f"reply dropped at {fault.point} {context}")


class FaultTarget(AuthTarget):
    """The fault-control methods every actor exposes (the actor sets ``self.faults``); with auth
    on, superusers only."""

    faults: FaultPoints

    @guarded(Access.SUPERUSER)
    def arm_fault(self, point: str, action: str = "crash", times: int = 1, probability: float = 1.0,
                  match: dict[str, object] | None = None, delay_s: float = 1.0) -> None:
        self.faults.arm(point, action, times, probability, match, delay_s)

    @guarded(Access.SUPERUSER)
    def disarm_fault(self, point: str | None = None) -> None:
        self.faults.disarm(point)

    @guarded(Access.SUPERUSER)
    def list_faults(self) -> list[dict[str, object]]:
        return self.faults.armed()
