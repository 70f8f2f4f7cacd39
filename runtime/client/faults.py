"""``client.faults``: arm the engine's named fault points (``raytxn.faults``) from a driver, and
kill actors or nodes, for chaos and fault tests."""

from __future__ import annotations

from raytxn.client.rpc import ActorRef
from raytxn.errors import ActorUnavailable, InvalidArgument
from raytxn.faults import FaultPoints
from raytxn.ids import SUPERVISOR_NAME, host_for


class Faults:
    """``client.faults``: arm fault points in the running actors from a driver.

    The point's prefix picks the actors: ``coordinator.*`` the coordinators, ``partition.*`` the
    partition actors, ``subscription.*`` the subscription actors, ``ledger.*`` all of them (every
    actor's ledgers), ``supervisor.*`` the supervisor (topic and subscription admin). ``topic=``
    narrows partitions and subscriptions to one topic; ``match`` narrows inside an actor (e.g.
    ``{"txn": ...}``)."""

    def __init__(self, supervisor: ActorRef, deadline_s: float = 60.0) -> None:
        self._supervisor = supervisor
        self._deadline_s = deadline_s

    def _targets(self, point: str, topic: str | None, actor: str | None) -> list[str]:
        if actor is not None:
            return [actor]
        kind = point.split(".", 1)[0]
        if kind not in ("coordinator", "partition", "subscription", "ledger", "supervisor"):
            raise InvalidArgument(f"unknown fault point {point!r}")
        if kind == "supervisor":
            return [SUPERVISOR_NAME]
        names = self._supervisor.call("list_actors", None if kind == "ledger" else kind, topic,
                                      deadline_s=self._deadline_s)
        return [name for name, _kind in names]

    def arm(self, point: str, action: str = "crash", times: int = 1, probability: float = 1.0,
            match: dict[str, object] | None = None, delay_s: float = 1.0, topic: str | None = None,
            actor: str | None = None) -> list[str]:
        """Arm ``point`` in every matching actor; returns the actors armed."""
        FaultPoints().arm(point, action, times, probability, match, delay_s)  # validates
        targets = self._targets(point, topic, actor)
        for name in targets:
            ref = ActorRef(name, self._supervisor.token)
            ref.call("arm_fault", point, action, times, probability, match, delay_s, deadline_s=self._deadline_s)
        return targets

    def disarm(self, point: str | None = None, topic: str | None = None, actor: str | None = None) -> None:
        """Disarm ``point`` (every point when None) in the matching actors."""
        for name in self._targets(point or "ledger.any", topic, actor):
            ActorRef(name, self._supervisor.token).call("disarm_fault", point, deadline_s=self._deadline_s)

    def list(self, topic: str | None = None) -> dict[str, list[dict[str, object]]]:
        """Armed faults per actor (actors with none are left out)."""
        armed = {name: ActorRef(name, self._supervisor.token).call("list_faults", deadline_s=self._deadline_s)
                 for name in self._targets("ledger.any", topic, None)}
        return {name: faults for name, faults in armed.items() if faults}

    def kill(self, actor: str, restart: bool = True) -> None:
        """Kill an actor's process by name (Ray restarts it unless ``restart=False``).

        A partition or subscription served by a host (``actor_hosts``) has no process of its
        own: its host drops it, a crash of that actor alone (its memory is lost and its tasks
        cancelled, as a process end would), and the next call activates it again whatever
        ``restart`` says. ``ActorUnavailable``: nothing of that name runs (dormant, or never
        started)."""
        try:
            kill_actor(actor, restart)
            return
        except ValueError:  # Ray knows no actor of that name: hosted, or not running
            pass
        hosts = self._supervisor.call("engine_config", deadline_s=self._deadline_s).actor_hosts
        if hosts > 0:
            host = ActorRef(host_for(actor, hosts), self._supervisor.token)
            if host.call("drop", actor, deadline_s=self._deadline_s):
                return
        raise ActorUnavailable(f"no actor {actor!r} is running to kill")


def kill_actor(name: str, restart: bool = True) -> None:
    import ray

    from raytxn.ids import NAMESPACE

    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=not restart)


def remove_node(cluster: object, node: object) -> None:
    """Tests: take a node of a ``ray.cluster_utils.Cluster`` away, as a machine loss would."""
    cluster.remove_node(node, allow_graceful=False)  # type: ignore[attr-defined]
