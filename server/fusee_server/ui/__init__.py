"""The web UI (docs/web-ui.md) at `/` of the HTTP API's address: pages rendered here
from what the `/v1` handlers answer (the same `RunsApi` methods, called in process, so
a page shows exactly what the API would), with jinja2 escaping every value it prints.

The pages read; every change (signal, cancel, terminate, reset, retry, resume) is a
`fetch` from static/ui.js to the `/v1` route itself, with a JSON body or
`X-Fusee-Action: 1`, so http_guard.py's rules hold for the UI as for any caller, and the
UI adds no route that changes anything. htmx (static/htmx.min.js, vendored from npm's
`htmx.org`, its license beside it) refreshes the live parts of a page by polling.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from fusee._errors import FuseeError
from fusee.journal import FINAL
from fusee_server.http_guard import TOKEN_COOKIE, Guard
from fusee_server.http_runs import ApiError, Asked, RunsApi
from fusee_server.http_types import DescribeString, ListedStatus, ListString
from fusee_server.ui.timeline import show, timeline

HERE = Path(__file__).parent
STATIC = HERE / "static"
PAGE_SIZE = 50
SCHEDULE_TYPE = "fusee.schedule"  # the engine's schedules are runs of this type
POLL = "every 2s"  # how often a live part of a page refreshes
STATUSES = ListedStatus.__args__  # type: ignore[attr-defined]

# What the shards page shows: a row per shard (`shard`, `holder`, `invocation`, `epoch`)
# and one per connected worker (`worker`, `held`, `standby`).
ShardsView = Callable[[], dict[str, list[dict[str, Any]]]]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: nothing printed unescaped
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seg"] = lambda wid: quote(str(wid), safe="")  # an ID as one path segment
    env.globals["FINAL"] = {str(status) for status in FINAL}
    env.globals["POLL"] = POLL
    return env


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


class WebUi:
    """The pages, over `api` (the `/v1` handlers); `shards` reads who holds what."""

    def __init__(
        self, api: RunsApi, shards: ShardsView, title: str = "Fusee", codec_url: str | None = None
    ) -> None:
        self.api = api
        self.shards = shards
        self.title = title
        self.env = _environment()
        # `--codec-url`: pages ask it to decode encrypted payloads (docs/web-ui.md); the
        # CSP lets them reach it and nothing else.
        self.codec_url = codec_url
        self.env.globals["CODEC_URL"] = codec_url or ""
        self.guard: Guard | None = None  # set by add_to: whose token a page is read with

    def add_to(self, app: web.Application, guard: Guard) -> None:
        """The pages on `app`; `guard` answers a browser without a token with the
        sign-in page (a server with tokens)."""
        guard.sign_in = self.sign_in_page
        self.guard = guard
        get = app.router.add_get
        get("/", self.runs_page)
        get("/runs/{id}", self.run_page)
        get("/runs/{id}/live", self.run_live)
        get("/invocations", self.invocations_page)
        get("/invocations/live", self.invocations_live)
        get("/shards", self.shards_page)
        get("/schedules", self.schedules_page)
        app.router.add_static("/static/", STATIC, append_version=False)

    def _html(self, template: str, status: int = 200, **values: Any) -> web.Response:
        body = self.env.get_template(template).render(title=self.title, **values)
        # The pages carry no inline script: a CSP that allows only this site's own
        # scripts keeps an escaped-but-missed string from ever running.
        connect = f"connect-src 'self' {_origin(self.codec_url)}; " if self.codec_url else ""
        headers = {
            "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
            f"{connect}frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store",
        }
        return web.Response(text=body, status=status, content_type="text/html", headers=headers)

    def _error(self, error: Exception, what: str) -> web.Response:
        status, code, message = 500, "Fusee", str(error)
        if isinstance(error, ApiError):
            status, code, message = error.status, error.code, error.message
        elif isinstance(error, FuseeError):
            status, code, message = 400, error.code, error.message
        return self._html("error.html", status=status, what=what, code=code, message=message, nav="")

    def sign_in_page(self, request: web.Request) -> web.Response:
        """Asks for the token once (static/ui.js keeps it in the guard's cookie)."""
        offered = bool(request.cookies.get(TOKEN_COOKIE))
        response = self._html("sign_in.html", status=401, nav="", offered=offered)
        response.headers["WWW-Authenticate"] = 'Bearer realm="fusee"'
        return response

    # -- runs ---------------------------------------------------------------------------

    async def runs_page(self, request: web.Request) -> web.Response:
        return await self._listing(request, "runs.html", "runs", type_=None)

    async def schedules_page(self, request: web.Request) -> web.Response:
        return await self._listing(request, "runs.html", "schedules", type_=SCHEDULE_TYPE)

    async def _listing(
        self, request: web.Request, template: str, nav: str, type_: str | None
    ) -> web.Response:
        q = request.query
        filters = {
            "type": type_ or q.get("type", "").strip(),
            "status": q.get("status", "").strip(),
            "prefix": q.get("prefix", ""),
        }
        try:
            limit = min(max(int(q.get("limit", PAGE_SIZE)), 1), 1000)
        except ValueError:
            limit = PAGE_SIZE
        cursor = q.get("cursor") or None
        try:
            query = ListString(
                type=filters["type"] or None,
                status=filters["status"] or None,  # type: ignore[arg-type]
                prefix=filters["prefix"] or None,
                limit=limit,
                cursor=cursor,
            )
            if query.status is not None and query.status not in STATUSES:
                raise FuseeError(f"status {query.status!r}: one of {', '.join(STATUSES)}")
            listed = await self.api.list_runs(self._asked(request, {}, query))
        except (ApiError, FuseeError) as error:
            return self._error(error, "listing runs")
        kept = {k: v for k, v in filters.items() if v and not (type_ and k == "type")}
        if limit != PAGE_SIZE:
            kept["limit"] = str(limit)
        path = "/schedules" if type_ else "/"
        next_url = f"{path}?{urlencode(kept | {'cursor': listed.next_cursor})}" if listed.next_cursor else ""
        first_url = f"{path}?{urlencode(kept)}" if cursor else ""
        return self._html(
            template,
            nav=nav,
            runs=listed.runs,
            filters=filters,
            fixed_type=type_,
            statuses=STATUSES,
            next_url=next_url,
            first_url=first_url,
        )

    def _asked(self, request: web.Request, path: Any, query: Any) -> Asked:
        """A page's read as the /v1 handlers see a request: with the token's grant, so
        the checks of http_runs.py (a namespace's prefix) apply to pages too."""
        grant = self.guard.grant_of(request) if self.guard is not None else None
        by = self.guard.requester(request, grant) if self.guard is not None else "http"
        return Asked(path, query, None, grant, by)

    async def _describe(self, request: web.Request) -> Any:
        asked = self._asked(request, request.match_info, DescribeString(journal=True))
        return await self.api.describe(asked)

    async def run_page(self, request: web.Request) -> web.Response:
        try:
            run = await self._describe(request)
        except (ApiError, FuseeError) as error:
            return self._error(error, f"run {request.match_info['id']}")
        return self._html("run.html", nav="runs", **self._run_values(run))

    async def run_live(self, request: web.Request) -> web.Response:
        """The part of a run's page that changes: polled while the run has not ended."""
        try:
            run = await self._describe(request)
        except (ApiError, FuseeError) as error:
            return self._error(error, f"run {request.match_info['id']}")
        return self._html("run_live.html", **self._run_values(run))

    @staticmethod
    def _run_values(run: Any) -> dict[str, Any]:
        return {"run": run, "t": timeline(run.journal or []), "live": run.status not in FINAL}

    # -- the server ---------------------------------------------------------------------

    async def _invocations(self, request: web.Request) -> dict[str, Any]:
        try:
            return await self.api.invocations(self._asked(request, {}, None))
        except (ApiError, FuseeError) as error:
            return {"error": str(error), "endpoints": []}

    async def invocations_page(self, request: web.Request) -> web.Response:
        return self._html("invocations.html", nav="invocations", **await self._invocations_values(request))

    async def invocations_live(self, request: web.Request) -> web.Response:
        return self._html("invocations_live.html", **await self._invocations_values(request))

    async def _invocations_values(self, request: web.Request) -> dict[str, Any]:
        state = await self._invocations(request)
        endpoints = state.pop("endpoints", [])
        invoked = [row for row in self.shards()["shards"] if row.get("invocation")]
        return {"endpoints": endpoints, "counts": state, "invoked": invoked, "show": show}

    async def shards_page(self, request: web.Request) -> web.Response:
        view = self.shards()
        return self._html("shards.html", nav="shards", shards=view["shards"], workers=view["workers"])


def server_shards(server: Any) -> ShardsView:
    """A `fusee server`'s lease table and connected workers, read on its event loop."""

    def view() -> dict[str, list[dict[str, Any]]]:
        shards = [
            {
                "shard": lease.index,
                "holder": repr(lease.holder) if lease.holder is not None else "",
                "invocation": (lease.holder.invocation or "") if lease.holder is not None else "",
                "epoch": lease.epoch,
            }
            for lease in server.leases.table
        ]
        workers = [
            {"worker": repr(conn), "held": sorted(conn.held), "standby": not conn.held}
            for conn in server.leases.workers
        ]
        return {"shards": shards, "workers": workers}

    return view


def engine_shards(count: int) -> ShardsView:
    """An engine serving its own API holds every shard itself."""

    def view() -> dict[str, list[dict[str, Any]]]:
        shards = [{"shard": i, "holder": "this engine", "invocation": "", "epoch": 0} for i in range(count)]
        return {"shards": shards, "workers": []}

    return view


__all__ = ["WebUi", "engine_shards", "server_shards"]
