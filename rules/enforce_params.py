"""The ``enforce:`` block of a budget rule: when to enforce, through which connector, how safely.

A connector's own parameters (Slurm's ``action`` and ``account_tag``, the webhook's ``url``)
are defined once, in its file under ``connectors/enforce/``, as a subclass of
``EnforceParams``. The keys below are common to all of them and read by the pure enforcement
flow (``rules/enforce.py``), so they belong to the core. As with ``reclaim:``, the loader is
given the connectors (``rules/plugins.py``), never imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from costline.rules.durations import Duration, PositiveDuration
from costline.rules.globs import glob_match
from costline.rules.plugins import plugins_of
from costline.rules.reclaim_params import Approval
from costline.rules.registry import summary_of

DEFAULT_MAX_PER_HOUR = 5
DEFAULT_GRACE_S = 900
LIMIT = "limit"
FORECAST = "forecast"

Trigger = Literal["limit", "forecast"] | Annotated[
    Decimal, Field(gt=0, lt=1),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})]
"""``limit`` (the budget line), a warning line of ``warn_at`` (``0.8``), or ``forecast``."""


class EnforceParams(BaseModel):
    """The keys every enforcement connector takes besides its own: approval and the cap.

    Unknown keys are refused. Optional keys that are not written stay out of the request's
    parameters, so an alert shows what the rule file says.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval: Approval | None = Field(
        None, description="manual: enforce only after someone presses Approve (default auto)"
    )
    max_per_hour: Annotated[int, Field(ge=1, le=10_000)] | None = Field(
        None,
        description=f"most groups this rule enforces in any hour (default "
        f"{DEFAULT_MAX_PER_HOUR}); a round that would exceed it enforces none",
    )

    @model_serializer(mode="wrap")
    def _written_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class Enforcer(Protocol):
    """What validating a rule file needs of an enforcement connector: its parameters.

    ``connectors.enforce.EnforceConnector`` is one; the rules core never imports it.
    """

    params_model: ClassVar[type[EnforceParams]]


ExemptValues = Annotated[str, Field(min_length=1, max_length=256)] | list[
    Annotated[str, Field(min_length=1, max_length=256)]]


class Enforce(BaseModel):
    """Stop a group's spend once it crosses a line: ``connector``, ``at``, then its own keys.

    ``at`` is the line that triggers it: ``limit`` (the budget line, default), one of the
    rule's warning lines (``0.8``), or ``forecast`` (the projection crosses the budget line
    within ``within``). After ``grace`` the group is checked again and only then enforced;
    the enforcement is lifted when the period ends or the budget line is raised above the
    spend.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    connector: str = Field(description="the enforcement connector that applies it")
    at: Trigger = Field(
        "limit",
        description="the line that triggers it: limit, a warning line of warn_at (e.g. 0.8), "
        "or forecast",
    )
    within: PositiveDuration | None = Field(
        None,
        json_schema_extra={"examples": ["2d"]},
        description="with at: forecast, only when the budget line will be crossed within "
        "this time (default: any time this period)",
    )
    grace: Duration = Field(
        DEFAULT_GRACE_S,
        json_schema_extra={"default": "15m"},
        description="how long to wait after the warning, then check again, before enforcing",
    )
    exempt: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")], ExemptValues] = (
        Field(default_factory=dict,
              description="group tag → value or list of values (globs allowed) never enforced"))
    _params: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("connector")
    @classmethod
    def _known(cls, name: str, info: ValidationInfo) -> str:
        enforcers = plugins_of(info).enforcers
        if name not in enforcers:
            known = ", ".join(sorted(enforcers)) or "none"
            raise PydanticCustomError(
                "unknown_connector",
                "unknown enforcement connector {name} (known: {known})",
                {"name": repr(name), "known": known},
            )
        return name

    @model_validator(mode="after")
    def _params_fit_connector(self, info: ValidationInfo) -> Enforce:
        if self.within is not None and self.at != FORECAST:
            raise PydanticCustomError("enforce", "within applies to at: forecast only")
        connector = plugins_of(info).enforcers[self.connector]
        params = connector.params_model.model_validate(self.model_extra or {})
        self._params = params.model_dump(mode="json")
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The connector's parameters, defaults filled in (as validated when loaded)."""
        return dict(self._params)

    def is_exempt(self, group: Mapping[str, str]) -> bool:
        """Whether an opt-out tag value keeps this group from ever being enforced."""
        return any(
            any(glob_match(group.get(key, ""), v) for v in ([values] if isinstance(
                values, str) else values))
            for key, values in self.exempt.items() if key in group
        )


def enforce_json_schema(enforcers: Mapping[str, type[Enforcer]]) -> dict[str, Any]:
    """One alternative per connector, each closed to unknown keys."""
    return {"oneOf": [_connector_schema(n, c.params_model)
                      for n, c in sorted(enforcers.items())]}


COMMON_KEYS = ("connector", "at", "within", "grace", "exempt")


def _connector_schema(name: str, params: type[EnforceParams]) -> dict[str, Any]:
    schema = params.model_json_schema()
    own = Enforce.model_json_schema()
    common = {key: own["properties"][key] for key in COMMON_KEYS}
    common["connector"] = {"const": name, "description": common["connector"]["description"]}
    found: dict[str, Any] = {
        "type": "object",
        "title": f"enforce via {name}",
        "description": summary_of(params),
        "properties": {**common, **schema.get("properties", {})},
        "required": ["connector", *schema.get("required", [])],
        "additionalProperties": False,
    }
    if "$defs" in schema:
        found["$defs"] = schema["$defs"]
    return found
