"""Enforcement steps become Slack messages: what happens to the group next, with buttons.

Each enforcement has one alert of its own (``<rule>/enforce/<group>``), published on
``NS.alerts.v1`` like every other alert change, so it reaches Slack through the notifier with
its threading, retries and rate limits: the warning says when the group will be stopped and
how (with *Approve* when approval is manual), the enforcement says until when (with *Lift*),
and the lift or a skip resolves it.
"""

from __future__ import annotations

from typing import Any

STATES = {"warned": "pending", "executed": "firing", "lifted": "resolved",
          "skipped": "resolved", "failed": "resolved"}
"""Warned is an enforcement pending; enforced, firing; anything that ends it, resolved."""


def enforcement_alert(record: dict[str, Any], notify: dict[str, Any] | None = None,
                      approval: str = "auto") -> dict[str, Any] | None:
    """The alert change for an enforcement step, in the rule engine's change shape; ``None``
    for the steps people need not hear of (``planned``, followed at once by ``warned``)."""
    step = str(record.get("step", ""))
    state = STATES.get(step)
    # A step with a serial in its action id (a sweep, a lift that failed and is tried again)
    # happens within an enforcement that goes on: it neither starts nor ends the message.
    within = (str(record.get("action_id", "")).count(":") > 1
              or str(record.get("reason", "")).startswith("sweep:"))
    if state is None or (within and step in ("executed", "failed")):
        return None
    rule, subject = str(record.get("rule", "")), str(record.get("resource_id", ""))
    dry = record.get("mode") == "dry_run"
    return {
        "alert_id": f"{rule}/enforce/{subject}",
        "rule": rule,
        "kind": "budget",
        "severity": "critical" if step == "executed" else "warning",
        "state": state,
        "previous_state": None,
        "group": dict(record.get("group") or {}),
        "since": record.get("at"),
        "at": record["at"],
        "value": record.get("spent") or "0",
        "threshold": record.get("threshold"),
        "line": record.get("line"),
        "lines": [],
        "currency": record.get("currency") or "USD",
        "notify": notify or {},
        "mode": record.get("mode") or "live",
        "reclaim": None,
        "headline": _headline(step, subject, record),
        "summary": _summary(subject, record),
        "next_step": _next_step(step, subject, record, approval, dry),
        "enforce": {"subject": subject,
                    "approve": step == "warned" and approval == "manual" and not dry,
                    "lift": step in ("warned", "executed")},
    }


def _headline(step: str, subject: str, record: dict[str, Any]) -> str:
    words = {"warned": f"{subject} will be stopped at its budget line",
             "executed": f"{subject} is stopped at its budget line",
             "lifted": f"{subject} is no longer stopped",
             "skipped": f"{subject} is not stopped",
             "failed": f"stopping {subject} failed"}
    return words[step]


def _summary(subject: str, record: dict[str, Any]) -> str:
    from decimal import Decimal

    from costline.rules.money import money

    currency = str(record.get("currency") or "USD")
    spent = money(Decimal(str(record.get("spent") or 0)), currency)
    line = str(record.get("line") or "limit")
    if line == "forecast":
        return f"{subject} has spent {spent} this period; the forecast crosses its budget line."
    threshold = money(Decimal(str(record.get("threshold") or 0)), currency)
    return f"{subject} has spent {spent} this period, past its {line} line of {threshold}."


def _next_step(step: str, subject: str, record: dict[str, Any], approval: str,
               dry: bool) -> str:
    reason = str(record.get("reason", ""))
    until = record.get("period_end", "the period's end")
    if step == "warned":
        when = record.get("execute_at", "after the grace")
        text = (f"`{subject}`: {reason.removeprefix('owners warned: ')}. "
                f"*Lift* cancels it for this period.")
        if approval == "manual":
            text += f" It waits for an approver to press *Approve* (not before {when})."
        if dry:
            text += "\n_Dry run: planned and logged, nothing is touched._"
        return text
    if step == "executed":
        return (f"{reason}. Lifted at {until} when the period ends, when the budget line is "
                f"raised above the spend, or by *Lift* (`costline enforce lift`).")
    return reason
