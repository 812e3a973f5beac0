"""The routes of the API and the dashboard, as aiohttp handlers: the worker mounts them as
Faust pages (``costline.streams.worker.api_pages``), ``costline serve`` on an aiohttp
application (``application``).

The dashboard is a page holding no data, its script, its style and its icon. The script
asks the API for everything it shows, with the bearer token when one is needed (typed once,
kept in the tab's session storage), so the page itself needs none. Nothing is fetched from
anywhere else: the Content-Security-Policy allows this origin only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from costline.connectors.alert_store import RESOLVED_KEPT
from costline.connectors.reclaim_ledger import LOG_MAX
from costline.streams.api import openapi, spend
from costline.streams.api.answers import OpenData
from costline.streams.api.http import Handler, Query, guarded, json_answer
from costline.streams.cli.dead_letters_cmd import LIST_MOST

DASHBOARD = Path(__file__).parent / "dashboard"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
ASSETS = {"/": ("index.html", "text/html"), "/dashboard.js": ("dashboard.js", "text/javascript"),
          "/dashboard.css": ("dashboard.css", "text/css"),
          "/favicon.svg": ("favicon.svg", "image/svg+xml")}


@dataclass(frozen=True)
class Route:
    path: str
    name: str
    handler: Handler


def api_handlers(data: OpenData) -> dict[str, Handler]:
    """``/api/v1/<name>`` → its handler, before the token and the error answers."""

    async def spend_route(request: web.Request) -> web.StreamResponse:
        options = spend.options(Query(request, spend.known()))
        return json_answer(await asyncio.to_thread(data.spend, options))

    async def alerts(request: web.Request) -> web.StreamResponse:
        query = Query(request, ["resolved"])
        resolved = query.number("resolved", 100, 0, RESOLVED_KEPT)
        return json_answer(await asyncio.to_thread(data.alerts, resolved))

    async def budgets(request: web.Request) -> web.StreamResponse:
        query = Query(request, ["at", "points"])
        at, points = query.one("at"), query.flag("points")
        return json_answer(await asyncio.to_thread(data.budgets, at, points))

    async def actions(request: web.Request) -> web.StreamResponse:
        limit = Query(request, ["limit"]).number("limit", 50, 1, LOG_MAX)
        return json_answer(await data.actions(limit))

    async def dead_letters(request: web.Request) -> web.StreamResponse:
        query = Query(request, ["reason", "since", "limit"])
        reason, since = query.one("reason"), query.one("since")
        limit = query.number("limit", 100, 1, LIST_MOST)
        return json_answer(await asyncio.to_thread(data.dead_letters, reason, since, limit))

    async def refused(request: web.Request) -> web.StreamResponse:
        query = Query(request, ["period", "at", "tz"])
        period, at, tz = query.one("period") or "month", query.one("at"), query.one("tz")
        return json_answer(await asyncio.to_thread(data.refused, period, at, tz))

    async def document(request: web.Request) -> web.StreamResponse:
        Query(request, [])
        return json_answer(openapi.document())

    return {"spend": spend_route, "alerts": alerts, "budgets": budgets, "actions": actions,
            "dead-letters": dead_letters, "refused": refused, "openapi.json": document}


def asset(path: str, token_required: bool = False) -> Handler:
    """A dashboard file, read once, with the Content-Security-Policy. The page says whether
    the API needs a token (never the token), so the script asks for it before any request
    instead of collecting refusals."""
    name, content_type = ASSETS[path]
    body = (DASHBOARD / name).read_bytes()
    if token_required:
        body = body.replace(b'<body data-token="">', b'<body data-token="required">')

    async def serve(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers={
            "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"})

    return serve


def routes(data: OpenData, token: str | None) -> list[Route]:
    """Every route: the API's behind the token, the dashboard's files open."""
    found = [Route(f"/api/v1/{name}", f"api_{name.replace('-', '_').replace('.', '_')}",
                   guarded(handler, token))
             for name, handler in api_handlers(data).items()]
    found += [Route(path, f"dashboard_{name.replace('.', '_')}",
                    guarded(asset(path, bool(token)), None))
              for path, (name, _) in ASSETS.items()]
    return found


def application(data: OpenData, token: str | None,
                extra: Callable[[web.Application], object] | None = None) -> web.Application:
    """An aiohttp application serving every route (``costline serve``)."""
    app = web.Application()
    for route in routes(data, token):
        app.router.add_get(route.path, route.handler, name=route.name)
    if extra is not None:
        extra(app)
    return app
