"""The events costline counts (README, Events), and the one function that turns raw bytes into them.

A Kafka message value is one event object or a batch (a JSON array of up to 10,000). A
message is accepted whole or rejected whole: a batch with one bad element is rejected with
the element's index, so the producer can fix and resend it (the ``event_id`` keeps the resend
from counting twice) and the dead-letter topic keeps the exact bytes that failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeAlias, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticCustomError

MAX_BATCH = 10_000
MAX_FUTURE_S = 600.0
MIN_TS = -2_208_988_800.0
"""1900-01-01T00:00:00Z. Nothing older is a usage time, and every zone's calendar can place
anything newer (a ts in year 0 or beyond a C ``time_t`` cannot be bucketed by day)."""
MAX_TAGS = 32


class Category(StrEnum):
    """Spend categories of the price book."""

    compute = "compute"
    storage = "storage"
    network = "network"
    database = "database"
    observability = "observability"
    security = "security"
    operations = "operations"
    migration = "migration"
    other = "other"


class ChargeKind(StrEnum):
    """What a usage event's money is (FOCUS calls it the charge category). Metered usage,
    purchases and taxes are never negative; credits, refunds and adjustments (a reversal, a
    correction) may be: a bill holds them, and spend must equal the bill."""

    usage = "usage"
    purchase = "purchase"
    tax = "tax"
    credit = "credit"
    refund = "refund"
    adjustment = "adjustment"


# The charges whose ``cost`` may be negative.
SIGNED_CHARGES = frozenset({ChargeKind.credit, ChargeKind.refund, ChargeKind.adjustment})


class FaultType(StrEnum):
    node_failure = "node_failure"
    silent_data_corruption = "silent_data_corruption"
    comm_timeout = "comm_timeout"
    storage_stall = "storage_stall"
    oom = "oom"
    preemption = "preemption"
    other = "other"


EventId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:/-]{1,128}$")]
TagKey = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
TagValue = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Tags = Annotated[dict[TagKey, TagValue], Field(max_length=MAX_TAGS)]
ResourceId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ResourceType = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")]
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
# RFC 3339 with an offset, or Unix seconds as a JSON number. Kept as sent (so a round trip is
# exact) and converted by ``unix_ts``: the pattern is checked in pydantic's core, while a
# Python validator here would halve the parser's throughput. (A plain ``datetime`` field would
# also take strings of digits as Unix time, which the contract does not allow.)
RFC3339 = (
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)
# Numbers first (the Slurm and Prometheus collectors and the demo send numbers, the FOCUS import
# strings): each form the union tries in vain costs an error object in pydantic's core. Float
# first, in smart mode: a JSON float is taken at the first try, and a JSON int still stays an
# int (smart mode prefers the exact type), so an event is dumped as it was sent.
Timestamp = Annotated[
    Annotated[float, Field(allow_inf_nan=False)]
    | int
    | Annotated[str, StringConstraints(pattern=RFC3339)],
    Field(union_mode="smart"),
]


def _whole(value: Any) -> Any:
    """A whole number written as a float (``512.0``: Python's json writes any float so) is that
    integer. From 2^53 on a float no longer holds every whole number, so its text may have
    said another one: refused, as any float was."""
    if type(value) is float and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


WHOLE = BeforeValidator(_whole)
"""Counts (accelerators, tokens, steps, bytes) also taken as a whole float; 512.5 is refused."""


class _Event(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    event_id: EventId
    ts: Timestamp
    # Omitted tags mean untagged spend: still money, reported under empty group values.
    tags: Tags = Field(default_factory=dict)

    @property
    def unix_ts(self) -> float:
        """``ts`` as Unix seconds, whichever form the producer sent.

        Raises ``ValueError`` for a well-formed but impossible date (``2026-02-30``);
        ``parse_message`` reads it once, so an accepted event always has one.
        """
        ts = self.ts
        if isinstance(ts, str):
            return datetime.fromisoformat(ts.replace("z", "Z")).timestamp()
        return float(ts)


class UsageEvent(_Event):
    """Something was consumed and costs money, or money moved on the bill for it.

    ``cost`` overrides the price book; it may be negative only for a ``charge`` that is a
    credit, a refund or an adjustment (the price book refuses a negative metered usage).
    """

    kind: Literal["usage"]
    resource_id: ResourceId
    resource_type: ResourceType
    quantity: NonNegative
    unit: Name
    cost: Finite | None = None
    category: Category | None = None
    charge: ChargeKind = ChargeKind.usage


class UtilizationEvent(_Event):
    """A gauge sample of a resource; it costs nothing, idle detection reads it."""

    kind: Literal["utilization"]
    resource_id: ResourceId
    resource_type: ResourceType
    metric: Name
    value: Annotated[float, Field(allow_inf_nan=False)]


class FaultEvent(_Event):
    """A fault made ``units`` accelerators redo ``lost_seconds`` and wait ``recovery_seconds``."""

    kind: Literal["fault"]
    fault: FaultType
    resource_type: ResourceType
    units: Annotated[int, WHOLE, Field(ge=1, le=1_000_000)]
    lost_seconds: NonNegative
    recovery_seconds: NonNegative
    resource_id: ResourceId | None = None


RUN_TAG = "job"
"""The tag that names a training run: its usage, progress, checkpoints and end carry it."""


def _names_a_run(tags: dict[str, str]) -> dict[str, str]:
    if RUN_TAG not in tags:
        raise PydanticCustomError("run_tag", "needs the tag {key}: it names the run",
                                  {"key": RUN_TAG})
    return tags


RunTags = Annotated[Tags, AfterValidator(_names_a_run)]
Count = Annotated[int, WHOLE, Field(ge=0, le=10**15)]


class ProgressEvent(_Event):
    """A run trained ``tokens`` tokens (and ``samples``) in ``steps`` optimizer steps since its
    previous progress event, reaching step ``step``: what its spend bought."""

    kind: Literal["progress"]
    tags: RunTags
    step: Count
    tokens: Count
    steps: Annotated[int, WHOLE, Field(ge=1, le=10**9)] = 1
    samples: Count | None = None


class CheckpointEvent(_Event):
    """A run's checkpoint of step ``step``, ``bytes`` big, is kept at ``location`` on the
    storage ``tier`` (a price book resource type priced per GB-hour); writing it stalled
    training ``write_seconds``. Sent again with another tier and location when it moves."""

    kind: Literal["checkpoint"]
    tags: RunTags
    location: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    checkpoint_id: ResourceId | None = None
    step: Count
    bytes: Annotated[int, WHOLE, Field(ge=0, le=10**18)]
    tier: ResourceType
    write_seconds: NonNegative = 0.0

    @property
    def identity(self) -> str:
        """What names the checkpoint: its id, else its location."""
        return self.checkpoint_id or self.location


class RestoreEvent(_Event):
    """A run began reading a checkpoint back (after a fault, or to branch from it)."""

    kind: Literal["restore"]
    tags: RunTags
    location: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    checkpoint_id: ResourceId | None = None
    read_seconds: NonNegative | None = None

    @property
    def identity(self) -> str:
        return self.checkpoint_id or self.location


class RunStatus(StrEnum):
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class RunEndEvent(_Event):
    """A run ended: a failed or cancelled one bought nothing, so its spend is waste."""

    kind: Literal["run_end"]
    tags: RunTags
    status: RunStatus
    reason: Annotated[str, StringConstraints(max_length=256)] | None = None


Event: TypeAlias = Annotated[
    UsageEvent | UtilizationEvent | FaultEvent | ProgressEvent | CheckpointEvent
    | RestoreEvent | RunEndEvent,
    Field(discriminator="kind"),
]

AnyEvent: TypeAlias = (UsageEvent | UtilizationEvent | FaultEvent | ProgressEvent
                       | CheckpointEvent | RestoreEvent | RunEndEvent)
EVENT_MODELS = (UsageEvent, UtilizationEvent, FaultEvent, ProgressEvent, CheckpointEvent,
                RestoreEvent, RunEndEvent)

_ONE: TypeAdapter[AnyEvent] = TypeAdapter(Event)
_BATCH: TypeAdapter[list[AnyEvent]] = TypeAdapter(
    Annotated[list[Event], Field(min_length=1, max_length=MAX_BATCH)]
)
# The compiled validators themselves, without the adapters' Python wrappers around them.
_validate_one = _ONE.validator.validate_json
_validate_batch = _BATCH.validator.validate_json


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a message was refused: a short machine-readable code and a sentence for people."""

    code: str
    reason: str


@dataclass(slots=True)  # not frozen: a frozen dataclass is built field by field, slowly
class Parsed:
    events: list[AnyEvent]
    batch: bool
    # Each event's ``unix_ts``, worked out once while checking it.
    times: list[float] = field(default_factory=list, compare=False)


def _where(loc: tuple[int | str, ...], batch: bool) -> str:
    """Turn a pydantic error location into words: ``event 3: field tags.team``."""
    parts = list(loc)
    prefix = ""
    if batch and parts and isinstance(parts[0], int):
        prefix = f"event {parts.pop(0)}: "
    # Drop the discriminator tag pydantic inserts (``usage``/``fault``/...).
    if parts and parts[0] in EVENT_KINDS:
        parts.pop(0)
    field = ".".join(_shown(p) for p in parts)
    return prefix + (f"field {field}" if field else "message")


def _shown(part: int | str) -> str:
    """A location part as printable text: a key the producer chose (``"\\n"``, a terminal
    escape) is quoted, so a reason stays one printable line wherever it is shown."""
    text = str(part)
    return text if text.isprintable() and text else repr(text)


_TS_FORMS = ("str", "int", "float", "constrained-str")


def _fold_ts(errors: list[Any]) -> list[Any]:
    """One sentence for a bad ``ts`` instead of one per form the union tried."""
    folded: list[Any] = []
    seen: set[tuple[Any, ...]] = set()
    for error in errors:
        loc = tuple(error["loc"])
        if "ts" in loc and loc[-1] in _TS_FORMS:
            root = loc[: loc.index("ts") + 1]
            if root in seen:
                continue
            seen.add(root)
            sent = error.get("input")
            error = {
                "type": "bad_timestamp",
                "loc": root,
                "msg": f"must be RFC 3339 with an offset or Unix seconds, got {sent!r:.60}",
            }
        folded.append(error)
    return folded


EVENT_KINDS = tuple(get_args(event.model_fields["kind"].annotation)[0]
                    for event in EVENT_MODELS)
_KINDS = ", ".join(EVENT_KINDS)
# pydantic names the tagged union's own words ("discriminator", "tag"): said as the field.
_KIND_ERRORS = {
    "union_tag_invalid": lambda ctx: f"{ctx.get('tag')!r:.60} is not one of {_KINDS}",
    "union_tag_not_found": lambda ctx: f"Field required (one of {_KINDS})",
}


def _name_kind(errors: list[Any]) -> list[Any]:
    """A missing or unknown ``kind`` reported as the field ``kind``."""
    return [
        {**e, "loc": (*e["loc"], "kind"), "msg": _KIND_ERRORS[e["type"]](e.get("ctx") or {})}
        if e["type"] in _KIND_ERRORS else e
        for e in errors
    ]


def _explain(exc: ValidationError, batch: bool, limit: int = 3) -> Rejection:
    errors = _name_kind(_fold_ts(exc.errors(include_url=False)))
    first = errors[0]
    code = "invalid_json" if first["type"] == "json_invalid" else _code_for(first)
    said = [_brief(f"{_where(e['loc'], batch)}: {e['msg']}") for e in errors[:limit]]
    if len(errors) > limit:
        said.append(f"... and {len(errors) - limit} more")
    return Rejection(code, "; ".join(said))


def _brief(said: str, limit: int = 300) -> str:
    """One printable line of bounded length: pydantic's messages may quote what the producer
    sent (an unknown ``kind`` of any length, with any characters)."""
    if not said.isprintable():
        said = "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                       for c in said)
    return said if len(said) <= limit else said[: limit - 1] + "…"


_CODES = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
    "union_tag_invalid": "unknown_kind",
    "union_tag_not_found": "missing_field",
    "greater_than_equal": "out_of_range",
    "less_than_equal": "out_of_range",
    "too_long": "too_long",
    "too_short": "too_short",
    "string_too_long": "too_long",
    "string_too_short": "too_short",
    "string_pattern_mismatch": "bad_format",
    "enum": "bad_value",
    "literal_error": "bad_value",
    "bad_timestamp": "bad_timestamp",
    "run_tag": "missing_field",
}


def _code_for(error: Any) -> str:
    return _CODES.get(error["type"], "bad_type")


def _at(index: int, batch: bool) -> str:
    return f"event {index}: " if batch else ""


_OPENERS = (b"{", b"[")
_BOM = b"\xef\xbb\xbf"


def _out_of_range(ts: float, index: int, batch: bool) -> Rejection:
    if ts < MIN_TS:
        return Rejection("bad_timestamp", f"{_at(index, batch)}field ts: before 1900-01-01")
    return Rejection("future_ts",
                     f"{_at(index, batch)}field ts: more than 10 minutes in the future")


def parse_message(raw: bytes, now: float | None = None) -> Parsed | Rejection:
    """Raw message bytes → validated events, or the precise reason they were refused.

    Never raises: anything that is not a valid event or batch becomes a ``Rejection``.
    """
    try:
        head = raw[:1]
        if head not in _OPENERS:  # leading whitespace or a byte order mark: rare, so copied
            # only then. RFC 8259 lets a parser ignore a UTF-8 BOM, which some writers add.
            raw = raw.removeprefix(_BOM)
            head = raw.lstrip()[:1]
        batch = head == b"["
        try:
            events: list[AnyEvent] = (
                _validate_batch(raw) if batch else [_validate_one(raw)]
            )
        except ValidationError as exc:
            return _explain(exc, batch)
        limit = (time.time() if now is None else now) + MAX_FUTURE_S
        times = []
        for index, event in enumerate(events):
            try:
                ts = event.unix_ts
            except (ValueError, OverflowError) as exc:
                return Rejection("bad_timestamp", f"{_at(index, batch)}field ts: {exc}")
            if not MIN_TS <= ts <= limit:
                return _out_of_range(ts, index, batch)
            times.append(ts)
        return Parsed(events, batch, times)
    except Exception as exc:  # noqa: BLE001 - the pipeline must never stop on input
        return Rejection("unparseable", f"message: {type(exc).__name__}: {exc}")


def dump_event(event: AnyEvent) -> bytes:
    """The JSON of an event as ``parse_message`` accepts it (``ts`` kept as it was sent)."""
    return event.model_dump_json(exclude_none=True).encode()
