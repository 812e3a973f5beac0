"""The keys of ``reclaim:`` that every connector takes, and what a rule file needs of one.

A connector's own parameters (Slurm's ``action``, the webhook's ``url``) are defined once, in
its file under ``connectors/reclaim/``, as a subclass of ``ReclaimParams``. The safety keys
below are common to all of them and read by the pure reclamation flow (``rules/reclaim.py``),
so they belong to the core.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from costline.rules.durations import TimeZoneName

Approval = Literal["auto", "manual"]

DEFAULT_MAX_PER_HOUR = 20
DEFAULT_MAX_PERCENT = 100.0


class ReclaimParams(BaseModel):
    """The keys every connector takes besides its own: approval, caps and the saving's zone.

    Unknown keys are refused. Optional keys that are not written stay out of the request's
    parameters, so an alert shows what the rule file says.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval: Approval | None = Field(
        None, description="manual: act only after someone presses Approve (default auto)"
    )
    max_per_hour: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        None,
        description=f"most releases by this rule in any hour (default {DEFAULT_MAX_PER_HOUR})",
    )
    max_percent: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] | None = Field(
        None,
        description="most releases in any hour, as a percentage of the resources the "
        f"rule matches (default {DEFAULT_MAX_PERCENT:g})",
    )
    timezone: TimeZoneName | None = Field(
        None, description="zone of the business day the saving is counted to (default "
        "COSTLINE_TIMEZONE)"
    )

    @model_serializer(mode="wrap")
    def _written_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class Reclaimer(Protocol):
    """What validating a rule file needs of a reclaim connector: the model of its parameters.

    ``connectors.reclaim.ReclaimConnector`` is one; the rules core never imports it.
    """

    params_model: ClassVar[type[ReclaimParams]]
