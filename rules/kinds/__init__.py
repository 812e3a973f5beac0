"""Rule kinds: one decorated class per file, registered in ``KINDS`` by its ``kind:`` name.

Adding a kind is one file in this folder: a pydantic model with the keys every rule has
(``Rule``) plus its own, each with a description; a docstring with a YAML example (tests
validate every example); ``presentation``, how its alerts read; and ``evaluate`` — a pure
function of the rule, a ``StateView`` and the time. ``KINDS.discover`` imports every module
here, and the loader, the JSON Schema, Slack rendering and the reference docs all walk
``KINDS``, so nothing else is edited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from costline.rules.durations import Duration, PositiveDuration
from costline.rules.findings import Finding
from costline.rules.notify import Notify
from costline.rules.registry import Registry, summary_of
from costline.rules.state import StateView

RULE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
RuleName = Annotated[str, Field(pattern=RULE_NAME_PATTERN, max_length=128)]
DimensionKey = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
Glob = Annotated[str, Field(min_length=1, max_length=256)]
Severity = Literal["info", "warning", "critical"]
Mode = Literal["live", "dry_run"]

DEFAULT_REALERT_S = 4 * 3600


def listed(what: str) -> BeforeValidator:
    """A key that takes a list: anything else is refused with ``what`` a list of is expected
    (``warn_at: 0.5`` reads "a list of fractions, e.g. [0.5, 0.8]", not "a valid tuple")."""

    def check(value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise PydanticCustomError("list_expected", "Input should be a list of {what}",
                                      {"what": what})
        return value

    return BeforeValidator(check)


GroupBy = Annotated[tuple[DimensionKey, ...], listed("tag keys, e.g. [team, project]")]


def configured_zone(value: Any, info: ValidationInfo) -> Any:
    """A missing ``timezone`` means the configured ``COSTLINE_TIMEZONE`` (loader context)."""
    if value is None:
        context = info.context if isinstance(info.context, dict) else {}
        return context.get("timezone", "UTC")
    return value


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


ZONE_FIELD: Any = Field(
    default=None,
    validate_default=True,
    json_schema_extra=_no_default,
    description="IANA time zone of the calendar; default COSTLINE_TIMEZONE",
)


@dataclass(frozen=True)
class Presentation:
    """How a kind's alerts read: what Slack rendering takes from the registered kind.

    ``crossed`` and ``back`` are the headline of a firing and of a resolved alert, with
    ``{value}`` the figure and ``{line}`` the name of the line it is measured against.
    """

    unit: str = "currency"
    """What the figures measure unless a rule says otherwise (``Rule.value_unit``):
    ``currency``, ``currency_per_hour``, ``fraction`` or a price book unit."""
    crossed: str = "{value} crossed {line}"
    back: str = "{value}, back within {line}"
    bar: bool = False
    """Whether the figure fills up toward the budget line over a period (drawn as a bar)."""
    spend: bool = False
    """Whether the figure is spend, so the waste reported beside it reads as a share of it."""


def _describe_kind(schema: dict[str, Any], model: type[Any]) -> None:
    """A kind's ``kind`` key is described by the kind's own summary (its docstring)."""
    key = schema.get("properties", {}).get("kind")
    if isinstance(key, dict) and "const" in key:
        key.setdefault("description", f"{key['const']}: {summary_of(model)}")


class Rule(BaseModel):
    """The keys every rule has (README, Rule cookbook); each kind adds its own."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_describe_kind)

    presentation: ClassVar[Presentation] = Presentation()
    """How this kind's alerts read (Slack)."""

    inhibited_by_faults: ClassVar[bool] = False
    """Whether a fault on a job mutes this kind's alerts about that job while it recovers."""

    data_driven: ClassVar[bool] = True
    """Whether counted spend, usage or waste moves this kind's findings. The worker evaluates
    such kinds as soon as data arrives; the others only on its periodic tick."""

    name: RuleName = Field(
        description="unique across all rule files: lower-case letters, digits and dashes"
    )
    kind: str = Field(description="what the rule watches; decides the keys below")
    match: dict[DimensionKey, Glob] = Field(
        default_factory=dict,
        description="tag → value the data must carry (a * glob allowed, any other character is "
        "itself: \\* is a star of the value); also the "
        "pseudo-tags category and resource_type",
    )
    group_by: GroupBy = Field(
        (), description="tag keys: the rule is evaluated per distinct combination of them"
    )
    for_: Duration = Field(
        0,
        alias="for",
        json_schema_extra={"default": "0s"},
        description="how long the condition must hold before the alert fires",
    )
    realert: PositiveDuration = Field(
        DEFAULT_REALERT_S,
        json_schema_extra={"default": "4h"},
        description="least time between two notifications of the same firing alert",
    )
    severity: Severity = Field("warning", description="info, warning or critical")
    notify: Notify | None = Field(
        None, description="where alerts go: one or more notifiers (slack, email, pagerduty, "
        "alertmanager, webhook); without it, Slack's fallback channel"
    )
    mode: Mode = Field(
        "live",
        description="live, or dry_run: reclaim actions are planned and logged, never executed",
    )

    @field_validator("group_by")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({key for key in value if value.count(key) > 1})
        if repeated:
            raise PydanticCustomError(
                "group_by", "group_by repeats {keys}", {"keys": ", ".join(repeated)}
            )
        return value

    @property
    def pending_for(self) -> int:
        """Seconds a finding must persist before its alert fires."""
        return self.for_

    def value_unit(self, units: Mapping[str, str]) -> str:
        """What a finding's value measures, for renderers; ``units`` maps resource types to
        their price book unit."""
        return self.presentation.unit

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        """The groups over one of this rule's lines at ``now``."""
        raise NotImplementedError

    def summarize(self, finding: Finding, currency: str) -> str:
        """One plain sentence about a finding, for people."""
        raise NotImplementedError


KINDS: Registry[Rule] = Registry("kind", Rule)
kind = KINDS.register
"""Class decorator: ``@kind("budget")`` registers a rule kind under its ``kind:`` value."""

KINDS.discover(__name__, __path__)
