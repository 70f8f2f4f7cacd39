"""Calling actors: the one place that turns Ray's failures into raytxn errors and retries.

Errors raised inside an actor reach the caller as the original raytxn exception (not Ray's
wrapper). A call that fails because its actor died or is restarting, or with a retriable raytxn
error, is retried with backoff until ``deadline_s``; then the last error is raised. Retrying is
safe because every state-changing actor method is idempotent (sequence ids, request ids,
idempotent end/ack) or harmless to repeat (a repeated new_txn leaves an empty txn that times out).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

from raytxn.errors import ActorNotFound, ActorUnavailable, RaytxnError, Timeout
from raytxn.ids import NAMESPACE, SUPERVISOR_NAME, activated_on_demand

_ACTOR_GONE = (RayActorError, ActorDiedError, ActorUnavailableError)
DEFAULT_BACKOFF_S = (0.02, 1.0)  # the first wait after a retriable failure, and the longest


def unwrap(error: BaseException) -> BaseException:
    """The raytxn error inside a RayTaskError, else the error itself."""
    if isinstance(error, RayTaskError) and isinstance(error.cause, BaseException):
        return error.cause
    return error


def retriable(error: BaseException) -> bool:
    """The one classification: an actor that died or is restarting, or a retriable raytxn
    error, is worth another attempt; anything else is final."""
    return isinstance(error, _ACTOR_GONE) or (isinstance(error, RaytxnError) and error.retriable)


class ActorRef:
    """A named actor, looked up lazily and again after it failed. With a ``token``, every call
    presents it (as the keyword ``auth`` of the actor's guarded methods, see runtime/auth.py).
    ``token`` may be a function returning the token of the call being made: a Kafka gateway's
    refs present the token of the client connection they serve (a context variable), also in
    the activation requests the lookup sends on that call's behalf."""

    def __init__(self, name: str, token: str | Callable[[], str | None] | None = None) -> None:
        self.name = name
        self.token = token
        self._handle: Any = None
        self._activation: Any = None  # the supervisor's answer to the last activation request
        self._host: str | None = None  # the host serving this actor, from an activation's answer
        self._prefetching: asyncio.Task | None = None  # ``prefetch``'s lookup and first call

    def handle(self) -> Any:
        if self._handle is None:
            try:
                self._handle = ray.get_actor(self.name, namespace=NAMESPACE)
            except ValueError as e:  # dormant, hosted, not created yet, being re-created, or deleted
                host = self._host or self._answered_host()
                if host is not None:
                    try:
                        self._handle = HostedHandle(ray.get_actor(host, namespace=NAMESPACE), self.name)
                        return self._handle
                    except ValueError:
                        self._host = None  # the host is being restarted: ask again
                self._activate()
                raise ActorNotFound(f"no actor {self.name!r}") from e
        return self._handle

    def _answered_host(self) -> str | None:
        """The host named by the last activation's answer, once it came (None: none, or the
        actor has a process of its own). A request that failed for good (``CannotPlaceActor``,
        a deleted topic) is raised here, so the caller gets that error instead of retrying to
        its deadline."""
        if self._activation is None:
            return None
        done, _ = ray.wait([self._activation], timeout=0)
        if not done:
            return None
        request, self._activation = self._activation, None
        try:
            answer = ray.get(request)
        except Exception as raw:  # noqa: BLE001 - sorted: final errors raised, others asked again
            if not retriable(unwrap(raw)):
                raise unwrap(raw) from None
            _forget_supervisor()  # it may have been replaced
            return None
        self._host = answer.get("host") if isinstance(answer, dict) else None
        return self._host

    def _activate(self) -> None:
        """Ask the supervisor, without waiting, to start this actor (partitions and subscriptions
        start on first use and are passivated when idle): the caller's retry finds it started,
        in a process of its own or in the host the answer names. One request at a time."""
        if not activated_on_demand(self.name) or self._activation is not None:
            return
        supervisor = _supervisor()
        if supervisor is not None:
            try:
                self._activation = supervisor.activate.remote(self.name, **self._with_auth({}))
            except Exception:  # noqa: BLE001 - Ray raises a bare Exception for a dead actor's handle
                _forget_supervisor()  # one of an engine stopped since (looked up again next retry)

    def prefetch(self) -> None:
        """Look the actor up in a worker thread and make one call to it, without waiting, so
        that the first call that matters goes at once. For an actor this process never called,
        ``ray.get_actor`` (a blocking call to the GCS) and the handle's first call (Ray
        resolving the actor's address) each took 30-80 ms here, and an actor's loop serves
        nobody during the first. Called where a caller learns it will call the actor soon (a
        coordinator's participants, at registration); what fails is left to that call."""
        if self._handle is None and self._prefetching is None:
            self._prefetching = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            handle = await asyncio.to_thread(self.handle)
            await handle.ready.remote()  # every actor has it, public and uncounted (shell.UNCOUNTED_CALLS)
        except Exception:  # noqa: BLE001 - the call looks up again and raises what is wrong
            pass
        finally:
            self._prefetching = None

    def forget(self) -> None:
        self._handle = None
        self._host = None

    def _with_auth(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        token = self.token() if callable(self.token) else self.token
        return kwargs if token is None else {**kwargs, "auth": token}

    def call(self, method: str, *args: Any, deadline_s: float = 60.0,
             on_retry: Callable[[], None] | None = None, **kwargs: Any) -> Any:
        """Call ``method`` and wait, retrying while the actor is unavailable (``on_retry`` runs
        before each retry)."""
        kwargs = self._with_auth(kwargs)

        def forget() -> None:
            self.forget()
            if on_retry is not None:
                on_retry()

        return retry(lambda: ray.get(getattr(self.handle(), method).remote(*args, **kwargs)),
                     deadline_s, on_retry=forget, what=f"{self.name}.{method}")

    async def call_async(self, method: str, *args: Any, deadline_s: float | None = 60.0, **kwargs: Any) -> Any:
        """``call`` for an event loop; ``deadline_s=None`` retries until the call succeeds or
        fails with a non-retriable error."""
        return await retry_async(lambda: self.attempt_async(method, *args, **kwargs), deadline_s,
                                 what=f"{self.name}.{method}")

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Submit one call of ``method`` now and return its ``ray.ObjectRef`` (awaitable), not
        retried: calls submitted one after another from one thread reach the actor in that order
        (a producer's pipelined appends). ``ActorNotFound`` when the actor cannot be looked up."""
        return getattr(self.handle(), method).remote(*args, **self._with_auth(kwargs))

    async def attempt_async(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One call of ``method``, not retried: for callers with their own retry loop (one whose
        arguments change between attempts). After a retriable failure the actor is looked up
        again on the next attempt (it may have been replaced)."""
        try:
            # The lookup goes to a worker thread (see ``prefetch``): this loop may be an actor's.
            handle = self._handle if self._handle is not None else await asyncio.to_thread(self.handle)
            return await getattr(handle, method).remote(*args, **self._with_auth(kwargs))
        except Exception as error:
            if retriable(unwrap(error)):
                self.forget()
            raise


class HostedHandle:
    """The handle of an actor served by a host (actors/host.py): ``handle.method.remote(...)``
    becomes the host's ``call.remote(name, method, args, kwargs)``, so callers are the same
    for hosted and dedicated actors."""

    def __init__(self, host: Any, name: str) -> None:
        self.host, self.name = host, name

    def __getattr__(self, method: str) -> _HostedMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return _HostedMethod(self.host, self.name, method)


class _HostedMethod:
    __slots__ = ("host", "method", "name")

    def __init__(self, host: Any, name: str, method: str) -> None:
        self.host, self.name, self.method = host, name, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.call.remote(self.name, self.method, args, kwargs)


_supervisor_handle: Any = None


def _supervisor() -> Any:
    """The supervisor's handle (looked up once per process; None when there is none)."""
    global _supervisor_handle
    if _supervisor_handle is None:
        try:
            _supervisor_handle = ray.get_actor(SUPERVISOR_NAME, namespace=NAMESPACE)
        except ValueError:
            return None
    return _supervisor_handle


def _forget_supervisor() -> None:
    global _supervisor_handle
    _supervisor_handle = None


class _Backoff:
    """The retry policy every retry loop shares: which errors to retry, how long to wait, when to
    stop (``deadline_s=None``: never, while the errors stay retriable)."""

    def __init__(self, deadline_s: float | None, on_retry: Callable[[], None] | None, what: str,
                 delays_s: tuple[float, float] = DEFAULT_BACKOFF_S,
                 clock: Callable[[], float] = time.monotonic, started: float | None = None) -> None:
        self.deadline_s = deadline_s
        self.clock = clock
        if started is None:
            started = clock()
        self.deadline = None if deadline_s is None else started + deadline_s
        self.on_retry = on_retry
        self.what = what
        self.delay, self.max_delay = delays_s

    def next_delay(self, raw: BaseException) -> float:
        """The wait before the next attempt; raises the error when it is final or time is up."""
        error = unwrap(raw)
        if not retriable(error):
            raise error from None
        if self.on_retry:
            self.on_retry()
        if self.deadline is not None and self.clock() + self.delay > self.deadline:
            raise _give_up(error, self.what, self.deadline_s) from None
        delay, self.delay = self.delay, min(self.delay * 2, self.max_delay)
        return delay


def retry(attempt: Callable[[], Any], deadline_s: float, on_retry: Callable[[], None] | None = None,
          what: str = "call") -> Any:
    backoff = _Backoff(deadline_s, on_retry, what)
    while True:
        try:
            return attempt()
        except Exception as raw:  # noqa: BLE001 - sorted by the backoff: raised as is, or retried
            time.sleep(backoff.next_delay(raw))


async def retry_async(attempt: Callable[[], Any], deadline_s: float | None,
                      on_retry: Callable[[], None] | None = None, what: str = "call",
                      delays_s: tuple[float, float] = DEFAULT_BACKOFF_S) -> Any:
    """Await ``attempt()`` until it succeeds; retriable failures are retried after the shared
    backoff (``delays_s``: the first wait and the longest), any other failure is raised at once
    (unwrapped from Ray's RayTaskError)."""
    # The loop's clock: time.monotonic on a real loop, the simulated time in raytxn.sim.
    clock = asyncio.get_running_loop().time
    started = clock()
    backoff: _Backoff | None = None  # built at the first failure: most calls succeed at once
    while True:
        try:
            return await attempt()
        except Exception as raw:  # noqa: BLE001 - sorted by the backoff: raised as is, or retried
            if backoff is None:
                backoff = _Backoff(deadline_s, on_retry, what, delays_s, clock=clock, started=started)
            await asyncio.sleep(backoff.next_delay(raw))


def _give_up(error: BaseException, what: str, deadline_s: float | None) -> BaseException:
    if isinstance(error, RaytxnError):
        return error
    if isinstance(error, GetTimeoutError):
        return Timeout(f"{what}: no answer within {deadline_s}s")
    return ActorUnavailable(f"{what}: actor unavailable for {deadline_s}s ({type(error).__name__})")
