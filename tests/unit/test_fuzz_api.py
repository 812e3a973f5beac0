"""Fuzzing the API's query strings: whatever a client asks, every route answers 200 or a 4xx
with a JSON error, never a 500; the token is checked before anything is read; the OpenAPI
document lists every route and the spend route's parameters.

The routes run against the in-memory store and a stand-in Redis holding nothing, each
request on an event loop of its own, so hypothesis drives them synchronously.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from costline.rules.loader import RuleSet
from costline.streams.api import spend
from costline.streams.api.answers import OpenData
from costline.streams.api.openapi import document
from costline.streams.api.routes import routes
from costline.streams.cli.root import moment
from costline.streams.settings import Settings
from tests.unit.test_spend_where import PRICES, State, state  # noqa: F401 - the fixture

TOKEN = "fuzz-token-0c7e"  # noqa: S105 - a test's own
FUZZ = settings(deadline=None, max_examples=150,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
PATHS = ["spend", "budgets", "alerts", "actions", "dead-letters", "refused", "openapi.json"]
KNOWN = ["by", "where", "period", "at", "tz", "peaks", "basis", "points", "resolved", "limit",
         "reason", "since"]
VALUES = ["", "team", "team,category", "Team", "env=prod", "team=a*", "=x", "day", "week",
          "month", "year", "now", "yesterday", "-2h", "-7d", "2026-11-30T08:00:00Z",
          "1796025600", "99999999999999999999", "-1e300", "nan", "UTC", "Europe/Berlin",
          "Mars/Olympus", "true", "false", "maybe", "0", "1", "100", "1001", "-5", "1e3",
          "\x00", "\udcff", "é", "../../etc", "%", "a" * 5000]


class Pipeline:
    def __init__(self) -> None:
        self.calls = 0

    def hgetall(self, key: str) -> None:
        self.calls += 1

    def get(self, key: str) -> None:
        self.calls += 1

    def execute(self) -> list[Any]:
        return [{}] * self.calls


class Nothing:
    """A Redis holding nothing (sync and async alike, as far as the routes ask)."""

    def register_script(self, script: str) -> Any:
        return lambda keys, args: b""

    def pipeline(self, transaction: bool = False) -> Pipeline:
        return Pipeline()

    def get(self, key: str) -> None:
        return None

    def hget(self, key: str, field: str) -> None:
        return None

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        return {}

    def lrange(self, key: str, start: int, end: int) -> list[bytes]:
        return []


class AsyncNothing:
    def register_script(self, script: str) -> Any:
        return None

    async def lrange(self, key: str, start: int, end: int) -> list[bytes]:
        return []


class Data(OpenData):
    def dead_letters(self, reason: str | None, since: str | None, limit: int
                     ) -> list[dict[str, Any]]:
        if since:
            moment(since, 0.0, "UTC")
        return []


def opened(memory: Any, token: str | None = None) -> dict[str, Any]:
    memory.redis = Nothing()
    settings_ = Settings(prices=PRICES)
    data = Data(settings_, Nothing(), AsyncNothing(), lambda: RuleSet((), ()))  # type: ignore[arg-type]
    data.state = memory
    return {route.path: route.handler for route in routes(data, token)}


def ask(handlers: dict[str, Any], path: str, query: str = "", headers: Any = None
        ) -> tuple[int, Any]:
    request = make_mocked_request("GET", path + (f"?{query}" if query else ""),
                                  headers=headers or {})
    answer = asyncio.run(handlers[path](request))
    return answer.status, answer.body


def decoded(status: int, body: Any) -> dict[str, Any] | list[Any]:
    found = json.loads(body)
    if status != 200:
        assert isinstance(found, dict) and found["error"] and found["status"] == status
    return found  # type: ignore[no-any-return]


pairs = st.lists(st.tuples(st.sampled_from(KNOWN) | st.text(max_size=8),
                           st.sampled_from(VALUES) | st.text(max_size=30)), max_size=5)


@FUZZ
@given(path=st.sampled_from(PATHS), query=pairs)
@example(path="spend", query=[("at", "99999999999999999999")])
@example(path="refused", query=[("period", "decade")])
@example(path="alerts", query=[("resolved", "1e9")])
def test_no_query_string_gets_a_500(state: State, path: str,  # noqa: F811
                                    query: list[tuple[str, str]]) -> None:
    handlers = opened(state)
    encoded = urlencode(query, safe="", errors="surrogateescape")
    status, body = ask(handlers, f"/api/v1/{path}", encoded)
    assert status in (200, 400), (path, query, body)
    decoded(status, body)


@FUZZ
@given(path=st.sampled_from(PATHS), raw=st.binary(max_size=60))
def test_no_raw_query_bytes_get_a_500(state: State, path: str, raw: bytes) -> None:  # noqa: F811
    status, body = ask(opened(state), f"/api/v1/{path}", quote(raw, safe="=&%"))
    assert status in (200, 400), (path, raw, body)
    decoded(status, body)


def test_the_token_is_checked_before_anything_is_read(state: State) -> None:  # noqa: F811
    handlers = opened(state, TOKEN)
    for header in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN},
                   {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"}):
        status, body = ask(handlers, "/api/v1/spend", "by=team", header)
        assert status == 401
        assert TOKEN not in body.decode()
    status, body = ask(handlers, "/api/v1/spend", "by=team&at=2026-11-30T08:00:00Z",
                       {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and decoded(status, body)["rows"]  # type: ignore[call-overload]
    status, _ = ask(handlers, "/")
    assert status == 200  # the page holds no data


def test_the_spend_route_answers_as_the_command_s_function(state: State) -> None:  # noqa: F811
    status, body = ask(opened(state), "/api/v1/spend",
                       "by=team&where=env%3Dprod&period=day&at=2026-11-30T08:00:00Z&tz=UTC")
    rows = decoded(status, body)["rows"]  # type: ignore[call-overload]
    assert [(row["group"]["team"], row["cost"]) for row in rows] == [
        ("", "80.000000"), ("c", "40.000000"), ("b", "20.000000"), ("ab", "5.000000"),
        ("a", "2.500000")]


def test_the_openapi_document_lists_every_route_and_spend_parameter(state: State  # noqa: F811
                                                                    ) -> None:
    paths = document()["paths"]
    api_routes = [path for path in opened(state) if path.startswith("/api/v1/")]
    assert sorted(paths) == sorted(api_routes)
    names = [p["name"] for p in paths["/api/v1/spend"]["get"]["parameters"]]
    assert names == spend.known() == ["by", "where", "period", "at", "tz", "peaks",
                                         "basis", "per"]
