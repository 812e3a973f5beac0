"""The ledger of automatic actions: plans, their steps and the execution claims, in Redis.

Reclamation keeps its plans here (``RedisReclaimLedger``, area ``reclaim``), and so do the
checkpoint lifecycle (area ``checkpoints``) and budget enforcement (area ``enforce``,
``costline.connectors.enforce_ledger``): the same scripts, one hash slot per area. A plan type
only needs an id, its rule and the subject the rule may hold one open plan for (a resource, a
group); its ledger decodes what it stored.

Every change of a plan is one compare-and-set script: the step moves only from the state the
caller saw, and the step's action record is appended to the outbox and the history in the
same atomic call. So when two workers race, exactly one of them takes each step and publishes
it; when a worker dies after a step, the outbox still holds the record for the next one to
publish (at least once: consumers deduplicate by ``action_id``).

A release is guarded by an execution claim, ``SET NX`` on the plan's claim key, taken only
while the plan is still ``warned`` and reclamation is not paused. The claim is never released:
a worker that dies between claim and outcome leaves the plan ``executing``, and it is later
closed as failed with the outcome unknown, never executed a second time.

A claim moves a plan from one state to the next under a claim key (reclamation:
``warned`` → ``executing``; enforcement's lift also ``enforced`` → ``lifting``), and ``note``
records fields on a plan only while it is in the state its caller saw, never overwriting one
(the values an enforcement is about to change are noted before it changes them).

Keys (``P`` = ``{NS:reclaim}`` or ``{NS:enforce}``, one hash slot so every script works on
Redis Cluster):

| key | type | holds |
|---|---|---|
| ``P:plan:<id>`` | hash | the plan as JSON; its state, when warned, approver, claim |
| ``P:open`` | set | ids of plans not yet closed |
| ``P:slot:<rule>\\t<resource>`` | string | the plan holding the resource: while open, then |
| | | ``cooldown`` seconds more |
| ``P:claim:<id>`` | string | the worker that claimed the release (``:lift``: the lift) |
| ``P:released:<rule>`` | sorted set | plans released (or reserved) in the last hour |
| ``P:keep:<resource>`` | string | who pressed Keep and until when (expires then) |
| ``P:paused`` | string | who paused reclamation, when and why |
| ``P:outbox`` | list | action records not yet handed to the sink, oldest first |
| ``P:log`` | list | the latest action records, newest first (``costline actions``) |

Closed plans and claims are kept for 30 days.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from costline.connectors.redis_client import AsyncRedisClient
from costline.rules.reclaim import Keep, Plan, PlanState, Tracked

ClaimResult = Literal["claimed", "taken", "paused"]
HOUR_S = 3600
LOG_MAX = 10_000
CLOSED_KEPT_S = 30 * 86400
BEFORE_PREFIX = "before:"
"""Fields ``note`` writes: the values a plan's action is about to change."""


class LedgerPlan(Protocol):
    """What the ledger needs of a plan: who it is, its rule, and its subject."""

    @property
    def plan_id(self) -> str: ...

    @property
    def rule(self) -> str: ...

    @property
    def subject(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


T = TypeVar("T")


@dataclass(frozen=True)
class Pause:
    """Reclamation is stopped: nothing is planned or released until resumed."""

    by: str
    at: float
    reason: str


class ReclaimLedger(Protocol):
    """What the reclamation agent keeps between ticks and shares between workers."""

    async def holder(self, rule: str, resource_id: str) -> str | None:
        """The plan holding this rule's resource (open, or closed and cooling down)."""
        ...

    async def open(self, plan: Plan, record: dict[str, Any]) -> bool:
        """Record a new plan as ``planned``; ``False`` if another plan holds its slot."""
        ...

    async def close_unplanned(self, plan: Plan, record: dict[str, Any],
                              cooldown_s: int) -> bool:
        """Record a plan that ends as it is made, in one record; its slot is held
        ``cooldown_s`` seconds as a closed plan's is. ``False`` if another plan holds it."""
        ...

    async def plans(self) -> list[Tracked]:
        """Every plan not yet closed."""
        ...

    async def get(self, plan_id: str) -> Tracked | None: ...

    async def advance(self, plan_id: str, seen: PlanState, to: PlanState,
                      record: dict[str, Any], at: float) -> bool:
        """Move a plan from ``seen`` to ``to`` at ``at`` and log the record; ``False`` if it
        had moved already."""
        ...

    async def claim(self, plan_id: str, worker: str, now: float) -> ClaimResult:
        """Take the execution claim of a ``warned`` plan (``SET NX``)."""
        ...

    async def close(self, plan_id: str, seen: PlanState, record: dict[str, Any],
                    cooldown_s: int) -> bool:
        """Close a plan and log the record; its slot stays held ``cooldown_s`` seconds."""
        ...

    async def approve(self, plan_id: str, by: str) -> bool: ...

    async def keep(self, resource_id: str, keep: Keep) -> None: ...

    async def kept(self, resource_id: str, now: float) -> Keep | None: ...

    async def released(self, rule: str, now: float, excluding: Sequence[str] = ()) -> int:
        """Releases of the rule in the hour before ``now``, not counting ``excluding``."""
        ...

    async def reserve(self, rule: str, plan_ids: Sequence[str], now: float,
                      limit: int) -> int | None:
        """Count ``plan_ids`` as released now if the hour stays within ``limit``: ``None``
        when reserved, else the releases the hour already holds besides them."""
        ...

    async def pause(self, pause: Pause) -> None: ...

    async def resume(self) -> bool: ...

    async def paused(self) -> Pause | None: ...

    async def outbox(self, limit: int = 500) -> list[str]:
        """Records not yet handed to the sink, oldest first (JSON text)."""
        ...

    async def sent(self, item: str) -> None:
        """The sink took ``item``: drop it from the outbox."""
        ...

    async def history(self, limit: int = 100) -> list[dict[str, Any]]:
        """The latest action records, newest first."""
        ...


def record_json(record: dict[str, Any]) -> str:
    """An action record as the outbox and the history keep it."""
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {(_text(k) or ""): (_text(v) or "") for k, v in raw.items()}


def tracked_of(data: Mapping[str, str]) -> Tracked | None:
    """A reclamation plan from its stored fields."""
    if not data.get("data"):
        return None
    claimed, warned = data.get("claimed_at"), data.get("warned_at")
    return Tracked(Plan.from_dict(json.loads(data["data"] or "{}")),
                   state=data.get("state") or "planned",  # type: ignore[arg-type]
                   approved_by=data.get("approved_by") or None,
                   claimed_at=float(claimed) if claimed else None,
                   warned_at=float(warned) if warned else None)


_PUSH = """
local function push(outbox, log, record, log_max)
  redis.call('RPUSH', outbox, record)
  redis.call('LPUSH', log, record)
  redis.call('LTRIM', log, 0, tonumber(log_max) - 1)
end
"""

# KEYS: slot, plan, open, outbox, log  ARGV: id, data, record, log_max
_OPEN = _PUSH + """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
redis.call('HSET', KEYS[2], 'data', ARGV[2], 'state', 'planned', 'slot', KEYS[1])
redis.call('SADD', KEYS[3], ARGV[1])
push(KEYS[4], KEYS[5], ARGV[3], ARGV[4])
return 1
"""

# KEYS: slot, outbox, log  ARGV: id, record, log_max, cooldown
_UNPLANNED = _PUSH + """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
if tonumber(ARGV[4]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[4])
else redis.call('DEL', KEYS[1]) end
push(KEYS[2], KEYS[3], ARGV[2], ARGV[3])
return 1
"""

# KEYS: plan, outbox, log  ARGV: seen, to, record, log_max, at
_ADVANCE = _PUSH + """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], ARGV[2] .. '_at', ARGV[5])
push(KEYS[2], KEYS[3], ARGV[3], ARGV[4])
return 1
"""

# KEYS: plan, claim, paused  ARGV: worker, now, seen, to, check_pause, kept_s
_CLAIM = """
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then return 'paused' end
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[3] then return 'taken' end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[6]) then return 'taken' end
redis.call('HSET', KEYS[1], 'state', ARGV[4], 'claimed_at', ARGV[2], 'claimed_by', ARGV[1])
return 'claimed'
"""

# KEYS: plan  ARGV: seen, field, value, field, value...
_NOTE = """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""

# KEYS: plan, open, slot, outbox, log, claim  ARGV: id, seen, record, cooldown, log_max, kept_s
_CLOSE = _PUSH + """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'closed')
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[6], ARGV[6])
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[3]) == ARGV[1] then
  if tonumber(ARGV[4]) > 0 then redis.call('EXPIRE', KEYS[3], ARGV[4])
  else redis.call('DEL', KEYS[3]) end
end
push(KEYS[4], KEYS[5], ARGV[3], ARGV[5])
return 1
"""

# KEYS: released  ARGV: now, window, limit, id...
_RESERVE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[2])))
local new = {}
for i = 4, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then new[#new + 1] = ARGV[i] end
end
local card = redis.call('ZCARD', KEYS[1])
local others = card - (#ARGV - 3 - #new)
if card + #new > tonumber(ARGV[3]) then return others end
for _, id in ipairs(new) do redis.call('ZADD', KEYS[1], now, id) end
redis.call('EXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return -1
"""

# KEYS: outbox  ARGV: item
_SENT = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then return redis.call('LPOP', KEYS[1]) end
return redis.call('LREM', KEYS[1], 1, ARGV[1])
"""

# KEYS: plan  ARGV: by
_APPROVE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'planned' and state ~= 'warned' then return 0 end
redis.call('HSET', KEYS[1], 'approved_by', ARGV[1])
return 1
"""


class RedisPlanLedger(Generic[T]):
    """The ledger of one area (``reclaim``, ``enforce``) every worker of a namespace shares;
    ``decode`` turns a plan's stored fields back into what its area tracks."""

    def __init__(self, redis: AsyncRedisClient, namespace: str, area: str,
                 decode: Callable[[Mapping[str, str]], T | None]) -> None:
        self._redis = redis
        self.namespace = namespace
        self._p = f"{{{namespace}:{area}}}"
        self._decode = decode
        self._open = redis.register_script(_OPEN)
        self._unplanned = redis.register_script(_UNPLANNED)
        self._advance = redis.register_script(_ADVANCE)
        self._claim = redis.register_script(_CLAIM)
        self._note = redis.register_script(_NOTE)
        self._close = redis.register_script(_CLOSE)
        self._reserve = redis.register_script(_RESERVE)
        self._sent = redis.register_script(_SENT)
        self._approve = redis.register_script(_APPROVE)

    @property
    def redis(self) -> AsyncRedisClient:
        """The client, for another area's ledger on the same Redis."""
        return self._redis

    # ── keys ──────────────────────────────────────────────────────────────────────────────

    def _plan(self, plan_id: str) -> str:
        return f"{self._p}:plan:{plan_id}"

    def _slot(self, rule: str, subject: str) -> str:
        return f"{self._p}:slot:{rule}\t{subject}"

    def _claim_key(self, plan_id: str, name: str = "") -> str:
        return f"{self._p}:claim:{plan_id}" + (f":{name}" if name else "")

    def _released(self, rule: str) -> str:
        return f"{self._p}:released:{rule}"

    def _keep(self, subject: str) -> str:
        return f"{self._p}:keep:{subject}"

    @property
    def _lists(self) -> list[str]:
        return [f"{self._p}:outbox", f"{self._p}:log"]

    # ── plans ─────────────────────────────────────────────────────────────────────────────

    async def holder(self, rule: str, subject: str) -> str | None:
        return _text(await self._redis.get(self._slot(rule, subject)))

    async def open(self, plan: LedgerPlan, record: dict[str, Any]) -> bool:
        keys = [self._slot(plan.rule, plan.subject), self._plan(plan.plan_id),
                f"{self._p}:open", *self._lists]
        args: list[str | int] = [plan.plan_id, json.dumps(plan.to_dict()), record_json(record),
                                 LOG_MAX]
        return bool(await self._open(keys=keys, args=args))

    async def close_unplanned(self, plan: LedgerPlan, record: dict[str, Any],
                              cooldown_s: int) -> bool:
        keys = [self._slot(plan.rule, plan.subject), *self._lists]
        args: list[str | int] = [plan.plan_id, record_json(record), LOG_MAX,
                                 max(0, int(cooldown_s))]
        return bool(await self._unplanned(keys=keys, args=args))

    async def plans(self) -> list[T]:
        ids = sorted(_text(i) or "" for i in await self._redis.smembers(f"{self._p}:open"))
        pipe = self._redis.pipeline(transaction=False)
        for plan_id in ids:
            pipe.hgetall(self._plan(plan_id))
        found = [self._decode(_fields(fields)) for fields in await pipe.execute()]
        return [tracked for tracked in found if tracked is not None]

    async def get(self, plan_id: str) -> T | None:
        return self._decode(_fields(await self._redis.hgetall(self._plan(plan_id))))

    async def advance(self, plan_id: str, seen: str, to: str, record: dict[str, Any],
                      at: float) -> bool:
        keys = [self._plan(plan_id), *self._lists]
        args: list[str | int] = [seen, to, record_json(record), LOG_MAX, repr(at)]
        return bool(await self._advance(keys=keys, args=args))

    async def claim(self, plan_id: str, worker: str, now: float, *, seen: str = "warned",
                    to: str = "executing", name: str = "", check_pause: bool = True
                    ) -> ClaimResult:
        """Move a plan from ``seen`` to ``to`` under the claim ``name`` (``SET NX``): once
        ever per plan and name. ``check_pause``: refuse while the area is paused."""
        keys = [self._plan(plan_id), self._claim_key(plan_id, name), f"{self._p}:paused"]
        args: list[str | int] = [worker, repr(now), seen, to, "1" if check_pause else "0",
                                 CLOSED_KEPT_S]
        answer = _text(await self._claim(keys=keys, args=args))
        return answer if answer in ("claimed", "paused") else "taken"  # type: ignore[return-value]

    async def note(self, plan_id: str, seen: str, values: Mapping[str, Any]) -> bool:
        """Record ``values`` (JSON) as ``before:<key>`` fields while the plan is ``seen``; a
        field already recorded keeps its first value. ``False`` if the plan moved on."""
        args: list[str | int] = [seen]
        for key, value in values.items():
            args += [BEFORE_PREFIX + key, json.dumps(value, sort_keys=True)]
        return bool(await self._note(keys=[self._plan(plan_id)], args=args))

    async def close(self, plan_id: str, seen: str, record: dict[str, Any],
                    cooldown_s: int) -> bool:
        fields = _fields(await self._redis.hgetall(self._plan(plan_id)))
        slot = fields.get("slot")
        if not slot:
            data = json.loads(fields.get("data") or "{}")
            if not data:
                return False
            slot = self._slot(str(data["rule"]), str(data.get("resource_id", "")))
        keys = [self._plan(plan_id), f"{self._p}:open", slot, *self._lists,
                self._claim_key(plan_id)]
        args: list[str | int] = [plan_id, seen, record_json(record), max(0, int(cooldown_s)),
                                 LOG_MAX, CLOSED_KEPT_S]
        return bool(await self._close(keys=keys, args=args))

    async def approve(self, plan_id: str, by: str) -> bool:
        return bool(await self._approve(keys=[self._plan(plan_id)], args=[by]))

    # ── keep, caps, pause ─────────────────────────────────────────────────────────────────

    async def keep(self, subject: str, keep: Keep) -> None:
        await self._redis.set(self._keep(subject), json.dumps(asdict(keep)),
                              exat=int(keep.until) + 1)

    async def kept(self, subject: str, now: float) -> Keep | None:
        raw = _text(await self._redis.get(self._keep(subject)))
        if not raw:
            return None
        keep = Keep(**json.loads(raw))
        return keep if keep.until > now else None

    async def released(self, rule: str, now: float, excluding: Sequence[str] = ()) -> int:
        members = await self._redis.zrangebyscore(self._released(rule), now - HOUR_S, "+inf")
        return len({str(_text(m)) for m in members if isinstance(m, bytes | str)}
                   - set(excluding))

    async def reserve(self, rule: str, plan_ids: Sequence[str], now: float,
                      limit: int) -> int | None:
        answer = int(await self._reserve(keys=[self._released(rule)],
                                         args=[repr(now), HOUR_S, limit, *plan_ids]))
        return None if answer < 0 else answer

    async def pause(self, pause: Pause) -> None:
        await self._redis.set(f"{self._p}:paused", json.dumps(asdict(pause)))

    async def resume(self) -> bool:
        return bool(await self._redis.delete(f"{self._p}:paused"))

    async def paused(self) -> Pause | None:
        raw = _text(await self._redis.get(f"{self._p}:paused"))
        return Pause(**json.loads(raw)) if raw else None

    # ── records ───────────────────────────────────────────────────────────────────────────

    async def outbox(self, limit: int = 500) -> list[str]:
        items: list[bytes | str] = await self._redis.lrange(self._lists[0], 0, limit - 1)
        return [_text(item) or "" for item in items]

    async def sent(self, item: str) -> None:
        await self._sent(keys=[self._lists[0]], args=[item])

    async def history(self, limit: int = 100) -> list[dict[str, Any]]:
        items = await self._redis.lrange(self._lists[1], 0, limit - 1)
        return [json.loads(_text(item) or "{}") for item in items]


class RedisReclaimLedger(RedisPlanLedger[Tracked]):
    """The ledger of resources a flow like reclamation's acts on, which every worker of a
    namespace shares: ``area`` is ``reclaim`` for idle resources, ``checkpoints`` for the
    checkpoint lifecycle, whose plans live apart."""

    def __init__(self, redis: AsyncRedisClient, namespace: str = "costline",
                 area: str = "reclaim") -> None:
        super().__init__(redis, namespace, area, tracked_of)
