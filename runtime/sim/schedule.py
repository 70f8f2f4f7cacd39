"""A schedule override: a smaller run of the same seed, written as the string ``raytxn sim --schedule``
takes (and ``shrink.py`` prints).

The format is comma-separated ``key=value`` items, in any order, each key at most once::

    tid_producers=1,workers=1,max_txns=40,window=1.5,no=zombie+duplicate,max_faults=7

- ``inputs``, ``tid_txns``, ``tid_producers``, ``workers``, ``partitions``, ``coordinators``,
  ``max_txns``: the ``Workload`` fields of the same names (``max_txns``: no txn begins after the
  N-th, so the run is the uncapped one up to there);
- ``window``: the fault window in simulated seconds (the profile's ``fault_window_s``);
- ``no``: ``+``-separated kinds turned off: the faults the gate decides (``gate.GATED_KINDS``; the
  draw still happens, only its effect is suppressed), ``stale_handles`` (references follow restarts),
  and the workload's own ``abort``, ``forget`` and ``refence`` (their probability becomes 0; the draw
  still happens);
- ``max_faults``: only the first N gated faults take effect.

The empty string overrides nothing: the run is the profile's, trace for trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from raytxn.errors import InvalidArgument
from raytxn.sim.driver import Workload
from raytxn.sim.gate import GATED_KINDS, FaultGate
from raytxn.sim.profiles import Profile
from raytxn.sim.trace import Trace

WORKLOAD_KINDS: tuple[str, ...] = ("abort", "forget", "refence")   # Workload probabilities
KINDS: tuple[str, ...] = (*GATED_KINDS, "stale_handles", *WORKLOAD_KINDS)
# The Workload sizes a schedule may set, with the least each may be (a run needs a worker, a
# partition and a coordinator; it may have no inputs or no transactional producers).
SIZES: dict[str, int] = {"inputs": 0, "tid_txns": 0, "tid_producers": 0, "workers": 1, "partitions": 1,
                         "coordinators": 1, "max_txns": 0}


@dataclass(frozen=True)
class Schedule:
    inputs: int | None = None
    tid_txns: int | None = None
    tid_producers: int | None = None
    workers: int | None = None
    partitions: int | None = None
    coordinators: int | None = None
    max_txns: int | None = None
    window: float | None = None
    no: frozenset[str] = field(default_factory=frozenset)
    max_faults: int | None = None

    def __post_init__(self) -> None:
        for name, least in SIZES.items():
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < least):
                raise InvalidArgument(f"schedule: {name} must be an integer >= {least}, not {value!r}")
        if self.window is not None:
            if isinstance(self.window, bool) or not isinstance(self.window, int | float) \
                    or not (math.isfinite(self.window) and self.window >= 0):
                raise InvalidArgument(f"schedule: window must be a number of seconds >= 0, not {self.window!r}")
            object.__setattr__(self, "window", float(self.window))  # so it prints as it parses
        if self.max_faults is not None and (not _is_int(self.max_faults) or self.max_faults < 0):
            raise InvalidArgument(f"schedule: max_faults must be an integer >= 0, not {self.max_faults!r}")
        unknown = sorted(set(self.no) - set(KINDS))
        if unknown:
            raise InvalidArgument(f"schedule: unknown kinds {unknown} in no= (known: {', '.join(KINDS)})")
        object.__setattr__(self, "no", frozenset(self.no))

    def __str__(self) -> str:
        return format_schedule(self)

    def apply(self, profile: Profile, workload: Workload) -> tuple[Profile, Workload]:
        """The profile and workload this schedule runs (the gated kinds and the cap are the gate's)."""
        sizes = {name: getattr(self, name) for name in SIZES if getattr(self, name) is not None}
        workload = replace(workload, **sizes, **{kind: 0.0 for kind in WORKLOAD_KINDS if kind in self.no})
        if self.window is not None:
            profile = replace(profile, fault_window_s=self.window)
        if "stale_handles" in self.no:
            profile = replace(profile, network=replace(profile.network, stale_handles=False))
        return profile, workload

    def gate(self, trace: Trace) -> FaultGate:
        return FaultGate(trace, (kind for kind in self.no if kind in GATED_KINDS), self.max_faults)


def format_schedule(schedule: Schedule) -> str:
    """The canonical string: keys in field order, kinds in ``KINDS`` order; '' for no override."""
    items = []
    for f in fields(Schedule):
        value = getattr(schedule, f.name)
        if f.name == "no":
            if value:
                items.append("no=" + "+".join(kind for kind in KINDS if kind in value))
        elif value is not None:
            items.append(f"{f.name}={value!r}" if f.name == "window" else f"{f.name}={value}")
    return ",".join(items)


def parse_schedule(text: str) -> Schedule:
    """The schedule ``text`` names; ``InvalidArgument`` saying what is wrong when it is malformed."""
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not raw:
            raise InvalidArgument(f"schedule: {item!r} is not key=value")
        if key in values:
            raise InvalidArgument(f"schedule: {key} given twice")
        if key in SIZES or key == "max_faults":
            values[key] = _number(key, raw, int)
        elif key == "window":
            values[key] = _number(key, raw, float)
        elif key == "no":
            kinds = raw.split("+")
            if "" in kinds:
                raise InvalidArgument(f"schedule: an empty kind in no={raw}")
            values[key] = frozenset(kinds)
        else:
            known = ", ".join(f.name for f in fields(Schedule))
            raise InvalidArgument(f"schedule: unknown key {key!r} (known: {known})")
    return Schedule(**values)  # type: ignore[arg-type]  # each value was converted for its key above


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(key: str, raw: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(raw)
    except ValueError:
        raise InvalidArgument(f"schedule: {key}={raw} is not {'an integer' if kind is int else 'a number'}") from None
