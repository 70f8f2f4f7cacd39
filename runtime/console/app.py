"""The console's web app (Starlette, served by uvicorn) and the Ray actor that serves it.

Logins. A user logs in with a raytxn token; the engine says whom it names (the supervisor's
``whoami``, called with that token, verifies it as every actor does). The console keeps the
token in a server-side session (the browser holds only a random session id, in an HttpOnly,
SameSite=Strict cookie) until the token expires or the session idles out, and every call it
makes for that user presents that token (``data.REQUEST_TOKEN``). With the engine's auth off
there is nobody to log in: every visitor acts as the CLI does, unauthenticated. Forms that act
(abort, log out) carry the session's CSRF token too.

Served from the cluster. ``start_console`` starts a ``ConsoleServer`` actor (``console-<port>``,
detached, no CPU held) that serves the app from its own event loop, as the Kafka gateway serves
Kafka: it outlives the command that started it, runs beside the engine, and its state is only
sessions and a stats cache, so it needs no recovery (it is not restarted by Ray; ``raytxn
console`` starts it again). It binds loopback unless told otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from raytxn.client.rpc import unwrap
from raytxn.errors import InvalidArgument
from raytxn.extras import import_extra
from raytxn.ids import NAMESPACE

log = logging.getLogger(__name__)

DEFAULT_BIND_HOST = "127.0.0.1"
SESSION_COOKIE = "raytxn_console"
MAX_SESSIONS = 1000              # the least recently used session goes beyond this
SESSION_IDLE_S = 12 * 3600       # a session unused this long is logged out
HERE = Path(__file__).parent


@dataclass
class Session:
    session_id: str
    token: str | None
    principal: str | None
    superuser: bool
    auth: bool
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    expires_at_s: float | None = None  # the token's exp claim
    last_seen_s: float = field(default_factory=time.time)

    def live(self, now_s: float) -> bool:
        return (self.expires_at_s is None or now_s < self.expires_at_s) and now_s - self.last_seen_s < SESSION_IDLE_S


class Sessions:
    """Session id -> session, bounded (least recently used out first)."""

    def __init__(self, most: int = MAX_SESSIONS) -> None:
        self.most = most
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def new(self, token: str | None, who: dict[str, Any]) -> Session:
        session = Session(secrets.token_urlsafe(32), token, who.get("principal"), bool(who.get("superuser")),
                          bool(who.get("auth")), expires_at_s=token_expiry(token))
        self._sessions[session.session_id] = session
        while len(self._sessions) > self.most:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        session = self._sessions.get(session_id or "")
        if session is None:
            return None
        now = time.time()
        if not session.live(now):
            del self._sessions[session.session_id]
            return None
        session.last_seen_s = now
        self._sessions.move_to_end(session.session_id)
        return session

    def end(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)


def token_expiry(token: str | None) -> float | None:
    """The ``exp`` claim of a raytxn token (a JWT), read without its signature: the engine
    verified the token at login; this only ends the session when the token would stop working."""
    if not token or token.count(".") != 2:
        return None
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


def build_app(num_coordinators: int, refresh_s: float = 2.0, auth: bool = True) -> Any:
    """The Starlette app of the console (its routes are ``pages``')."""
    starlette = import_extra("starlette.applications", "console")
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    from raytxn.console.data import ConsoleData
    from raytxn.console.pages import Pages

    pages = Pages(ConsoleData(num_coordinators, refresh_s), Sessions(), auth)
    routes = [*pages.routes(), Mount("/static", StaticFiles(directory=HERE / "static"), name="static")]
    return starlette.Starlette(routes=routes, exception_handlers=pages.exception_handlers())


class ConsoleServer:
    """An actor serving the console on ``bind_host:port`` (0: any free port) from its loop."""

    def __init__(self, port: int, bind_host: str = DEFAULT_BIND_HOST, refresh_s: float = 2.0) -> None:
        self.port, self.bind_host, self.refresh_s = port, bind_host, refresh_s
        self.auth = True
        self._server: Any = None
        self._serving: asyncio.Task | None = None

    async def start(self) -> dict[str, Any]:
        """Serve (again a no-op); returns the address and what the engine says of auth."""
        if self._server is None:
            uvicorn = import_extra("uvicorn", "console")
            from raytxn.client.rpc import ActorRef
            from raytxn.ids import SUPERVISOR_NAME

            config = await ActorRef(SUPERVISOR_NAME).call_async("engine_config", deadline_s=30.0)
            self.auth = bool(config.auth.enabled)
            app = build_app(config.coordinator.num_coordinators, self.refresh_s, self.auth)
            listener = socket.socket(socket.AF_INET6 if ":" in self.bind_host else socket.AF_INET)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((self.bind_host, self.port))
            except OSError as e:
                listener.close()
                raise InvalidArgument(f"the console cannot listen on {self.bind_host}:{self.port}: {e}") from None
            listener.listen(128)
            self.port = listener.getsockname()[1]
            self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                         timeout_graceful_shutdown=1))
            self._serving = asyncio.get_running_loop().create_task(self._server.serve(sockets=[listener]))
            for _ in range(500):  # up to 5 s for uvicorn to be listening
                if self._server.started or self._serving.done():
                    break
                await asyncio.sleep(0.01)
            if self._serving.done():
                self._serving.result()  # raises what stopped it
        return self.address()

    def address(self) -> dict[str, Any]:
        host = self.bind_host if self.bind_host not in ("0.0.0.0", "::") else ray.util.get_node_ip_address()
        shown = f"[{host}]" if ":" in host else host
        warning = None
        if not self.auth and self.bind_host not in ("127.0.0.1", "localhost", "::1"):
            warning = (f"the console listens on {self.bind_host} with the engine's authentication off: anyone who "
                       "reaches it may abort transactions and read every message")
        return {"url": f"http://{shown}:{self.port}/", "port": self.port, "bind_host": self.bind_host,
                "auth": self.auth, "warning": warning}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._serving is not None:
                await asyncio.wait([self._serving], timeout=5)
            self._server = None


# Not restarted by Ray (a restarted actor would not serve until start() is called): `raytxn
# console` starts it again, and it has nothing to recover.
ConsoleActor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1000)(ConsoleServer)


def console_actor_name(port: int) -> str:
    return f"console-{port}"


def start_console(port: int = 8080, *, bind_host: str = DEFAULT_BIND_HOST, refresh_s: float = 2.0) -> dict[str, Any]:
    """Start the console actor on the Ray cluster this driver is connected to (after
    ``raytxn.connect``), serving ``port`` (0: any free port, an unnamed actor); idempotent per
    port. Returns ``url``, ``port``, ``auth`` (whether users log in), ``warning`` (a listener
    beyond loopback with auth off) and ``actor``. ``refresh_s``: how old the stats snapshot may
    get before a page's request refreshes it."""
    if type(port) is not int or not 0 <= port < 65536:
        raise InvalidArgument(f"port must be an int in 0..65535, got {port!r}")
    if not 0.2 <= refresh_s <= 600:
        raise InvalidArgument(f"refresh_s must be in 0.2..600 seconds, got {refresh_s!r}")
    for module in ("starlette", "uvicorn", "jinja2"):
        import_extra(module, "console")  # said here, not as an actor's ImportError
    options: dict[str, Any] = {"namespace": NAMESPACE, "lifetime": "detached"}
    if port:
        options.update(name=console_actor_name(port), get_if_exists=True)
    actor = ConsoleActor.options(**options).remote(port, bind_host, refresh_s)
    try:
        address = ray.get(actor.start.remote())
    except Exception as e:  # noqa: BLE001 - raised as the raytxn error inside, after the cleanup
        ray.kill(actor, no_restart=True)  # a port in use: no actor left holding the name
        raise unwrap(e) from None
    return {**address, "actor": actor}


def stop_console(port: int) -> bool:
    """End the console serving ``port``; whether there was one."""
    try:
        actor = ray.get_actor(console_actor_name(port), namespace=NAMESPACE)
    except ValueError:
        return False
    try:
        ray.get(actor.stop.remote(), timeout=10)
    finally:
        ray.kill(actor, no_restart=True)
    return True
