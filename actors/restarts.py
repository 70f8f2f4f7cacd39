"""Graceful restarts of the engine's actors, one at a time: the supervisor's part of a rolling
restart (``Client.rolling_restart``, ``raytxn restart --rolling``), which is how an upgrade
reaches every process (docs/guides/operations.md).

Restarting an actor is what passivation and activation already are, done on demand and with the
actor drained first (``ActorShell.drain``): new calls are refused with ``ActorUnavailable``
(callers retry), the calls in flight finish, the next start is made cheap (a snapshot, a
persisted cursor, the coordinator's last records), then the supervisor kills the process for
good and starts the actor again at once, in a new process that imports the code installed now.
Coordinators are created again as at start; a host (``actor_hosts``) has each actor it serves
drained, then the host process is replaced and the actors that were active are started in it
again. A dormant partition or subscription is left alone: its next use starts it on the new code.

The supervisor's own restart is the client's: it drains the supervisor, which then ends its
process, and Ray starts it again (``Client.rolling_restart``). The plan puts it last, as Kafka's
rolling upgrade restarts the active controller last.

Nothing rests on the drain: an actor killed with calls in flight recovers as after a crash. A
restart only spares callers errors and the next incarnation a replay.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from raytxn.actors.shell import DRAIN_S
from raytxn.auth import Access, guarded
from raytxn.errors import InvalidArgument
from raytxn.ids import SUPERVISOR_NAME, coordinator_actor_name, host_actor_name

if TYPE_CHECKING:
    from raytxn.actors.supervisor import Supervisor

log = logging.getLogger(__name__)

# A drained actor's process is killed by the supervisor right away; should the supervisor die
# first, the actor ends it itself this long after (the shell's passivation hold-off).
MAX_DRAIN_S = 120.0  # the longest drain a caller may ask for
RESTART_ORDER = ("partition", "subscription", "coordinator", "host", "supervisor")


class SupervisorRestarts:
    """The supervisor's restart calls (a mixin of ``Supervisor``: ``self`` is one)."""

    _restarts: dict[str, asyncio.Task]

    @guarded(Access.SUPERUSER)
    async def restart_plan(self: Supervisor) -> list[dict[str, str]]:
        """The actors a rolling restart restarts, in its order: the running partitions and
        subscriptions (dormant ones start on the new code when next used), the coordinators,
        the hosts, and last this supervisor (which the client restarts)."""
        await self._started()
        live = _live_names()
        rows = [{"name": name, "kind": kind} for name, kind in self.actor_names()
                if kind == "coordinator" or (self._host_of(name) is None and name in live)]
        rows += [{"name": host_actor_name(i), "kind": "host"} for i in range(self.config.actor_hosts)]
        rows.sort(key=lambda row: RESTART_ORDER.index(row["kind"]))
        return [*rows, {"name": SUPERVISOR_NAME, "kind": "supervisor"}]

    @guarded(Access.SUPERUSER)
    async def restart_actor(self: Supervisor, name: str, drain_s: float = DRAIN_S) -> dict[str, Any]:
        """Drain the actor ``name`` (a coordinator, partition, subscription or host), kill its
        process and start it again; returns once the new incarnation serves: what the drain
        did, the incarnations before and after, how long it took. One restart of a name at a
        time (a second call waits for the first's)."""
        await self._started()
        if isinstance(drain_s, bool) or not isinstance(drain_s, int | float) or not 0 <= drain_s <= MAX_DRAIN_S:
            raise InvalidArgument(f"drain_s must be seconds in 0..{MAX_DRAIN_S}, not {drain_s!r}")
        kind = self._restart_kind(name)
        task = self._restarts.get(name)
        if task is None:
            task = self._restarts[name] = asyncio.get_running_loop().create_task(
                self._restart_now(name, kind, float(drain_s)))
            task.add_done_callback(lambda _: self._restarts.pop(name, None))
        return await asyncio.shield(task)

    def _restart_kind(self: Supervisor, name: str) -> str:
        if name in {host_actor_name(i) for i in range(self.config.actor_hosts)}:
            return "host"
        if name in {coordinator_actor_name(i) for i in range(self.config.coordinator.num_coordinators)}:
            return "coordinator"
        spec = self._implied().get(name)
        if spec is None:
            raise InvalidArgument(f"{name!r} is no actor of this engine (the supervisor restarts itself "
                                  "through Client.rolling_restart)")
        return spec.kind

    async def _restart_now(self: Supervisor, name: str, kind: str, drain_s: float) -> dict[str, Any]:
        began = self.clock.monotonic()
        if kind == "host":
            row = await self._restart_host(name, drain_s)
        elif (host := self._host_of(name)) is not None and kind != "coordinator":
            row = await self._restart_hosted(name, host, drain_s)
        else:
            row = await self._restart_dedicated(name, kind, drain_s)
        return {"name": name, "kind": kind, **row, "seconds": round(self.clock.monotonic() - began, 3)}

    async def _restart_dedicated(self: Supervisor, name: str, kind: str, drain_s: float) -> dict[str, Any]:
        self._handles.pop(name, None)  # a cached handle may be of an incarnation gone since
        handle = self._handle(name)
        if handle is None and kind != "coordinator":
            return {"restarted": False, "why": "dormant: its next use starts it"}
        drained = await _drained(handle, drain_s, self.authorizer.engine_token()) if handle is not None else None
        await self._kill_for_good([name])
        if kind == "coordinator":
            tc_id = int(name.rsplit("-", 1)[1])
            info = await self._placed(name, self._create_coordinator(tc_id))
        else:
            await self._start_actor(self._implied()[name])
            info = await asyncio.wrap_future(self._handle(name).ready.remote().future())
        return {"restarted": True, "drain": drained, "incarnation": info.get("incarnation")}

    async def _restart_hosted(self: Supervisor, name: str, host: str, drain_s: float) -> dict[str, Any]:
        token = self.authorizer.engine_token()
        try:
            drained = await self._host_call(host, "call", name, "drain", (drain_s,), {"auth": token})
        except Exception as e:  # noqa: BLE001 - not hosted (dormant) or already stopping: started anew all the same
            drained = {"error": repr(e)[:200]}
        await self._host_call(host, "drop", name)
        info = await self._start_hosted(self._implied()[name], host)
        return {"restarted": True, "drain": drained, "incarnation": info.get("incarnation")}

    async def _restart_host(self: Supervisor, host: str, drain_s: float) -> dict[str, Any]:
        """Drain every actor the host serves, replace its process, start the active ones again."""
        token = self.authorizer.engine_token()
        try:
            hosted = await self._host_call(host, "hosted")
        except Exception as e:  # noqa: BLE001 - restarting already: nothing runs in it to drain
            log.info("listing %s before its restart failed: %r", host, e)
            hosted = {}
        active = sorted(name for name, row in hosted.items() if row["serving"] and name in self._implied())
        drains = await asyncio.gather(*(self._host_call(host, "call", name, "drain", (drain_s,), {"auth": token})
                                        for name in active), return_exceptions=True)
        self._hosts.pop(host, None)
        await self._kill_for_good([host])
        # An activation meanwhile may have cached the dying process (get_if_exists found it):
        # forgotten, so the next line starts a new one. Activations are not held back for a host's
        # restart: the actors started in it below call each other (a subscription its partition)
        # and activate what they find missing, which would wait for this very restart.
        self._hosts.pop(host, None)
        self._host(host)  # a new process
        await asyncio.gather(*(self._start_hosted(self._implied()[name], host)
                               for name in active if name in self._implied()))
        return {"restarted": True, "actors": len(active),
                "drained": sum(isinstance(d, dict) and bool(d.get("drained")) for d in drains)}


async def _drained(handle: Any, drain_s: float, token: str | None) -> dict[str, Any]:
    """The actor's drain answer; an actor that cannot answer (dying, restarting, failing its
    start) is restarted all the same, as after a crash."""
    kwargs = {} if token is None else {"auth": token}
    try:
        return await asyncio.wait_for(asyncio.wrap_future(handle.drain.remote(drain_s, **kwargs).future()),
                                      drain_s + 30.0)
    except Exception as e:  # noqa: BLE001 - reported in the row; the restart goes on
        return {"drained": False, "error": repr(e)[:200]}


def _live_names() -> set[str]:
    from raytxn.actors.supervisor import _live_actor_names  # (that module imports this one)

    return _live_actor_names()
