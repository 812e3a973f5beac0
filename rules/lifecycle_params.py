"""The keys of ``act:`` that every checkpoint connector takes, and what a rule file needs of one.

A connector's own parameters (the filesystem's ``root``, the webhook's ``url``) are defined in
its file under ``connectors/checkpoints/``, as a subclass of ``CheckpointParams``. The safety
keys below are common to all of them and read by the pure lifecycle flow
(``costline.rules.lifecycle``), so they belong to the core, as reclamation's do
(``costline.rules.reclaim_params``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from costline.rules.reclaim_params import Approval

DEFAULT_MAX_PER_HOUR = 50
DEFAULT_MAX_PERCENT = 100.0


class CheckpointParams(BaseModel):
    """The keys every checkpoint connector takes besides its own: approval and caps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval: Approval | None = Field(
        None, description="manual: act only after someone approves (default auto)"
    )
    max_per_hour: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        None, description=f"most actions by this rule in any hour (default "
                          f"{DEFAULT_MAX_PER_HOUR})",
    )
    max_percent: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] | None = Field(
        None, description="most actions in one round, as a percentage of the live checkpoints "
                          f"the rule matches (default {DEFAULT_MAX_PERCENT:g})",
    )

    @model_serializer(mode="wrap")
    def _written_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class CheckpointActor(Protocol):
    """What validating a rule file needs of a checkpoint connector: its parameter model.

    ``connectors.checkpoints.CheckpointConnector`` is one; the rules core never imports it."""

    params_model: ClassVar[type[CheckpointParams]]
