"""``notify:`` — where a rule's alerts go: one or more notifiers, each with its own keys.

The notifiers, and so which keys each takes, are the ones the loader was given
(``rules/plugins.py``); the JSON Schema lists them the same way (``notify_json_schema``).
Routing by tag is common to all of them: ``route_by_tag`` names a tag, and each notifier maps
that tag's value to a destination of its own (``by_tag``), or takes a value that already names
one (``#team-x``, ``alice@example.com``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from costline.rules.events import TagKey
from costline.rules.notify_params import Notifier, NotifierParams
from costline.rules.plugins import plugins_of
from costline.rules.registry import summary_of

Channel = Annotated[str, Field(pattern=r"^[#@]?[A-Za-z0-9._-]{1,80}$")]
"""A Slack channel (``#name``), user (``@name``) or id."""

SLACK = "slack"
"""The notifier that ``channels`` maps for, and that ``route_by_tag`` alone means."""


class Notify(BaseModel):
    """Where alerts go: any of the notifiers below, each under its own key, and the tag that
    routes them.

    ``{slack: "#ml-budgets", email: [finops@example.com]}`` sends every alert to both.
    With ``route_by_tag: owner``, an alert for ``owner=alice`` goes where each notifier maps
    ``alice`` (Slack: ``channels``); a tag value that is itself a destination (``#team-x``,
    ``@alice``, ``alice@example.com``) needs no entry. ``route_by_tag`` alone routes through
    Slack.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    route_by_tag: TagKey | None = Field(
        None,
        description="tag whose value picks each notifier's destination: through its by_tag "
        "map (Slack's is channels), or a value that is itself a destination",
    )
    channels: dict[Annotated[str, Field(min_length=1)], Channel] = Field(
        default_factory=dict,
        description="tag value → Slack channel, for route_by_tag (the same as slack's by_tag)",
    )
    _notifiers: dict[str, NotifierParams] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _notifiers_fit(self, info: ValidationInfo) -> Notify:
        registry = plugins_of(info).notifiers
        written = dict(self.model_extra or {})
        if self.channels and self.route_by_tag is None:
            raise PydanticCustomError("notify", "channels map values of route_by_tag; set it")
        if not written and self.route_by_tag is None:
            known = ", ".join(sorted(registry)) or "none"
            raise PydanticCustomError(
                "notify", "notify needs a notifier ({known}) or route_by_tag", {"known": known})
        if self.channels or not written:
            written[SLACK] = _with_channels(registry, written.get(SLACK), self.channels)
        self._notifiers = _validated(registry, written)
        return self

    @property
    def notifiers(self) -> dict[str, NotifierParams]:
        """Each notifier the alerts go to, with its validated parameters."""
        return dict(self._notifiers)

    def published(self, labels: Mapping[str, str]) -> dict[str, Any]:
        """What an alert with these tags carries as ``notify``: each notifier's parameters
        as they apply to it."""
        tag = self.route_by_tag
        value = labels.get(tag) if tag is not None else None
        found: dict[str, Any] = {}
        for name, params in sorted(self._notifiers.items()):
            found.update(params.published(name, tag, value))
        return found


def _with_channels(registry: Mapping[str, type[Notifier]], slack: Any,
                   channels: Mapping[str, str]) -> Any:
    """Slack's keys with ``channels`` as its ``by_tag``; None when Slack is not registered
    (``_validated`` then names it unknown)."""
    if SLACK not in registry:
        return slack
    model = registry[SLACK].params_model
    keys = dict(slack) if isinstance(slack, Mapping) else (
        {} if slack is None else {model.shorthand or "": slack})
    if channels:
        if "by_tag" in keys:
            raise PydanticCustomError(
                "notify", "write Slack's map once: channels, or slack's by_tag")
        keys["by_tag"] = dict(channels)
    return keys


def _validated(registry: Mapping[str, type[Notifier]], written: Mapping[str, Any]
               ) -> dict[str, NotifierParams]:
    """Every written notifier's parameters, or one error naming every problem where it is."""
    found: dict[str, NotifierParams] = {}
    problems: list[InitErrorDetails] = []
    for name, value in written.items():
        if name not in registry:
            known = ", ".join(sorted(registry)) or "none"
            problems.append(_problem((name,), value, "unknown_notifier",
                                     f"unknown notifier {name!r} (known: {known})"))
            continue
        model = registry[name].params_model
        try:
            found[name] = model.model_validate(value)
        except ValidationError as exc:
            short = model.shorthand is not None and not isinstance(value, Mapping)
            for error in exc.errors(include_url=False):
                loc = error["loc"][1:] if short and error["loc"][:1] == (model.shorthand,) \
                    else error["loc"]
                problems.append(_problem((name, *loc), error["input"], error["type"],
                                         error["msg"]))
    if problems:
        raise ValidationError.from_exception_data("Notify", problems)
    return found


def _problem(loc: tuple[int | str, ...], value: Any, kind: str, message: str
             ) -> InitErrorDetails:
    return {"type": PydanticCustomError(kind, "{message}", {"message": message}),
            "loc": loc, "input": value}


def notify_json_schema(notifiers: Mapping[str, type[Notifier]]) -> dict[str, Any]:
    """``notify``'s schema: the common keys, and one key per notifier, closed to others."""
    common = Notify.model_json_schema()
    properties: dict[str, Any] = {
        "route_by_tag": common["properties"]["route_by_tag"],
        "channels": common["properties"]["channels"],
    }
    for name, notifier in sorted(notifiers.items()):
        properties[name] = notifier_json_schema(name, notifier)
    return {
        "type": "object",
        "title": "Notify",
        "description": summary_of(Notify),
        "properties": properties,
        "minProperties": 1,
        "additionalProperties": False,
    }


def notifier_json_schema(name: str, notifier: type[Notifier]) -> dict[str, Any]:
    """One notifier's keys; with a shorthand, also the bare value it stands for."""
    model = notifier.params_model
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    described = f"{name}: {summary_of(notifier)}"
    if model.shorthand is None:
        return {**schema, "description": described}
    short = dict(schema["properties"][model.shorthand])
    short.pop("default", None)
    return {"description": described, "anyOf": [short, schema]}
