"""The simulated network between actors (and drivers): an ``ActorRef`` that calls the real actor
object in the world instead of a Ray handle.

A call's request arrives a random latency later, runs the method as a task of the callee's process,
and its reply takes another latency, so calls from one caller may arrive out of order, as Ray's may. Arguments
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
import operator
import pickle
import random
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from raytxn.actors.partition import AppendResult
from raytxn.client.rpc import ActorRef, retriable, unwrap
from raytxn.errors import ActorNotFound, ActorUnavailable
from raytxn.ids import Position, TxnID
from raytxn.protocol.lease import Lease, RangeCount, RangePlan
from raytxn.protocol.txn_buffer import AbortedTxn
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
# delivered after the first was answered fences the very producer that registered, and a
# subscribe delivered after its consumer closed attaches a consumer nobody runs (Ray never
# delivers a call twice; a client's retry follows a failure and comes before its next call).
NOT_DUPLICATED = frozenset({"register_transactional_id", "init_producer", "subscribe"})


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


# Values a copy may share instead of pickling: immutable all the way down, and equal to what a
# pickle round trip gives back (an enum member even comes back as itself). The frozen structs'
# fields are themselves such values or tuples of them. Most arguments and replies are these, or
# tuples, lists and dicts of them; pickling them all was a tenth of a run's time.
_IMMUTABLE: frozenset[type] = frozenset({str, int, float, bool, type(None), bytes, TxnID, Position, EndAction,
                                         AppendResult, Lease, RangePlan, RangeCount, AbortedTxn})
MAX_COPY_DEPTH = 3  # containers nested deeper than this go through pickle


def _copy(value: Any) -> Any:
    """What the other side of a Ray call gets: ``value`` itself when nothing can mutate it, else a
    copy (containers of shareable values rebuilt, anything else through pickle)."""
    copied = _copy_shallow(value, 0)
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)) if copied is _PICKLE else copied


_PICKLE = object()  # _copy_shallow's answer for "not a container of shareable values"


def _copy_shallow(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if depth >= MAX_COPY_DEPTH or kind not in (tuple, list, dict):
        return _PICKLE
    if kind is dict:
        copied_dict = {}
        for key, item in value.items():
            if type(key) not in _IMMUTABLE:
                return _PICKLE
            copied_item = _copy_shallow(item, depth + 1)
            if copied_item is _PICKLE:
                return _PICKLE
            copied_dict[key] = copied_item
        return copied_dict
    items = []
    for item in value:
        copied_item = _copy_shallow(item, depth + 1)
        if copied_item is _PICKLE:
            return _PICKLE
        items.append(copied_item)
    if kind is list:
        return items
    return value if all(map(operator.is_, items, value)) else tuple(items)


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
        loop = self.world.loop
        # Both legs are timers, not sleeps of the caller: the request is delivered by one, and the
        # reply future is resolved by another a latency after the callee's task ends, so a round
        # trip costs the caller one wake-up (a third fewer callbacks per call than sleeping).
        reply = loop.create_future()
        request = loop.call_at(loop.time() + self._latency(), self._deliver, callee, method, args, kwargs,
                               idempotent, reply)
        try:
            outcome = await reply
        except asyncio.CancelledError:
            # A Ray call already sent arrives anyway; in the older profiles the caller's death also
            # took its request in transit with it (kept so their seeds replay as they did).
            if not self._faults.requests_outlive_callers:
                request.cancel()
            raise
        if isinstance(outcome, _NoReply):
            raise outcome.error
        if idempotent and self._fault(self._faults.reply_lost, "reply_lost", callee, method):
            raise ActorUnavailable(f"{callee.label}.{method}: reply lost")
        self._trace.add("reply", callee.label, method, type(outcome).__name__,
                        detail=outcome if isinstance(outcome, BaseException) else None)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _deliver(self, callee: Process, method: str, args: tuple, kwargs: dict[str, Any], idempotent: bool,
                 reply: asyncio.Future) -> None:
        """The request arrives: run it as a task of ``callee`` (unless lost or ``callee`` is down)."""
        if self._fault(self._faults.drop, "drop", callee, method):
            _settle(reply, _NoReply(ActorUnavailable(f"{callee.label}.{method}: request lost")))
            return
        if not callee.alive:
            _settle(reply, _NoReply(ActorUnavailable(f"{callee.label} is down")))
            return
        task = callee.invoke(method, _copy(args), _copy(kwargs))
        task.add_done_callback(partial(self._replied, callee, reply))
        if (idempotent and method not in NOT_DUPLICATED
                and self._fault(self._faults.duplicate, "duplicate", callee, method)):
            copy_args, copy_kwargs = _copy(args), _copy(kwargs)
            self.world.loop.call_later(self._latency() * 5, self._deliver_again, callee, method, copy_args,
                                       copy_kwargs)

    def _replied(self, callee: Process, reply: asyncio.Future, finished: asyncio.Task) -> None:
        """The callee's task ended: its result, or the error it raised (copied, as Ray would), or
        ``ActorUnavailable`` when its process died under it, reaches the caller a latency later.
        Cancelling the caller leaves the callee running, as in Ray."""
        if reply.done():  # the caller is gone
            return
        if finished.cancelled():
            outcome: Any = ActorUnavailable(f"{callee.label} died during the call")
        elif finished.exception() is not None:
            outcome = _copy_error(finished.exception())
        else:
            outcome = _copy(finished.result())
        loop = self.world.loop
        loop.call_at(loop.time() + self._latency(), _settle, reply, outcome)

    def _deliver_again(self, callee: Process, method: str, args: tuple, kwargs: dict[str, Any]) -> None:
        if callee.alive:
            callee.invoke(method, args, kwargs).add_done_callback(_ignore)


class _NoReply:
    """A request that never reached its callee: the caller raises ``error``, with no reply traced."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _settle(reply: asyncio.Future, outcome: Any) -> None:
    if not reply.done():
        reply.set_result(outcome)


def _ignore(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


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

    def prefetch(self) -> None:
        """Nothing to do: a simulated lookup is a dict lookup, and it stays on the loop (a
        thread would make the run depend on the OS's scheduling)."""

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
