"""Idle resources: a gauge below a line for a while, with an optional reclaim request.

Idleness must reflect real work, and "unknown" is busy: a resource is idle only if every
sample of the last ``for`` is below ``below`` and no two samples are further apart than
``max_gap``. A resource that stopped reporting is never idle, so a scraper outage cannot
cancel a training run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from costline.rules.findings import Finding, Line, ReclaimRequest, amount_text
from costline.rules.globs import glob_match
from costline.rules.kinds import DimensionKey, Glob, Presentation, Rule, kind
from costline.rules.plugins import plugins_of
from costline.rules.prices import exact, to_micro
from costline.rules.reclaim_params import Reclaimer, ReclaimParams
from costline.rules.registry import summary_of
from costline.rules.state import PSEUDO_TAGS, ResourceSamples, StateView

IDLE_LINE = "idle"
MetricName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]


class Reclaim(BaseModel):
    """What to do with an idle resource: ``connector``, ``grace``, then the connector's keys.

    The reclamation agent waits ``grace``, re-checks that the resource is still idle, and only
    then acts (never in ``mode: dry_run``). The connectors, and so which keys each takes, are
    the ones the loader was given (``rules/plugins.py``); the JSON Schema lists them the same
    way (``reclaim_json_schema``).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    connector: str = Field(description="the reclaim connector that releases the resource")
    grace: Duration = Field(
        900,
        json_schema_extra={"default": "15m"},
        description="how long to wait after the warning, then re-check, before acting",
    )
    _params: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("connector")
    @classmethod
    def _known(cls, name: str, info: ValidationInfo) -> str:
        reclaimers = plugins_of(info).reclaimers
        if name not in reclaimers:
            known = ", ".join(sorted(reclaimers)) or "none"
            raise PydanticCustomError(
                "unknown_connector",
                "unknown connector {name} (known: {known})",
                {"name": repr(name), "known": known},
            )
        return name

    @model_validator(mode="after")
    def _params_fit_connector(self, info: ValidationInfo) -> Reclaim:
        connector = plugins_of(info).reclaimers[self.connector]
        params = connector.params_model.model_validate(self.model_extra or {})
        self._params = params.model_dump(mode="json")
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The connector's parameters, defaults filled in (as validated when loaded)."""
        return dict(self._params)


def reclaim_json_schema(reclaimers: Mapping[str, type[Reclaimer]]) -> dict[str, Any]:
    """One alternative per connector, each closed to unknown keys."""
    return {"oneOf": [_connector_schema(n, c.params_model) for n, c in sorted(reclaimers.items())]}


def _connector_schema(name: str, params: type[ReclaimParams]) -> dict[str, Any]:
    schema = params.model_json_schema()
    common = Reclaim.model_json_schema()["properties"]
    properties = {
        "connector": {"const": name, "description": common["connector"]["description"]},
        "grace": common["grace"],
        **schema.get("properties", {}),
    }
    found: dict[str, Any] = {
        "type": "object",
        "title": f"reclaim via {name}",
        "description": summary_of(params),
        "properties": properties,
        "required": ["connector", *schema.get("required", [])],
        "additionalProperties": False,
    }
    if "$defs" in schema:
        found["$defs"] = schema["$defs"]
    return found


ExemptValues = Glob | list[Glob]


@kind("idle")
class IdleRule(Rule):
    """Resources whose ``metric`` stayed below ``below`` for ``for``; optionally reclaimed.

    ``for`` is the idle time itself (the samples show whether it held), so the alert fires
    as soon as the resource qualifies. ``exempt`` tags (a value or a list, globs allowed)
    are never idle: the opt-out for interactive notebooks or held reservations. The alert
    carries a reclaim request for the reclamation agent; with ``mode: dry_run`` it is only
    planned and logged.

    ```yaml
    rules:
      - name: gpu-idle
        kind: idle
        match: {resource_type: "gpu.*", env: prod}
        metric: gpu_util
        below: 0.05
        for: 30m
        exempt: {keep_alive: "true", stage: [eval]}
        reclaim: {connector: slurm, grace: 15m, action: cancel}
        mode: dry_run
        severity: warning
        notify: {slack: "#ml-gpu-idle", route_by_tag: owner}
    ```
    """

    inhibited_by_faults: ClassVar[bool] = True
    data_driven: ClassVar[bool] = False  # gauges and time move it: the tick evaluates it

    presentation = Presentation(
        unit="fraction",
        crossed="{value} utilization is under {line}",
        back="{value} utilization, back over {line}",
    )

    kind: Literal["idle"]
    metric: MetricName = Field(
        "gpu_util", description="the utilization gauge whose samples are read"
    )
    below: float = Field(
        allow_inf_nan=False, description="the idle line: every sample under it counts as idle"
    )
    for_: PositiveDuration = Field(
        alias="for", description="how long every sample must stay below: the idle time itself"
    )
    max_gap: PositiveDuration = Field(
        300,
        json_schema_extra={"default": "5m"},
        description="longest silence between samples; a longer one counts as busy",
    )
    exempt: dict[DimensionKey, ExemptValues] = Field(
        default_factory=dict,
        description="tag → value or list of values (globs allowed) that are never idle",
    )
    reclaim: Reclaim | None = Field(
        None, description="release the idle resource through a connector, after a grace"
    )

    @model_validator(mode="after")
    def _exempt_by_tags(self) -> IdleRule:
        """A resource is exempted by its own tags; a pseudo-tag such as ``resource_type`` is
        not one, and would exempt nothing while reading as if it did (``match`` leaves a
        resource type out)."""
        pseudo = sorted(set(self.exempt) & set(PSEUDO_TAGS))
        if pseudo:
            raise PydanticCustomError(
                "exempt", "exempt: {keys} is not a tag of a resource, so it would exempt "
                "nothing; leave such resources out with match", {"keys": ", ".join(pseudo)})
        return self

    @property
    def pending_for(self) -> int:
        """The samples already prove ``for``; waiting again would double it."""
        return 0

    def value_unit(self, units: Mapping[str, str]) -> str:
        """Utilization gauges are fractions (``0.05``); anything larger is in the metric's unit."""
        return self.presentation.unit if self.below <= 1 else self.metric

    def evaluate(self, state: StateView, now: float) -> list[Finding]:
        since = now - self.for_ - self.max_gap
        found = (
            self._judge(resource, now)
            for resource in state.samples(self.metric, self.match, since)
            if not self.is_exempt(resource.tags)
        )
        return [finding for finding in found if finding is not None]

    def is_exempt(self, tags: Mapping[str, str]) -> bool:
        """Whether an opt-out tag keeps this resource from ever being idle."""
        return any(
            any(glob_match(tags.get(key, ""), v) for v in _as_list(values))
            for key, values in self.exempt.items()
            if key in tags
        )

    def idle_since(self, points: Sequence[tuple[float, float]], now: float) -> float | None:
        """Start of the unbroken run of fresh samples below the line that ends at ``now``.

        Only ``for`` + ``max_gap`` of samples are read, so for a long-idle resource this is
        the earliest sample read: idle "at least since".
        """
        seen = [(ts, value) for ts, value in points if ts <= now]
        if not seen or now - seen[-1][0] > self.max_gap:
            return None
        since = None
        later = now
        for ts, value in reversed(seen):
            if value >= self.below or later - ts > self.max_gap:
                break
            since, later = ts, ts
        return since

    def _judge(self, resource: ResourceSamples, now: float) -> Finding | None:
        since = self.idle_since(resource.points, now)
        if since is None or now - since < self.for_:
            return None
        peak = max(value for ts, value in resource.points if since <= ts <= now)
        labels = {"resource_type": resource.resource_type, **resource.tags}
        group = {key: labels.get(key, "") for key in self.group_by}
        line = Line(IDLE_LINE, _micro(self.below))
        return Finding(
            group={**group, "resource_id": resource.resource_id},
            value=_micro(peak),
            line=line.name,
            threshold=line.value,
            rank=0,
            lines=(line,),
            period=(since, now),
            subject=labels,
            reclaim=self._reclaim_request(resource, since, now),
        )

    def _reclaim_request(
        self, resource: ResourceSamples, since: float, now: float
    ) -> ReclaimRequest | None:
        if self.reclaim is None:
            return None
        return ReclaimRequest(
            resource_id=resource.resource_id,
            resource_type=resource.resource_type,
            tags=dict(resource.tags),
            connector=self.reclaim.connector,
            params=self.reclaim.params,
            grace=self.reclaim.grace,
            mode=self.mode,
            idle_since=since,
            requested_at=now,
        )

    def summarize(self, finding: Finding, currency: str) -> str:
        start, end = finding.period
        resource = finding.group.get("resource_id", "?")
        job = finding.subject.get("job")
        whose = f" (job {job})" if job else ""
        sentence = (
            f"{resource}{whose} has had {self.metric} below {amount_text(finding.threshold)} "
            f"for at least {format_duration(int(end - start))} "
            f"(peak {amount_text(finding.value)})"
        )
        if self.reclaim is not None:
            how = "planned only, dry run" if self.mode == "dry_run" else "live"
            sentence += (
                f"; reclaim via {self.reclaim.connector} after "
                f"{format_duration(self.reclaim.grace)} grace ({how})"
            )
        return sentence + "."


def _as_list(values: str | list[str]) -> list[str]:
    return [values] if isinstance(values, str) else values


def _micro(value: float) -> int:
    return to_micro(exact(value))
