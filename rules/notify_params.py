"""What every notifier's parameters share, and what validating a rule file needs of a notifier.

A notifier (Slack, email, PagerDuty, Alertmanager, a webhook) is one file under
``connectors/notify/`` that holds its parameter model, a subclass of ``NotifierParams``, beside
the code that sends. ``rules/`` may not import it, so the loader is given the registry
(``rules/plugins.py``) and checks ``notify: {email: ...}`` against the model found there.

The rule engine publishes, with every alert change, each notifier's parameters as they apply
to that alert (``published``): routing by tag is decided here, in the pure core, so the
notifier reads where an alert goes from the alert itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, model_validator


class NotifierParams(BaseModel):
    """One notifier's keys under ``notify:``. Unknown keys are refused.

    ``shorthand`` names the key a value that is not a mapping stands for, so the common case
    reads short: ``slack: "#ml-budgets"`` is ``slack: {channel: "#ml-budgets"}`` and
    ``email: [finops@example.com]`` is ``email: {to: [finops@example.com]}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    shorthand: ClassVar[str | None] = None

    @model_validator(mode="before")
    @classmethod
    def _expand_shorthand(cls, value: Any) -> Any:
        if cls.shorthand is not None and not isinstance(value, Mapping):
            return {cls.shorthand: value}
        return value

    def published(self, name: str, tag: str | None, value: str | None) -> dict[str, Any]:
        """What an alert change carries for this notifier (under ``notify``): its parameters
        as they apply to an alert whose ``route_by_tag`` tag (``tag``) has ``value`` (None
        when the rule does not route by tag or the alert's group lacks the tag)."""
        return {name: self.model_dump(mode="json", exclude_none=True)}


class Notifier(Protocol):
    """What validating a rule file needs of a notifier: the model of its parameters.

    ``connectors.notify.Notifier`` is one; the rules core never imports it.
    """

    params_model: ClassVar[type[NotifierParams]]


def routed(by_tag: Mapping[str, Any], value: str | None, itself: bool) -> Any | None:
    """The destination ``by_tag`` gives a tag value; else the value itself when it already
    names a destination (``itself``); else None."""
    if value is None:
        return None
    if value in by_tag:
        return by_tag[value]
    return value if itself else None
