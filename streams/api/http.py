"""What every route of the API shares: the bearer token, the query string, the JSON answers,
and the errors a client is told about instead of a 500.

A handler is an aiohttp handler (``request → response``): the worker mounts it as a Faust page,
``costline serve`` on a plain aiohttp application, so both answer alike. ``guarded`` wraps it:

* with a token configured (``COSTLINE_API_TOKEN``), a request without ``Authorization: Bearer
  <the token>`` answers 401; the comparison takes the same time wherever the two differ, and
  the token is never logged or echoed;
* a question the client asked wrong (an unknown parameter, a bad value) answers 400 with a
  JSON ``{"error": ...}`` naming the parameter;
* Redis or Kafka not answering is 503, also as JSON; anything else is logged and is a 500
  with no detail.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import typer
from aiohttp import web

from costline.connectors.kafka import KafkaUnavailable
from costline.connectors.redis_client import FAILURES

log = logging.getLogger("costline.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
MAX_VALUE_CHARS = 4096


class ApiError(Exception):
    """A request the API refuses: its status and a sentence for the client."""

    def __init__(self, status: int, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.parameter = status, message, parameter


def json_answer(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=(json.dumps(document, indent=2) + "\n").encode(), status=status,
                        content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def error_answer(status: int, message: str, parameter: str | None = None,
                 headers: Mapping[str, str] | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message, "status": status}
    if parameter is not None:
        body["parameter"] = parameter
    answer = json_answer(body, status)
    answer.headers.update(headers or {})
    return answer


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries the bearer token: compared in constant
    time (``hmac.compare_digest``), as bytes so any header can be compared."""
    scheme, _, given = (header or "").partition(" ")
    expected = token.encode()
    candidate = given.strip().encode("utf-8", "surrogateescape")
    matches = hmac.compare_digest(candidate, expected)
    return scheme.lower() == "bearer" and matches


def guarded(handler: Handler, token: str | None) -> Handler:
    """``handler`` behind the bearer token (when one is set) and the error answers."""

    async def run(request: web.Request) -> web.StreamResponse:
        if token and not authorized(request.headers.get("Authorization"), token):
            return error_answer(401, "a bearer token is required (Authorization: Bearer "
                                "<COSTLINE_API_TOKEN>)", headers={"WWW-Authenticate": "Bearer"})
        try:
            return await handler(request)
        except ApiError as exc:
            return error_answer(exc.status, exc.message, exc.parameter)
        except typer.BadParameter as exc:
            parameter = _parameter(exc.param_hint)
            return error_answer(400, f"{parameter}: {exc.message}" if parameter else
                                exc.message, parameter)
        except FAILURES as exc:
            log.warning("API %s: Redis failed: %s", request.path, type(exc).__name__)
            return error_answer(503, "Redis did not answer")
        except (KafkaUnavailable, TimeoutError) as exc:
            log.warning("API %s: Kafka failed: %s", request.path, exc)
            return error_answer(503, "Kafka did not answer in time")
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a failure of ours is logged, never shown
            log.exception("API %s failed", request.path)
            return error_answer(500, "internal error (logged by the server)")

    return run


def _parameter(hint: Any) -> str | None:
    """``--at`` → ``at``, ``--tz`` → ``tz``: the query parameter a CLI option is."""
    if hint is None:
        return None
    first = hint[0] if isinstance(hint, list | tuple) and hint else hint
    return str(first).lstrip("-").split("/")[0] or None


class Query:
    """A request's query string, read strictly: an unknown parameter, a repeated one that
    takes one value, or a value of the wrong form is a 400, never a default."""

    def __init__(self, request: web.Request, known: Collection[str]) -> None:
        self.values = request.rel_url.query
        for name in self.values:
            if name not in known:
                raise ApiError(400, f"unknown parameter {name!r} (known: "
                               f"{', '.join(sorted(known)) or 'none'})", name)
        for name, value in self.values.items():
            if len(value) > MAX_VALUE_CHARS:
                raise ApiError(400, f"{name}: longer than {MAX_VALUE_CHARS} characters", name)

    def one(self, name: str) -> str | None:
        found = self.values.getall(name, [])
        if len(found) > 1:
            raise ApiError(400, f"{name}: given {len(found)} times, takes one value", name)
        return found[0] if found else None

    def many(self, name: str) -> list[str]:
        return list(self.values.getall(name, []))

    def flag(self, name: str) -> bool:
        value = self.one(name)
        if value is None or value.lower() in TRUE or value == "":
            return value is not None
        if value.lower() in FALSE:
            return False
        raise ApiError(400, f"{name}: {value!r} is not true or false", name)

    def number(self, name: str, default: int, least: int, most: int) -> int:
        value = self.one(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ApiError(400, f"{name}: {value!r} is not a whole number", name) from None
        if not least <= number <= most:
            raise ApiError(400, f"{name}: {number} is not between {least} and {most}", name)
        return number
