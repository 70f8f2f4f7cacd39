"""The console's pages: one handler per route, each rendering a template of ``templates/``.

Every page is server-rendered whole; ``?fragment=1`` renders only its ``live`` block, which the
page's script fetches again every few seconds (``static/console.js``), so pages refresh on their
own without a client-side app. Long tables are paged here (``?page=N``), never in the browser.

Bad input (an unknown topic or transaction, a malformed transaction id, a page number that is not
one) gets a 4xx page saying what was wrong; an engine refusal is a 403 page with the engine's
reason; nothing shows a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from raytxn.console.app import HERE, SESSION_COOKIE, Session, Sessions
from raytxn.console.data import REQUEST_TOKEN, ConsoleData, Snapshot, page_of
from raytxn.errors import (
    ActorUnavailable,
    AuthenticationFailed,
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    NotAuthorized,
    RaytxnError,
    TopicNotFound,
    TransactionNotFound,
)
from raytxn.extras import import_extra
from raytxn.ids import check_name, parse_txn_id, partition_actor_name, subscription_actor_name

log = logging.getLogger(__name__)

PAGE_SIZE = 50              # rows of a paged table
MESSAGE_PAGE = 50           # messages of a page of the browser, unless ?size= says otherwise
MAX_MESSAGE_PAGE = 500
MIN_REFRESH_MS = 1000       # a page's live block is fetched again this often at most (the snapshot's age, else)
MAX_PAGE = 1_000_000
Handler = Callable[[Any, Session], Awaitable[Any]]


class BadInput(InvalidArgument):
    """A query parameter or path part that is not what the page takes (a 400 page)."""


def int_param(request: Any, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{name} must be a whole number, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise BadInput(f"{name} must be in {low}..{high}, got {value}")
    return value


def status_of(error: BaseException) -> int:
    if isinstance(error, AuthenticationFailed):
        return 401
    if isinstance(error, NotAuthorized):
        return 403
    if isinstance(error, TopicNotFound | TransactionNotFound):
        return 404
    if isinstance(error, InvalidArgument):
        return 400
    if isinstance(error, InvalidTxnState | NotAllowed):
        return 409
    if isinstance(error, ActorUnavailable) or getattr(error, "retriable", False):
        return 503
    return 500


TITLES = {400: "Bad request", 401: "Not logged in", 403: "Refused", 404: "Not found", 409: "Conflict",
          500: "Error", 503: "Unavailable"}


def fmt_bytes(value: Any) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def fmt_rate(value: Any) -> str:
    return "—" if value is None else f"{value:,.1f}/s"


def fmt_age(ms: Any) -> str:
    if ms is None:
        return "—"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_time(ms: Any) -> str:
    return "—" if not ms else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


class Pages:
    def __init__(self, data: ConsoleData, sessions: Sessions, auth: bool = True) -> None:
        jinja2 = import_extra("jinja2", "console")
        self.data, self.sessions, self.auth = data, sessions, auth
        self.refresh_ms = max(MIN_REFRESH_MS, int(data.refresh_s * 1000))
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                      undefined=jinja2.StrictUndefined)
        self.env.filters.update(bytes=fmt_bytes, rate=fmt_rate, age=fmt_age, when=fmt_time, q=quote)

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        page = self.page
        return [
            Route("/", page(self.home)),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", page(self.logout), methods=["POST"]),
            Route("/topics", page(self.topics)),
            Route("/topics/{topic}", page(self.topic)),
            Route("/topics/{topic}/partitions/{partition}/messages", page(self.messages)),
            Route("/topics/{topic}/subscriptions/{subscription}", page(self.subscription)),
            Route("/subscriptions", page(self.subscriptions)),
            Route("/groups", page(self.groups)),
            Route("/groups/{group}", page(self.group)),
            Route("/transactions", page(self.transactions)),
            Route("/transactions/{txn}", page(self.transaction)),
            Route("/transactions/{txn}/abort", page(self.abort), methods=["GET", "POST"]),
            Route("/health", page(self.health)),
        ]

    def exception_handlers(self) -> dict[Any, Any]:
        from starlette.exceptions import HTTPException

        async def http_error(request: Any, error: HTTPException) -> Any:
            message = "no such page" if error.status_code == 404 else str(error.detail)
            return self.error_page(request, None, error.status_code, TITLES.get(error.status_code, "Error"), message)

        async def internal(request: Any, error: Exception) -> Any:
            log.exception("console page %s failed", request.url.path)
            return self.error_page(request, None, 500, "Error", "the console failed to render this page (logged)")

        return {HTTPException: http_error, Exception: internal}

    # --- the frame of every page --------------------------------------------------------------

    def page(self, handler: Handler) -> Callable[[Any], Awaitable[Any]]:
        """Find the session (or send to the login page), act with its token, turn errors into
        pages."""
        from starlette.responses import RedirectResponse

        async def endpoint(request: Any) -> Any:
            session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
            new_session = None
            if session is None:
                if self.auth:
                    if request.query_params.get("fragment"):
                        return self.error_page(request, None, 401, TITLES[401], "your session ended: log in again")
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)
                session = new_session = self.sessions.new(None, {"auth": False, "superuser": True})
            reset = REQUEST_TOKEN.set(session.token)
            try:
                response = await handler(request, session)
            except RaytxnError as error:
                if isinstance(error, AuthenticationFailed):
                    self.sessions.end(session.session_id)
                status = status_of(error)
                kind = "InvalidArgument" if isinstance(error, BadInput) else type(error).__name__
                response = self.error_page(request, session, status, TITLES.get(status, "Error"), f"{kind}: {error}")
            finally:
                REQUEST_TOKEN.reset(reset)
            if new_session is not None:
                set_session_cookie(response, new_session)
            return response

        return endpoint

    def render(self, request: Any, session: Session | None, template: str, status: int = 200,
               **context: Any) -> Any:
        from starlette.responses import HTMLResponse

        page = self.env.get_template(template)
        context = {"session": session, "path": request.url.path, "refresh_ms": self.refresh_ms, **context}
        if request.query_params.get("fragment") and "live" in page.blocks:
            html = "".join(page.blocks["live"](page.new_context(context)))
        else:
            html = page.render(context)
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})

    def error_page(self, request: Any, session: Session | None, status: int, title: str, message: str) -> Any:
        return self.render(request, session, "error.html", status=status, title=title, message=message,
                           status_code=status)

    # --- login --------------------------------------------------------------------------------

    async def login(self, request: Any) -> Any:
        from starlette.responses import RedirectResponse

        target = request.query_params.get("next") or "/topics"
        if not target.startswith("/") or target.startswith("//"):
            target = "/topics"  # only this console's pages: no redirect elsewhere
        if not self.auth:
            return RedirectResponse(target, status_code=303)
        if request.method == "GET":
            return self.render(request, None, "login.html", next=target, message=None)
        form = await form_of(request)
        token = form.get("token", "").strip()
        if not token:
            return self.render(request, None, "login.html", status=400, next=target, message="paste a raytxn token")
        try:
            who = await self.data.whoami(token)
        except RaytxnError as error:
            status = 401 if isinstance(error, NotAuthorized) else status_of(error)
            return self.render(request, None, "login.html", status=status, next=target,
                               message=f"{type(error).__name__}: {error}")
        session = self.sessions.new(token, who)
        response = RedirectResponse(target, status_code=303)
        set_session_cookie(response, session)
        return response

    async def logout(self, request: Any, session: Session) -> Any:
        from starlette.responses import RedirectResponse

        await self.check_csrf(request, session)
        self.sessions.end(session.session_id)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    async def check_csrf(self, request: Any, session: Session) -> dict[str, Any]:
        form = await form_of(request)
        if form.get("csrf") != session.csrf:
            raise NotAuthorized("this form is not from your session (reload the page and try again)")
        return form

    async def home(self, request: Any, session: Session) -> Any:
        from starlette.responses import RedirectResponse

        return RedirectResponse("/topics", status_code=303)

    # --- topics -------------------------------------------------------------------------------

    async def topics(self, request: Any, session: Session) -> Any:
        page = int_param(request, "page", 1, 1, MAX_PAGE)
        search = request.query_params.get("q", "")[:200]
        topics, snapshot = await asyncio.gather(self.data.topics(), self.data.current())
        found = [t for t in topics if search in t["name"]]
        rows, pages = page_of(found, page, PAGE_SIZE)
        for row in rows:
            row["stats"] = snapshot.topics.get(row["name"])
        return self.render(request, session, "topics.html", rows=rows, page=page, pages=pages, total=len(found),
                           search=search, snapshot=snapshot)

    async def topic(self, request: Any, session: Session) -> Any:
        name = check_name(request.path_params["topic"])
        info, snapshot = await asyncio.gather(self.data.topic(name), self.data.current())
        partitions = []
        for p in range(info["partitions"]):
            actor = partition_actor_name(name, p)
            partitions.append({"partition": p, "state": snapshot.state_of(actor),
                               "stats": snapshot.partitions.get(actor), "rate_in": snapshot.rates.get(f"in/{actor}")})
        subscriptions = [subscription_summary(snapshot, name, sub, info["partitions"]) for sub in info["subscriptions"]]
        return self.render(request, session, "topic.html", topic=info, partitions=partitions,
                           subscriptions=subscriptions, summary=snapshot.topics.get(name), snapshot=snapshot)

    async def messages(self, request: Any, session: Session) -> Any:
        name = check_name(request.path_params["topic"])
        partition = path_int(request.path_params["partition"], "partition")
        offset = int_param(request, "offset", None, 0, 2**63 - 1)
        size = int_param(request, "size", MESSAGE_PAGE, 1, MAX_MESSAGE_PAGE)
        assert size is not None
        highlight = request.query_params.get("txn") or None
        if highlight is not None:
            highlight = str(parse_txn_id(highlight))
        page = await self.data.browse(name, partition, offset, size)
        if page["out_of_range"]:
            raise BadInput(f"offset {offset} is outside this partition's log: {page['log_start']}.."
                           f"{page['high_watermark']}")
        base = f"/topics/{quote(name)}/partitions/{partition}/messages"
        extra = {"size": size, **({"txn": highlight} if highlight else {})}
        older = max(page["log_start"], page["offset"] - size) if page["offset"] > page["log_start"] else None

        def at(offset: int | None) -> str | None:
            return None if offset is None else f"{base}?{urlencode({'offset': offset, **extra})}"

        links = {"latest": f"{base}?{urlencode(extra)}", "older": at(older), "newer": at(page["next_offset"])}
        return self.render(request, session, "messages.html", topic=name, partition=partition, page=page,
                           links=links, highlight=highlight, size=size)

    # --- subscriptions and groups -------------------------------------------------------------

    async def subscriptions(self, request: Any, session: Session) -> Any:
        page = int_param(request, "page", 1, 1, MAX_PAGE)
        search = request.query_params.get("q", "")[:200]
        topics, snapshot = await asyncio.gather(self.data.topics(), self.data.current())
        pairs = [(t["name"], sub, t["partitions"]) for t in topics for sub in t["subscriptions"]
                 if search in t["name"] or search in sub]
        chosen, pages = page_of(pairs, page, PAGE_SIZE)
        rows = [subscription_summary(snapshot, topic, sub, partitions) for topic, sub, partitions in chosen]
        return self.render(request, session, "subscriptions.html", rows=rows, page=page, pages=pages,
                           total=len(pairs), search=search, snapshot=snapshot)

    async def subscription(self, request: Any, session: Session) -> Any:
        name = check_name(request.path_params["topic"])
        sub = check_name(request.path_params["subscription"], "subscription")
        info, snapshot = await asyncio.gather(self.data.topic(name), self.data.current())
        if sub not in info["subscriptions"]:
            raise TopicNotFound(f"topic {name!r} has no subscription {sub!r}")
        rows = []
        for p in range(info["partitions"]):
            actor = subscription_actor_name(name, p, sub)
            rows.append({"partition": p, "state": snapshot.state_of(actor), "stats": snapshot.subscriptions.get(actor),
                         "rate_out": snapshot.rates.get(f"out/{actor}"),
                         "why": snapshot.why_not_counted(actor, partition_actor_name(name, p))})
        return self.render(request, session, "subscription.html", topic=name, subscription=sub, rows=rows,
                           summary=subscription_summary(snapshot, name, sub, info["partitions"]), snapshot=snapshot)

    async def groups(self, request: Any, session: Session) -> Any:
        page = int_param(request, "page", 1, 1, MAX_PAGE)
        topics, snapshot = await asyncio.gather(self.data.topics(), self.data.current())
        by_group: dict[str, list[dict[str, Any]]] = {}
        for topic in topics:
            for sub in topic["subscriptions"]:
                by_group.setdefault(sub, []).append(topic)
        for group in snapshot.groups:
            by_group.setdefault(group, [])
        names = sorted(by_group)
        chosen, pages = page_of(names, page, PAGE_SIZE)
        rows = []
        for group in chosen:
            summaries = [subscription_summary(snapshot, t["name"], group, t["partitions"]) for t in by_group[group]]
            rows.append({"group": group, "topics": [t["name"] for t in by_group[group]],
                         "lag": sum_known(s["backlog"] for s in summaries),
                         "lag_exact": all(s["backlog_exact"] for s in summaries),
                         "consumers": sum(s["consumers"] for s in summaries), "kafka": snapshot.groups.get(group)})
        return self.render(request, session, "groups.html", rows=rows, page=page, pages=pages, total=len(names),
                           snapshot=snapshot)

    async def group(self, request: Any, session: Session) -> Any:
        group = check_name(request.path_params["group"], "group")
        page = int_param(request, "page", 1, 1, MAX_PAGE)
        topics, snapshot = await asyncio.gather(self.data.topics(), self.data.current())
        pairs = [(t["name"], p) for t in topics if group in t["subscriptions"] for p in range(t["partitions"])]
        if not pairs and group not in snapshot.groups:
            raise TopicNotFound(f"no Kafka group or subscription {group!r}")
        chosen, pages = page_of(pairs, page, PAGE_SIZE)
        rows = await asyncio.gather(*(self._group_row(snapshot, topic, p, group) for topic, p in chosen))
        return self.render(request, session, "group.html", group=group, rows=rows, page=page, pages=pages,
                           kafka=snapshot.groups.get(group), snapshot=snapshot)

    async def _group_row(self, snapshot: Snapshot, topic: str, partition: int, group: str) -> dict[str, Any]:
        """A group's committed offset on a partition, its lag in messages (markers and aborted
        messages not counted) beside the offset gap a Kafka tool shows (markers counted)."""
        sub_actor, part_actor = subscription_actor_name(topic, partition, group), partition_actor_name(topic, partition)
        stats, part = snapshot.subscriptions.get(sub_actor), snapshot.partitions.get(part_actor)
        row: dict[str, Any] = {"topic": topic, "partition": partition, "stats": stats, "committed": None,
                               "end_offset": None if part is None else part["kafka_offsets"]["last_stable"],
                               "note": None if stats is not None else snapshot.why_not_counted(sub_actor, part_actor)}
        if stats is None or part is None or stats.get("stored_cursor"):
            return row  # dormant: asking would start it
        try:
            row["committed"] = await self.data.group_offsets(topic, partition, group)
        except NotAuthorized as error:
            row["note"] = f"refused: {error}"
        return row

    # --- transactions -------------------------------------------------------------------------

    async def transactions(self, request: Any, session: Session) -> Any:
        page = int_param(request, "page", 1, 1, MAX_PAGE)
        live, recent, snapshot = await asyncio.gather(self.data.open_txns(), self.data.recent_outcomes(),
                                                      self.data.current())
        rows, pages = page_of(live, page, PAGE_SIZE)
        return self.render(request, session, "transactions.html", rows=rows, page=page, pages=pages, total=len(live),
                           recent=recent, coordinators=snapshot.coordinators, snapshot=snapshot)

    async def transaction(self, request: Any, session: Session) -> Any:
        txn = parse_txn_id(request.path_params["txn"])
        info = await self.data.transaction(txn)
        return self.render(request, session, "transaction.html", txn=info,
                           aborted=request.query_params.get("aborted"))

    async def abort(self, request: Any, session: Session) -> Any:
        from starlette.responses import RedirectResponse

        txn = parse_txn_id(request.path_params["txn"])
        if request.method == "POST":
            await self.check_csrf(request, session)
            state = await self.data.abort(txn)
            return RedirectResponse(f"/transactions/{quote(str(txn))}?{urlencode({'aborted': state})}",
                                    status_code=303)
        try:
            info, refusal = await self.data.transaction(txn), None
        except NotAuthorized as error:  # the confirmation still shows: the abort itself is the engine's to refuse
            info, refusal = {"txn": str(txn), "tc_id": txn.tc_id, "sequence": txn.sequence}, str(error)
        return self.render(request, session, "abort.html", txn=info, refusal=refusal)

    # --- health -------------------------------------------------------------------------------

    async def health(self, request: Any, session: Session) -> Any:
        page = int_param(request, "page", 1, 1, MAX_PAGE)
        kind = request.query_params.get("kind") or None
        state = request.query_params.get("state") or None
        health = await self.data.health()
        actors = health["actors"]
        counts: dict[tuple[str, str], int] = {}
        hosts: dict[str, int] = {}
        for row in actors:
            counts[(row["kind"], row["state"])] = counts.get((row["kind"], row["state"]), 0) + 1
            if row.get("host"):
                hosts[row["host"]] = hosts.get(row["host"], 0) + 1
        shown = [r for r in actors if (kind is None or r["kind"] == kind) and (state is None or r["state"] == state)]
        shown.sort(key=lambda r: (r["state"] == "DORMANT", r["kind"] != "coordinator", r["name"]))
        rows, pages = page_of(shown, page, PAGE_SIZE)
        return self.render(request, session, "health.html", health=health, rows=rows, page=page, pages=pages,
                           total=len(shown), counts=sorted(counts.items()), hosts=sorted(hosts.items()),
                           coordinators=[r for r in actors if r["kind"] == "coordinator"],
                           restarts=sum(r["restarts"] for r in actors), kind=kind, state=state)


MAX_FORM_BYTES = 64 * 1024  # a token and a CSRF token: far less


async def form_of(request: Any) -> dict[str, str]:
    """A posted form (application/x-www-form-urlencoded, what the pages' forms send), its first
    value per field. Read here rather than by Starlette's ``request.form()``, which needs
    python-multipart for any form; a body past ``MAX_FORM_BYTES`` is refused."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadInput(f"a form of more than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"an unreadable form: {e}") from None
    return {key: values[0] for key, values in fields.items()}


def path_int(raw: str, what: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{what} must be a whole number, got {raw[:40]!r}") from None
    if value < 0:
        raise BadInput(f"{what} must be >= 0, got {value}")
    return value


def sum_known(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def subscription_summary(snapshot: Snapshot, topic: str, sub: str, partitions: int) -> dict[str, Any]:
    """A subscription over its partitions: backlog in messages (of the partitions counted: a
    live subscription's, or a dormant one's stored cursor on a live partition; ``partial`` when
    not all were), consumers, lease holders, type, txns with acks pending."""
    backlog, exact, counted, consumers, holders, kinds, pending = 0, True, 0, 0, set(), set(), 0
    for p in range(partitions):
        stats = snapshot.subscriptions.get(subscription_actor_name(topic, p, sub))
        if stats is None:
            continue
        counted += 1
        backlog += stats.get("backlog_messages", 0)
        exact = exact and stats.get("backlog_exact", True)
        consumers += len(stats.get("consumers", []))
        holders.update(lease["holder"] for lease in stats.get("leases", []))
        if stats.get("type"):
            kinds.add(stats["type"])
        pending += len(stats.get("pending_ack", {}).get("txns", []))
    return {"topic": topic, "subscription": sub, "partitions": partitions, "counted": counted,
            "backlog": backlog if counted else None, "backlog_exact": exact, "partial": 0 < counted < partitions,
            "consumers": consumers, "lease_holders": sorted(holders), "types": sorted(kinds), "pending_txns": pending}


def set_session_cookie(response: Any, session: Session) -> None:
    max_age = None if session.expires_at_s is None else max(0, int(session.expires_at_s - time.time()))
    response.set_cookie(SESSION_COOKIE, session.session_id, httponly=True, samesite="strict", path="/", max_age=max_age)
