"""The simulated network between actors (and drivers): an ``ActorRef`` that calls the real actor
object in the world instead of a Ray handle.

A call waits a random latency, runs the method as a task of the callee's process, and its reply
waits another latency, so calls from one caller may arrive out of order, as Ray's may. Arguments
and replies are copied through pickle (Ray serializes them: neither side may see the other mutate
them). Faults, drawn from the simulator's one ``random.Random`` while ``faults_on``:

- **drop**: the request is lost; the caller gets ``ActorUnavailable`` (retriable, as Ray's
  ``ActorUnavailableError``) and the method never ran;
- **reply lost**: the method ran, the caller gets ``ActorUnavailable`` all the same;
- **duplicate**: the request is delivered once more, later (its reply is dropped).

Reply loss and duplicates only apply to ``IDEMPOTENT`` methods, the ones the engine documents as
safe to repeat (rpc.py: sequence ids, request ids, idempotent ends). Ray only loses a reply when
the callee's process dies, which the world's crashes model; a lost ``fetch`` reply without a
crash would leave messages with a live consumer, a case Ray never produces.

A call to a process that is down fails with ``ActorUnavailable``; a call in flight when its callee
dies fails the same way. Each call goes to the current incarnation, unless ``stale_handles``: then a
reference keeps the process it first reached until a retriable failure makes it look again, so a
stale reference may keep talking to a zombie (a caller that has not heard of the restart).

A drawn fault takes effect only when the world's ``FaultGate`` allows it (``gate.py``).
"""

from __future__ import annotations

import asyncio
import pickle
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raytxn.client.rpc import ActorRef, retriable, unwrap
from raytxn.errors import ActorNotFound, ActorUnavailable
from raytxn.ids import Position, TxnID
from raytxn.protocol.txnlog import EndAction
from raytxn.sim.loop import OWNER
from raytxn.sim.trace import Trace

if TYPE_CHECKING:
    from raytxn.sim.world import Process, World

IDEMPOTENT = frozenset({
    "append", "end_txn", "commit_and_begin", "release_unused", "ack", "new_txn", "begin_txn", "add_partitions",
    "add_subscriptions",
    "register_transactional_id", "read", "last_sequence", "ready", "subscribe", "get_txn",
    "init_producer",
})
# Not duplicated late: a second registration (of a transactional id, or of a producer's epoch)
# delivered after the first was answered fences the very producer that registered (Ray never
# delivers a call twice; a client's retry follows a failure).
NOT_DUPLICATED = frozenset({"register_transactional_id", "init_producer"})


@dataclass(frozen=True)
class NetworkFaults:
    drop: float = 0.0
    reply_lost: float = 0.0
    duplicate: float = 0.0
    latency_s: tuple[float, float] = (0.0002, 0.002)
    # True: a reference keeps the incarnation it reached until a call through it fails (so a
    # caller may talk to a zombie for as long as it lives). False: every call goes to the current
    # incarnation, as a Ray handle follows a restart; a zombie then only gets calls already in
    # flight and runs its own tasks.
    stale_handles: bool = False
    # True: a request on its way still arrives after its caller's process died, as a Ray actor
    # call already sent does. False: a caller's death also cancels its requests in transit (the
    # profiles before the zombie-appends one; kept so their seeds replay as they did).
    requests_outlive_callers: bool = False
    # A latency tail: this share of legs (requests and replies) takes ``slow_latency_s`` instead,
    # while faults are on (a request of a client that just died can then arrive after its
    # successor's first calls).
    slow: float = 0.0
    slow_latency_s: tuple[float, float] = (0.005, 0.05)


# Values a copy may share instead of pickling: immutable, and equal to what a pickle round trip
# gives back (an enum member even comes back as itself). Most arguments and replies are these, or
# flat tuples of them, or an empty kwargs dict; pickling them all was a tenth of a run's time.
_IMMUTABLE: frozenset[type] = frozenset({str, int, float, bool, type(None), bytes, TxnID, Position, EndAction})


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is tuple and all(type(item) in _IMMUTABLE for item in value):
        return value
    if kind is dict and not value:
        return {}
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


class Network:
    def __init__(self, world: World, rng: random.Random, faults: NetworkFaults, trace: Trace) -> None:
        self.world = world
        self._rng = rng
        self._faults = faults
        self._trace = trace
        self.faults_on = True
        self.injected = 0
        self.stale_handles = faults.stale_handles

    def ref(self, name: str, token: str | None = None) -> SimActorRef:
        """The ``actor_refs`` seam of the actor shell: ``(name, token) -> ActorRef``."""
        return SimActorRef(self, name, token)

    def _latency(self) -> float:
        faults = self._faults
        if faults.slow and self.faults_on and self._rng.random() < faults.slow:  # no draw when never slow
            return self._rng.uniform(*faults.slow_latency_s)
        return self._rng.uniform(*faults.latency_s)

    def _fault(self, probability: float, what: str, callee: Process, method: str) -> bool:
        if (self.faults_on and probability > 0 and self._rng.random() < probability
                and self.world.gate.allow(what)):
            self.injected += 1
            self._trace.add("net_fault", what, callee.label, method)
            return True
        return False

    async def call(self, callee: Process, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        caller = OWNER.get()
        caller_label = getattr(caller, "label", "driver")
        self._trace.add("call", caller_label, callee.label, method, detail=args)
        idempotent = method in IDEMPOTENT
        if self._faults.requests_outlive_callers:
            # The request leg is the network's task, not the caller's: killing the caller's
            # process cancels the caller waiting for it, not the request.
            transit = self.world.loop.spawn(self, self._request(callee, method, args, kwargs, idempotent))
            transit.add_done_callback(_ignore)  # nobody may be left to hear of a lost request
            task = await asyncio.shield(transit)
        else:
            task = await self._request(callee, method, args, kwargs, idempotent)
        reply = await _outcome(task, callee)
        await self.world.loop.sleep(self._latency())
        if idempotent and self._fault(self._faults.reply_lost, "reply_lost", callee, method):
            raise ActorUnavailable(f"{callee.label}.{method}: reply lost")
        self._trace.add("reply", callee.label, method, type(reply).__name__,
                        detail=reply if isinstance(reply, BaseException) else None)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def _request(self, callee: Process, method: str, args: tuple, kwargs: dict[str, Any],
                       idempotent: bool) -> asyncio.Task:
        """Carry a request to ``callee``; returns the callee's task running it."""
        await self.world.loop.sleep(self._latency())
        if self._fault(self._faults.drop, "drop", callee, method):
            raise ActorUnavailable(f"{callee.label}.{method}: request lost")
        if not callee.alive:
            raise ActorUnavailable(f"{callee.label} is down")
        task = callee.invoke(method, _copy(args), _copy(kwargs))
        if (idempotent and method not in NOT_DUPLICATED
                and self._fault(self._faults.duplicate, "duplicate", callee, method)):
            copy_args, copy_kwargs = _copy(args), _copy(kwargs)
            self.world.loop.call_later(self._latency() * 5, self._deliver_again, callee, method, copy_args,
                                       copy_kwargs)
        return task

    def _deliver_again(self, callee: Process, method: str, args: tuple, kwargs: dict[str, Any]) -> None:
        if callee.alive:
            callee.invoke(method, args, kwargs).add_done_callback(_ignore)


def _ignore(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _outcome(task: asyncio.Task, callee: Process) -> asyncio.Future:
    """A future of the callee task's result, or the error it raised (copied, as Ray would), or
    ``ActorUnavailable`` when its process died under it. Cancelling the caller leaves the callee
    running, as in Ray. (A future, not a coroutine: the caller awaits it directly, one frame less
    to resume through.)"""
    reply = task.get_loop().create_future()

    def done(finished: asyncio.Task) -> None:
        if reply.done():
            return
        if finished.cancelled():
            reply.set_result(ActorUnavailable(f"{callee.label} died during the call"))
        elif finished.exception() is not None:
            reply.set_result(_copy_error(finished.exception()))
        else:
            reply.set_result(_copy(finished.result()))

    task.add_done_callback(done)
    return reply


def _copy_error(error: BaseException) -> BaseException:
    try:
        return _copy(error)
    except Exception:  # noqa: BLE001 - an exception that does not round-trip: hand over the original
        return error


class SimActorRef(ActorRef):
    """``ActorRef`` over the simulated network: ``call_async`` and the retry policy are the real
    ones (inherited); only the transport differs."""

    def __init__(self, network: Network, name: str, token: str | None = None) -> None:
        super().__init__(name, token)
        self._network = network

    def handle(self) -> Process:
        if self._handle is None or not self._network.stale_handles:
            process = self._network.world.current(self.name)
            if process is None:
                raise ActorNotFound(f"no actor {self.name!r}")
            self._handle = process
        return self._handle

    async def attempt_async(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._network.call(self.handle(), method, args, self._with_auth(kwargs))
        except Exception as error:
            if retriable(unwrap(error)):
                self.forget()
            raise

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return asyncio.ensure_future(self.attempt_async(method, *args, **kwargs))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name}.{method}: blocking calls cannot run in the simulator")
