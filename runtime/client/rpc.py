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

from raytxn.errors import ActorUnavailable, RaytxnError, Timeout
from raytxn.ids import NAMESPACE

_ACTOR_GONE = (RayActorError, ActorDiedError, ActorUnavailableError)


def unwrap(error: BaseException) -> BaseException:
    """The raytxn error inside a RayTaskError, else the error itself."""
    if isinstance(error, RayTaskError) and isinstance(error.cause, BaseException):
        return error.cause
    return error


def retriable(error: BaseException) -> bool:
    return isinstance(error, _ACTOR_GONE) or (isinstance(error, RaytxnError) and error.retriable)


class ActorRef:
    """A named actor, looked up lazily and again after it failed. With a ``token``, every call
    presents it (as the keyword ``auth`` of the actor's guarded methods, see runtime/auth.py)."""

    def __init__(self, name: str, token: str | None = None) -> None:
        self.name = name
        self.token = token
        self._handle: Any = None

    def handle(self) -> Any:
        if self._handle is None:
            try:
                self._handle = ray.get_actor(self.name, namespace=NAMESPACE)
            except ValueError as e:  # not created yet, or being re-created
                raise ActorUnavailable(f"no actor {self.name!r}") from e
        return self._handle

    def forget(self) -> None:
        self._handle = None

    def call(self, method: str, *args: Any, deadline_s: float = 60.0,
             on_retry: Callable[[], None] | None = None, **kwargs: Any) -> Any:
        """Call ``method`` and wait, retrying while the actor is unavailable (``on_retry`` runs
        before each retry)."""
        if self.token is not None:
            kwargs["auth"] = self.token

        def forget() -> None:
            self.forget()
            if on_retry is not None:
                on_retry()

        return retry(lambda: ray.get(getattr(self.handle(), method).remote(*args, **kwargs)),
                     deadline_s, on_retry=forget, what=f"{self.name}.{method}")

    async def call_async(self, method: str, *args: Any, deadline_s: float = 60.0, **kwargs: Any) -> Any:
        if self.token is not None:
            kwargs["auth"] = self.token

        async def attempt() -> Any:
            return await getattr(self.handle(), method).remote(*args, **kwargs)

        return await retry_async(attempt, deadline_s, on_retry=self.forget, what=f"{self.name}.{method}")


class _Backoff:
    """The retry policy both loops share: which errors to retry, how long to wait, when to stop."""

    def __init__(self, deadline_s: float, on_retry: Callable[[], None] | None, what: str) -> None:
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.on_retry = on_retry
        self.what = what
        self.delay = 0.02

    def next_delay(self, raw: BaseException) -> float:
        """The wait before the next attempt; raises the error when it is final or time is up."""
        error = unwrap(raw)
        if not retriable(error):
            raise error from None
        if self.on_retry:
            self.on_retry()
        if time.monotonic() + self.delay > self.deadline:
            raise _give_up(error, self.what, self.deadline_s) from None
        delay, self.delay = self.delay, min(self.delay * 2, 1.0)
        return delay


def retry(attempt: Callable[[], Any], deadline_s: float, on_retry: Callable[[], None] | None = None,
          what: str = "call") -> Any:
    backoff = _Backoff(deadline_s, on_retry, what)
    while True:
        try:
            return attempt()
        except Exception as raw:  # noqa: BLE001 - sorted by the backoff: raised as is, or retried
            time.sleep(backoff.next_delay(raw))


async def retry_async(attempt: Callable[[], Any], deadline_s: float, on_retry: Callable[[], None] | None = None,
                      what: str = "call") -> Any:
    backoff = _Backoff(deadline_s, on_retry, what)
    while True:
        try:
            return await attempt()
        except Exception as raw:  # noqa: BLE001 - sorted by the backoff: raised as is, or retried
            await asyncio.sleep(backoff.next_delay(raw))


def _give_up(error: BaseException, what: str, deadline_s: float) -> BaseException:
    if isinstance(error, RaytxnError):
        return error
    if isinstance(error, GetTimeoutError):
        return Timeout(f"{what}: no answer within {deadline_s}s")
    return ActorUnavailable(f"{what}: actor unavailable for {deadline_s}s ({type(error).__name__})")
