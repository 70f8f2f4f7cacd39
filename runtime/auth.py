"""Authentication and authorization: tokens, principals, topic permissions, superusers.

Pure Python (no Ray, no I/O; time is passed in), like Pulsar's token authentication with a
secret key plus its topic-level authorization:

* A token is a JWT signed with HS256 whose ``sub`` claim names the principal (an optional
  ``exp`` bounds its life). ``create_token`` makes one; every engine actor verifies it with the
  configured secret. Auth is on exactly when a secret is configured.
* A topic carries permissions: principal -> actions, the actions being ``produce`` and
  ``consume``. Producing (plain or in a txn) needs ``produce``; subscribing, receiving, acking and
  resetting a subscription need ``consume``.
* Superusers (``AuthConfig.superusers``) may do anything, and only they may administer: create and
  delete topics, grant and revoke, abort others' transactions, arm faults. The engine's own
  actors call each other as ``ENGINE_PRINCIPAL``, a superuser whose token only they can mint.
* Transactions are owned by the principal that began them; only it (or a superuser) may add to
  or end them. A transactional id belongs to the principal that first registered it, so another
  principal can neither fence its producers nor write under its id.

Every actor method states the access it needs with ``@guarded(Access.X)``; the caller's token
travels as the keyword argument ``auth`` (``rpc.ActorRef`` adds it). This guards against clients
that are misconfigured or lack rights; it is no wall against code running on the Ray cluster
itself, which can reach any actor's memory (Ray's own cluster authentication covers that).
"""

from __future__ import annotations

import enum
import functools
import inspect
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import jwt

from raytxn.errors import AuthenticationFailed, InvalidArgument, NotAuthorized

# the name rules live with the other names (the protocol checks them without auth's clock)
from raytxn.ids import CONSUME, PRODUCE, check_principal

ENGINE_PRINCIPAL = "raytxn-engine"


class Access(enum.Enum):
    PUBLIC = "public"                # liveness only (ready): no token needed
    AUTHENTICATED = "authenticated"  # any valid token: metadata, stats, own transactions
    PRODUCE = PRODUCE                # the topic's produce permission
    CONSUME = CONSUME                # the topic's consume permission
    SUPERUSER = "superuser"          # administration and the engine's internal calls


@dataclass(frozen=True)
class AuthConfig:
    """``secret`` set: auth is on. Clients only ever see ``public()`` (no secret)."""

    secret: str | None = None
    superusers: tuple[str, ...] = ("admin",)
    enabled: bool = False
    token_cache_size: int = 10_000

    def __post_init__(self) -> None:
        if self.secret is not None:
            if not isinstance(self.secret, str) or len(self.secret) < 16:
                raise InvalidArgument("the auth secret must be a string of at least 16 characters")
            object.__setattr__(self, "enabled", True)
            if not self.superusers:
                raise InvalidArgument("auth needs at least one superuser (nobody could administer)")
        for name in self.superusers:
            check_principal(name)

    def public(self) -> AuthConfig:
        return replace(self, secret=None)


def new_secret() -> str:
    """A fresh random secret (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def create_token(secret: str, principal: str, expires_at_s: float | None = None) -> str:
    """A token for ``principal`` signed with ``secret``; it expires at ``expires_at_s`` (epoch
    seconds) when given."""
    claims: dict[str, Any] = {"sub": check_principal(principal)}
    if expires_at_s is not None:
        claims["exp"] = int(expires_at_s)
    return jwt.encode(claims, secret, algorithm="HS256")


class Authorizer:
    """Verifies tokens (a bounded cache spares repeated signature checks) and decides access."""

    def __init__(self, config: AuthConfig | None = None) -> None:
        self.config = config or AuthConfig()
        self._verified: dict[str, tuple[str, int | None]] = {}  # token -> (principal, exp)
        self._engine_token: str | None = None

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def engine_token(self) -> str | None:
        """The token engine actors present to each other (None with auth off)."""
        if self.config.secret is None:
            return None
        if self._engine_token is None:
            self._engine_token = create_token(self.config.secret, ENGINE_PRINCIPAL)
        return self._engine_token

    def authenticate(self, token: object, now_s: float) -> str:
        """The principal ``token`` names; ``AuthenticationFailed`` unless it is genuine and live."""
        if not isinstance(token, str) or not token:
            raise AuthenticationFailed("auth is on: present a token (connect(token=...) or RAYTXN_TOKEN)")
        if self.config.secret is None:
            raise AuthenticationFailed("this actor has no secret to verify tokens with")
        found = self._verified.get(token)
        if found is None:
            try:
                # exp is checked below against the given clock, not PyJWT's
                claims = jwt.decode(token, self.config.secret, algorithms=["HS256"],
                                    options={"require": ["sub"], "verify_exp": False})
            except jwt.InvalidTokenError as e:
                raise AuthenticationFailed(f"invalid token: {e}") from None
            exp = claims.get("exp")
            if exp is not None and not isinstance(exp, int):
                raise AuthenticationFailed("invalid token: exp is not an integer")
            principal = claims["sub"]
            try:
                check_principal(principal)
            except InvalidArgument:
                raise AuthenticationFailed(f"invalid token: bad principal {principal!r}") from None
            if len(self._verified) >= self.config.token_cache_size:
                self._verified.clear()
            found = self._verified[token] = (principal, exp)
        principal, exp = found
        if exp is not None and now_s >= exp:
            raise AuthenticationFailed(f"the token of {principal!r} expired")
        return principal

    def is_superuser(self, principal: str | None) -> bool:
        return principal == ENGINE_PRINCIPAL or principal in self.config.superusers

    def authorize(self, principal: str, access: Access, permissions: Mapping[str, Iterable[str]] | None = None,
                  what: str = "") -> None:
        """Raise ``NotAuthorized`` unless ``principal`` has ``access`` (topic ``permissions`` for
        produce/consume)."""
        if access is Access.PUBLIC or access is Access.AUTHENTICATED or self.is_superuser(principal):
            return
        if access is Access.SUPERUSER:
            raise NotAuthorized(f"{principal!r} is not a superuser{': ' + what if what else ''}")
        if access.value not in (permissions or {}).get(principal, ()):
            raise NotAuthorized(f"{principal!r} has no {access.value} permission{' on ' + what if what else ''}")


class AuthTarget:
    """The access check of every guarded actor. Actors set ``authorizer`` and, when they serve a
    topic, override ``_topic_permissions`` and ``_auth_scope``."""

    authorizer: Authorizer = Authorizer()

    async def _topic_permissions(self) -> Mapping[str, Iterable[str]]:
        return {}  # no topic: nobody but superusers has produce/consume here

    def _auth_scope(self) -> str:
        return type(self).__name__

    def _call_began(self, method: str) -> bool:
        """Every guarded call starts here; True asks for ``_call_ended`` when it ends (the actor
        shell counts calls to tell an idle actor, see ``ActorShell``)."""
        return False

    def _call_ended(self) -> None:
        pass

    async def _authorize(self, access: Access, token: object, now_s: float) -> str | None:
        """The caller's principal (None with auth off), after checking it may have ``access``."""
        if not self.authorizer.enabled or access is Access.PUBLIC:
            return None
        principal = self.authorizer.authenticate(token, now_s)
        permissions = None
        if access in (Access.PRODUCE, Access.CONSUME) and not self.authorizer.is_superuser(principal):
            permissions = await self._topic_permissions()
        self.authorizer.authorize(principal, access, permissions, self._auth_scope())
        return principal


def guarded(access: Access) -> Callable[[Callable], Callable]:
    """Declare the access an actor method needs. The wrapped method takes the caller's token as
    the keyword ``auth``; a method with a ``caller`` parameter gets the authenticated
    principal there (None with auth off), and callers cannot pass it themselves."""

    def decorate(method: Callable) -> Callable:
        signature = inspect.signature(method)
        wants_caller = "caller" in signature.parameters
        params = [p for p in signature.parameters.values() if p.name != "caller"]
        params.append(inspect.Parameter("auth", inspect.Parameter.KEYWORD_ONLY, default=None))
        is_async = inspect.iscoroutinefunction(method)

        name = method.__name__

        @functools.wraps(method)
        async def wrapper(self: AuthTarget, *args: Any, auth: object = None, **kwargs: Any) -> Any:
            counted = self._call_began(name)
            try:
                # Auth off (the default) costs one attribute test per call, no clock, no await.
                principal = await self._authorize(access, auth, time.time()) if self.authorizer.enabled else None
                if wants_caller:
                    kwargs["caller"] = principal
                result = method(self, *args, **kwargs)
                return await result if is_async else result
            finally:
                if counted:
                    self._call_ended()

        # Ray validates call arguments against this signature (functools.wraps would point it
        # at the original, which has no ``auth``).
        del wrapper.__wrapped__
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.access = access  # type: ignore[attr-defined]
        return wrapper

    return decorate
