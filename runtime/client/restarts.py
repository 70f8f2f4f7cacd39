"""A rolling restart from the client: every engine actor drained and restarted, one at a time
(``Client.rolling_restart``; the supervisor's part is actors/restarts.py).

Why one at a time: while one actor restarts, every other serves, and what called the restarting
one retries until its next incarnation answers (a second or two), so producers, consumers and
transactions go on throughout. That is how an upgrade reaches every process: install the new
release where the actors run, then restart them all this way (docs/guides/operations.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from raytxn.client.rpc import ActorRef
from raytxn.errors import ActorUnavailable, InvalidArgument

RowCallback = Callable[[dict[str, Any]], None]  # gets each actor's row as it is restarted
SUPERVISOR_EXIT_S = 0.5   # the drained supervisor ends its process this soon (its reply goes out first)
SUPERVISOR_BACK_S = 120.0  # how long the restarted supervisor may take to serve again
POLL_S = 0.1


def rolling_restart(supervisor: ActorRef, deadline_s: float, drain_s: float = 10.0,
                    progress: RowCallback | None = None) -> list[dict[str, Any]]:
    """Restart the engine's actors in the supervisor's plan (``restart_plan``), one after the
    other, each once its predecessor serves again; returns one row per actor (name, kind,
    whether the drain finished in time, incarnations, seconds). Superusers only."""
    if isinstance(drain_s, bool) or not isinstance(drain_s, int | float) or not 0 <= drain_s <= 120:
        raise InvalidArgument(f"drain_s must be seconds in 0..120, not {drain_s!r}")
    rows = []
    for step in supervisor.call("restart_plan", deadline_s=deadline_s):
        if step["kind"] == "supervisor":
            row = restart_supervisor(supervisor, deadline_s, drain_s)
        else:
            row = supervisor.call("restart_actor", step["name"], drain_s, deadline_s=deadline_s + drain_s)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def restart_supervisor(supervisor: ActorRef, deadline_s: float, drain_s: float) -> dict[str, Any]:
    """Drain the supervisor; it ends its process and Ray starts it again. Returns once a new
    process serves (its recovery done)."""
    began = time.monotonic()
    before = supervisor.call("ready", deadline_s=deadline_s)["pid"]
    drained = supervisor.call("drain", drain_s, SUPERVISOR_EXIT_S, deadline_s=deadline_s + drain_s)
    until = time.monotonic() + SUPERVISOR_BACK_S
    while True:
        pid = supervisor.call("ready", deadline_s=SUPERVISOR_BACK_S)["pid"]
        if pid != before:
            break
        if time.monotonic() > until:  # the drained one answers ready with the error, so this is a bug
            raise ActorUnavailable(f"the supervisor still runs in process {before} {SUPERVISOR_BACK_S}s "
                                   "after its drain")
        time.sleep(POLL_S)
    return {"name": drained["name"], "kind": "supervisor", "restarted": True, "drain": drained,
            "seconds": round(time.monotonic() - began, 3)}
