"""The OpenAPI 3 document of ``/api/v1``, served at ``/api/v1/openapi.json``.

The spend route's parameters come from ``costline.streams.api.spend`` (the signature the
command line shares), so the document lists what the route takes.
"""

from __future__ import annotations

from typing import Any

from costline.connectors.alert_store import RESOLVED_KEPT
from costline.connectors.reclaim_ledger import LOG_MAX
from costline.streams.api import spend
from costline.streams.api.budgets import STATES
from costline.streams.cli.dead_letters_cmd import LIST_MOST

MONEY = {"type": "string", "pattern": r"^-?[0-9]+\.[0-9]{6}$",
         "description": "an amount of the currency, exact, six decimals"}
TIME = {"type": "string", "format": "date-time"}
SPEND_HELP = {
    "by": "tag keys (and category, resource_type, billing, fault) to group by, "
          "comma-separated",
    "where": "KEY=VALUE filter, a * glob allowed; repeatable: different keys must all match, "
             "a key given again matches any of its values",
    "period": "day, week or month",
    "at": "a moment inside the period: RFC 3339, Unix seconds, now, today, yesterday, -2h, "
          "-7d; default now",
    "tz": "IANA time zone of the period; default COSTLINE_TIMEZONE",
    "peaks": "also each group's peak hourly spend (peak_hourly)",
}
_AT = {"name": "at", "in": "query", "schema": {"type": "string"},
       "description": SPEND_HELP["at"]}
_PERIOD = {"name": "period", "in": "query",
           "schema": {"type": "string", "enum": ["day", "week", "month"], "default": "month"}}
_TZ = {"name": "tz", "in": "query", "schema": {"type": "string"}, "description": SPEND_HELP["tz"]}


def _limit(name: str, default: int, most: int, what: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": what,
            "schema": {"type": "integer", "minimum": 0 if name == "resolved" else 1,
                       "maximum": most, "default": default}}


def _spend_parameters() -> list[dict[str, Any]]:
    out = []
    for parameter in spend.parameters():
        schema: dict[str, Any] = {"type": "string"}
        if parameter.form == "flag":
            schema = {"type": "boolean", "default": parameter.default}
        elif parameter.form == "many":
            schema = {"type": "array", "items": {"type": "string"}}
        elif parameter.default is not None:
            schema["default"] = parameter.default
        out.append({"name": parameter.name, "in": "query", "schema": schema,
                    "explode": True, "description": SPEND_HELP.get(parameter.name, "")})
    return out


def _get(summary: str, parameters: list[dict[str, Any]], schema: dict[str, Any]
         ) -> dict[str, Any]:
    return {"get": {
        "summary": summary, "parameters": parameters,
        "responses": {
            "200": {"description": "the answer",
                    "content": {"application/json": {"schema": schema}}},
            "400": {"$ref": "#/components/responses/BadRequest"},
            "401": {"$ref": "#/components/responses/Unauthorized"},
            "503": {"$ref": "#/components/responses/Unavailable"},
        }}}


def _object(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **extra}


SPEND = _object({
    "currency": {"type": "string"},
    "period": _object({"start": TIME, "end": TIME}),
    "rows": {"type": "array", "items": _object({
        "group": {"type": "object", "additionalProperties": {"type": "string"}},
        "cost": MONEY, "waste": MONEY, "peak_hourly": MONEY})},
}, description="what `costline spend --json` prints for the same arguments")
BUDGET = _object({
    "rule": {"type": "string"},
    "group": {"type": "object", "additionalProperties": {"type": "string"}},
    "period": _object({"kind": {"type": "string"}, "timezone": {"type": "string"},
                       "start": TIME, "end": TIME}),
    "spent": MONEY, "limit": MONEY,
    "lines": {"type": "array", "items": _object({"name": {"type": "string"}, "amount": MONEY})},
    "line": {"type": ["string", "null"], "description": "the highest line reached"},
    "forecast": {"type": ["object", "null"], "properties": {
        "at": TIME, "spent": MONEY, "crosses_at": {"type": ["string", "null"]}}},
    "state": {"type": "string", "enum": list(STATES)},
    "alert": {"type": ["object", "null"]},
    "points": {"type": "array", "items": {"type": "array"},
               "description": "[time, spent so far] at the end of every hour (points=true)"},
})


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "costline", "version": "1",
                 "description": "Spend, budgets, alerts, reclamation and refused input of one "
                                "namespace. Money is exact: decimal strings with six places. "
                                "With COSTLINE_API_TOKEN set, every route needs "
                                "`Authorization: Bearer <token>`."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _object({"error": {"type": "string"},
                                          "status": {"type": "integer"},
                                          "parameter": {"type": "string"}})},
            "responses": {
                name: {"description": text, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Error"}}}}
                for name, text in (("BadRequest", "a parameter is unknown or has a bad value"),
                                   ("Unauthorized", "no bearer token, or the wrong one"),
                                   ("Unavailable", "Redis or Kafka did not answer"))},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/spend": _get("Spend and waste per group for a calendar period",
                                  _spend_parameters(), SPEND),
            "/api/v1/budgets": _get(
                "Each budget rule × group: spent, limit, warning lines, forecast, state",
                [_AT, {"name": "points", "in": "query", "schema": {"type": "boolean"},
                       "description": "add each group's spend at the end of every hour"}],
                _object({"currency": {"type": "string"}, "at": TIME,
                         "budgets": {"type": "array", "items": BUDGET}})),
            "/api/v1/alerts": _get(
                "Alerts pending or firing (with what mutes them), silences, resolved alerts",
                [_limit("resolved", 100, RESOLVED_KEPT, "how many resolved alerts")],
                _object({"alerts": {"type": "array"}, "silences": {"type": "array"},
                         "resolved": {"type": "array"}})),
            "/api/v1/actions": _get(
                "The latest reclamation steps, newest first (costline actions --json)",
                [_limit("limit", 50, LOG_MAX, "how many steps")], {"type": "array"}),
            "/api/v1/dead-letters": _get(
                "Refused input messages, newest first (costline dead-letters list --json)",
                [{"name": "reason", "in": "query", "schema": {"type": "string"}},
                 {"name": "since", "in": "query", "schema": {"type": "string"}},
                 _limit("limit", 100, LIST_MOST, "how many")], {"type": "array"}),
            "/api/v1/refused": _get(
                "Input refused in a period by reason, its money at today's prices",
                [_PERIOD, _AT, _TZ],
                _object({"currency": {"type": "string"},
                         "period": _object({"start": TIME, "end": TIME}),
                         "reasons": {"type": "array", "items": _object({
                             "code": {"type": "string"}, "messages": {"type": "integer"},
                             "events": {"type": "integer"}, "amount": MONEY,
                             "unpriced": {"type": "array"}})}})),
            "/api/v1/openapi.json": _get("This document", [], {"type": "object"}),
        },
    }
