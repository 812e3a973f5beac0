"""The reclamation ledger: plans, their steps and the execution claims, kept in Redis.

Every change of a plan is one compare-and-set script: the step moves only from the state the
caller saw, and the step's action record is appended to the outbox and the history in the
same atomic call. So when two workers race, exactly one of them takes each step and publishes
it; when a worker dies after a step, the outbox still holds the record for the next one to
publish (at least once: consumers deduplicate by ``action_id``).

A release is guarded by an execution claim, ``SET NX`` on the plan's claim key, taken only
while the plan is still ``warned`` and reclamation is not paused. The claim is never released:
a worker that dies between claim and outcome leaves the plan ``executing``, and it is later
closed as failed with the outcome unknown, never executed a second time.

Keys (``P`` = ``{NS:reclaim}``, one hash slot so every script works on Redis Cluster):

| key | type | holds |
|---|---|---|
| ``P:plan:<id>`` | hash | the plan as JSON; its state, when warned, approver, claim |
| ``P:open`` | set | ids of plans not yet closed |
| ``P:slot:<rule>\\t<resource>`` | string | the plan holding the resource: while open, then |
| | | ``cooldown`` seconds more |
| ``P:claim:<id>`` | string | the worker that claimed the release |
| ``P:released:<rule>`` | sorted set | plans released (or reserved) in the last hour |
| ``P:keep:<resource>`` | string | who pressed Keep and until when (expires then) |
| ``P:paused`` | string | who paused reclamation, when and why |
| ``P:outbox`` | list | action records not yet handed to the sink, oldest first |
| ``P:log`` | list | the latest action records, newest first (``costline actions``) |

Closed plans and claims are kept for 30 days.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from costline.connectors.redis_client import AsyncRedisClient
from costline.rules.reclaim import Keep, Plan, PlanState, Tracked

ClaimResult = Literal["claimed", "taken", "paused"]
HOUR_S = 3600
LOG_MAX = 10_000
CLOSED_KEPT_S = 30 * 86400


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


def _tracked(fields: Mapping[Any, Any]) -> Tracked | None:
    data = {(_text(k) or ""): _text(v) for k, v in fields.items()}
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
redis.call('HSET', KEYS[2], 'data', ARGV[2], 'state', 'planned')
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

# KEYS: plan, claim, paused  ARGV: worker, now
_CLAIM = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 'paused' end
if redis.call('HGET', KEYS[1], 'state') ~= 'warned' then return 'taken' end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX') then return 'taken' end
redis.call('HSET', KEYS[1], 'state', 'executing', 'claimed_at', ARGV[2], 'claimed_by', ARGV[1])
return 'claimed'
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


class RedisReclaimLedger:
    """The ledger every worker of a namespace shares."""

    def __init__(self, redis: AsyncRedisClient, namespace: str = "costline",
                 family: str = "reclaim") -> None:
        """``family`` names the hash tag of the keys: ``reclaim`` for idle resources,
        ``checkpoints`` for the checkpoint lifecycle, whose plans live apart."""
        self._redis = redis
        self._p = f"{{{namespace}:{family}}}"
        self._open = redis.register_script(_OPEN)
        self._unplanned = redis.register_script(_UNPLANNED)
        self._advance = redis.register_script(_ADVANCE)
        self._claim = redis.register_script(_CLAIM)
        self._close = redis.register_script(_CLOSE)
        self._reserve = redis.register_script(_RESERVE)
        self._sent = redis.register_script(_SENT)
        self._approve = redis.register_script(_APPROVE)

    # ── keys ──────────────────────────────────────────────────────────────────────────────

    def _plan(self, plan_id: str) -> str:
        return f"{self._p}:plan:{plan_id}"

    def _slot(self, rule: str, resource_id: str) -> str:
        return f"{self._p}:slot:{rule}\t{resource_id}"

    def _claim_key(self, plan_id: str) -> str:
        return f"{self._p}:claim:{plan_id}"

    def _released(self, rule: str) -> str:
        return f"{self._p}:released:{rule}"

    def _keep(self, resource_id: str) -> str:
        return f"{self._p}:keep:{resource_id}"

    @property
    def _lists(self) -> list[str]:
        return [f"{self._p}:outbox", f"{self._p}:log"]

    # ── plans ─────────────────────────────────────────────────────────────────────────────

    async def holder(self, rule: str, resource_id: str) -> str | None:
        return _text(await self._redis.get(self._slot(rule, resource_id)))

    async def open(self, plan: Plan, record: dict[str, Any]) -> bool:
        keys = [self._slot(plan.rule, plan.resource_id), self._plan(plan.plan_id),
                f"{self._p}:open", *self._lists]
        args: list[str | int] = [plan.plan_id, json.dumps(plan.to_dict()), record_json(record),
                                 LOG_MAX]
        return bool(await self._open(keys=keys, args=args))

    async def close_unplanned(self, plan: Plan, record: dict[str, Any],
                              cooldown_s: int) -> bool:
        keys = [self._slot(plan.rule, plan.resource_id), *self._lists]
        args: list[str | int] = [plan.plan_id, record_json(record), LOG_MAX,
                                 max(0, int(cooldown_s))]
        return bool(await self._unplanned(keys=keys, args=args))

    async def plans(self) -> list[Tracked]:
        ids = sorted(_text(i) or "" for i in await self._redis.smembers(f"{self._p}:open"))
        pipe = self._redis.pipeline(transaction=False)
        for plan_id in ids:
            pipe.hgetall(self._plan(plan_id))
        found = [_tracked(fields) for fields in await pipe.execute()]
        return [tracked for tracked in found if tracked is not None]

    async def get(self, plan_id: str) -> Tracked | None:
        return _tracked(await self._redis.hgetall(self._plan(plan_id)))

    async def advance(self, plan_id: str, seen: PlanState, to: PlanState,
                      record: dict[str, Any], at: float) -> bool:
        keys = [self._plan(plan_id), *self._lists]
        args: list[str | int] = [seen, to, record_json(record), LOG_MAX, repr(at)]
        return bool(await self._advance(keys=keys, args=args))

    async def claim(self, plan_id: str, worker: str, now: float) -> ClaimResult:
        keys = [self._plan(plan_id), self._claim_key(plan_id), f"{self._p}:paused"]
        answer = _text(await self._claim(keys=keys, args=[worker, repr(now)]))
        return answer if answer in ("claimed", "paused") else "taken"  # type: ignore[return-value]

    async def close(self, plan_id: str, seen: PlanState, record: dict[str, Any],
                    cooldown_s: int) -> bool:
        tracked = await self.get(plan_id)
        if tracked is None:
            return False
        plan = tracked.plan
        keys = [self._plan(plan_id), f"{self._p}:open", self._slot(plan.rule, plan.resource_id),
                *self._lists, self._claim_key(plan_id)]
        args: list[str | int] = [plan_id, seen, record_json(record), max(0, int(cooldown_s)),
                                 LOG_MAX, CLOSED_KEPT_S]
        return bool(await self._close(keys=keys, args=args))

    async def approve(self, plan_id: str, by: str) -> bool:
        return bool(await self._approve(keys=[self._plan(plan_id)], args=[by]))

    # ── keep, caps, pause ─────────────────────────────────────────────────────────────────

    async def keep(self, resource_id: str, keep: Keep) -> None:
        await self._redis.set(self._keep(resource_id), json.dumps(asdict(keep)),
                              exat=int(keep.until) + 1)

    async def kept(self, resource_id: str, now: float) -> Keep | None:
        raw = _text(await self._redis.get(self._keep(resource_id)))
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
