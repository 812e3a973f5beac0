"""Checkpoint lifecycle: keep the last and every k-th, move older ones to a cold tier, delete
expired ones — safely, through a connector."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from costline.rules.durations import Duration, PositiveDuration, format_duration
from costline.rules.events import RUN_TAG
from costline.rules.findings import Contributor, Finding, Line, labels_text, money_text
from costline.rules.inventory import CheckpointInventory, by_run, storage_now
from costline.rules.kinds import DimensionKey, Glob, GroupBy, Mode, Presentation, Rule, kind
from costline.rules.lifecycle import LifecycleAction, Retention, plan_run
from costline.rules.lifecycle_params import CheckpointActor, CheckpointParams
from costline.rules.plugins import plugins_of
from costline.rules.registry import summary_of
from costline.rules.state import PSEUDO_TAGS, StateView, matches

LIFECYCLE_LINE = "lifecycle"
DAY_H = 24
TierName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")]


class CheckpointActs(BaseModel):
    """How the lifecycle acts: ``connector``, ``grace``, then the connector's keys.

    An action is planned, announced, waits ``grace``, and is re-checked against the inventory
    (still not the latest, not pinned, not exempt, not being restored, still asked for) before
    the connector moves or deletes anything — and never in ``mode: dry_run``.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    connector: str = Field(description="the checkpoint connector that moves and deletes")
    grace: Duration = Field(
        3600, json_schema_extra={"default": "1h"},
        description="how long to wait after announcing an action, then re-check, before acting",
    )
    _params: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("connector")
    @classmethod
    def _known(cls, name: str, info: ValidationInfo) -> str:
        connectors = plugins_of(info).checkpoint_connectors
        if name not in connectors:
            known = ", ".join(sorted(connectors)) or "none"
            raise PydanticCustomError("unknown_connector",
                                      "unknown connector {name} (known: {known})",
                                      {"name": repr(name), "known": known})
        return name

    @model_validator(mode="after")
    def _params_fit_connector(self, info: ValidationInfo) -> CheckpointActs:
        connector = plugins_of(info).checkpoint_connectors[self.connector]
        params = connector.params_model.model_validate(self.model_extra or {})
        self._params = params.model_dump(mode="json")
        return self

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)


def acts_json_schema(connectors: Mapping[str, type[CheckpointActor]]) -> dict[str, Any]:
    """One alternative per checkpoint connector, each closed to unknown keys."""
    common = CheckpointActs.model_json_schema()["properties"]
    options = []
    for name, connector in sorted(connectors.items()):
        params: type[CheckpointParams] = connector.params_model
        schema = params.model_json_schema()
        option: dict[str, Any] = {
            "type": "object", "title": f"act via {name}", "description": summary_of(params),
            "properties": {"connector": {"const": name,
                                         "description": common["connector"]["description"]},
                           "grace": common["grace"], **schema.get("properties", {})},
            "required": ["connector", *schema.get("required", [])],
            "additionalProperties": False,
        }
        if "$defs" in schema:
            option["$defs"] = schema["$defs"]
        options.append(option)
    return {"oneOf": options}


ExemptValues = Glob | list[Glob]


def _keep_true() -> dict[str, str | list[str]]:
    return {"keep": "true"}


@kind("checkpoint_lifecycle")
class CheckpointLifecycleRule(Rule):
    """Each run's checkpoints past its retention: moved to a cold tier or deleted, safely.

    Per run (its ``job`` tag), in step order, the last ``keep_last`` checkpoints stay where
    they are and every ``keep_every``-th is never deleted; the others move to ``cold_tier``
    once older than ``cold_after`` and are deleted once older than ``expire_after``. The run's
    latest checkpoint, a pinned one (``costline checkpoints pin``), one with an ``exempt`` tag
    and one a restore read within ``restore_guard`` are never touched. The alert says what
    the actions would save a day; ``act`` carries them out after a grace and a re-check, and
    the rule is a dry run unless it says ``mode: live``.

    ```yaml
    rules:
      - name: checkpoint-retention
        kind: checkpoint_lifecycle
        match: {stage: pretrain}
        keep_last: 3
        keep_every: 10
        cold_after: 1d
        cold_tier: storage.archive
        expire_after: 14d
        act:
          connector: filesystem
          grace: 1h
          root: /lustre/checkpoints
          cold_root: /archive/checkpoints
          max_per_hour: 100
        notify: {slack: "#ml-storage"}
    ```
    """

    data_driven: ClassVar[bool] = False  # the inventory and time move it: the tick evaluates it
    presentation = Presentation(
        unit="currency_per_day",
        crossed="{value} of checkpoint storage past its retention",
        back="{value}: no checkpoint past its retention",
    )

    kind: Literal["checkpoint_lifecycle"]
    group_by: GroupBy = Field((RUN_TAG,), description="tag keys of the alert's group; the run's "
                              "job is always one")
    mode: Mode = Field("dry_run", description="dry_run (the default: actions are planned and "
                       "logged, never carried out) or live")
    keep_last: int = Field(3, ge=1, le=10_000,
                           description="the run's newest checkpoints that stay where they are")
    keep_every: int | None = Field(None, ge=1, le=1_000_000, description="every k-th checkpoint "
                                   "(in step order) is never deleted; it may move to cold_tier")
    cold_after: Duration | None = Field(None, description="older than this: moves to cold_tier")
    cold_tier: TierName | None = Field(None, description="the storage tier (a price book "
                                       "resource type per GB-hour) older checkpoints move to")
    expire_after: PositiveDuration | None = Field(None, description="older than this, and not "
                                                  "kept: deleted")
    restore_guard: PositiveDuration = Field(
        6 * 3600, json_schema_extra={"default": "6h"},
        description="a checkpoint a restore began reading within this long is left alone")
    exempt: dict[DimensionKey, ExemptValues] = Field(
        default_factory=_keep_true,
        description="tag → value or list of values (globs allowed) never moved or deleted")
    act: CheckpointActs | None = Field(None, description="carry the actions out through a "
                                       "connector, after a grace and a re-check")

    @model_validator(mode="after")
    def _coherent(self) -> CheckpointLifecycleRule:
        if (self.cold_after is None) != (self.cold_tier is None):
            raise PydanticCustomError("lifecycle", "cold_after and cold_tier go together")
        if self.cold_after is None and self.expire_after is None:
            raise PydanticCustomError("lifecycle", "set cold_after and cold_tier, "
                                      "expire_after, or both")
        return self

    @property
    def retention(self) -> Retention:
        exempt = {key: [v] if isinstance(v, str) else list(v) for key, v in self.exempt.items()}
        return Retention(self.keep_last, self.keep_every, self.cold_after, self.cold_tier,
                         self.expire_after, self.restore_guard, exempt)

    @property
    def run_match(self) -> dict[str, str]:
        """``match`` on a checkpoint's tags (the pseudo-tags of spend do not apply)."""
        return {k: v for k, v in self.match.items() if k not in PSEUDO_TAGS}

    def actions(self, state: StateView, now: float) -> dict[str, list[LifecycleAction]]:
        """Per run: what the policy asks now (the worker's lifecycle acts on the same)."""
        if not isinstance(state, CheckpointInventory):
            return {}
        runs = by_run(c for c in state.checkpoints() if matches(self.run_match, c.tags))
        restores = state.restores(now - self.restore_guard)
        pins = state.pins()
        planned = {run: plan_run(self.retention, found, restores, pins, now)
                   for run, found in sorted(runs.items())}
        return {run: found for run, found in planned.items() if found}

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        return [self._finding(found, now) for found in self.actions(state, now).values()]

    def _finding(self, found: list[LifecycleAction], now: float) -> Finding:
        tags = found[0].checkpoint.tags
        group = {key: tags.get(key, "") for key in self.group_by}
        group.setdefault(RUN_TAG, found[0].checkpoint.run)
        parts: dict[str, tuple[int, int]] = {}
        for action in found:
            name = "delete" if action.action == "delete" else f"move to {action.to_tier}"
            count, daily = parts.get(name, (0, 0))
            parts[name] = (count + 1, daily + storage_now(action.checkpoint) * DAY_H)
        total = sum(daily for _, daily in parts.values())
        line = Line(LIFECYCLE_LINE, 0)
        top = tuple(Contributor({"action": name, "checkpoints": str(count)}, daily)
                    for name, (count, daily) in sorted(parts.items()))
        oldest = min(action.checkpoint.written_at for action in found)
        return Finding(group=group, value=total, line=line.name, threshold=0, rank=0,
                       lines=(line,), period=(oldest, now), top=top)

    def summarize(self, finding: Finding, currency: str) -> str:
        said = ", ".join(f"{c.group['checkpoints']} to {c.group['action']}"
                         for c in finding.top)
        how = "planned only, dry run" if self.mode == "dry_run" else "live"
        act = (f"; {self.act.connector} acts after {format_duration(self.act.grace)} grace "
               f"({how})" if self.act is not None else "; no connector acts on it")
        return (f"{labels_text(finding.group)} keeps checkpoints past its retention: {said}, "
                f"{money_text(finding.value, currency)}/day of storage where they are now"
                f"{act}.")
