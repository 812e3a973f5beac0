"""The API's routes as the worker's Faust pages, through Faust's public web API.

Each route is an aiohttp handler (``costline.streams.api.routes``); Faust's web server is
aiohttp, and a view's ``get`` hands it the request and returns its answer, as
``/slack/actions`` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import faust
import faust.web

from costline.streams.api.routes import Route


def mount(app: faust.App, routes: Iterable[Route]) -> None:
    for route in routes:
        _page(app, route)


def _page(app: faust.App, route: Route) -> None:
    handler = route.handler

    class Page(faust.web.View):
        async def get(self, request: Any) -> Any:
            return await handler(request)

    Page.__name__ = Page.__qualname__ = route.name
    app.page(route.path, name=route.name)(Page)
