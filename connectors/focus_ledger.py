"""The row memory of FOCUS imports in Redis: what each bill row's events have counted
(``focus_revision.RowState``), so a later export of the same rows sends only what changed, at
any time after the first; and the lock that keeps two imports of a namespace apart.

A row's state is a field of ``{NS:focus:YYYY-MM:SS}:rows``: the month of its ChargePeriodStart
(UTC), then one of 256 shards by the row id's digest, so a large bill spreads over a cluster
and no key grows past a few MB. Each key is kept 400 days after its last write, as the daily
buckets are. The keys have a time to live, so a Redis that evicts (docs/OPERATIONS.md) may
drop them too: keep ``noeviction``.

Each row with a billing period is also named under its export (``focus.billing_scope``):
``{NS:focus:scope:<scope>:SS}:attribution`` maps ``<month>\t<row id>`` to what
``focus_withdrawal`` needs to withdraw the row should a later export of its billing period no
longer hold it (its hours, time, resource and shape), and ``{NS:focus:scope:<scope>}:shapes``
the shapes (tags, category, unit) by id. ``{NS:focus:YYYY-MM}:shapes`` keeps, by id, the
shapes the month's rows are counted under (``focus_shape``): a row a later export restates
under another one is moved from it. Kept as long as the states.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from costline.connectors.focus_revision import RowState
from costline.connectors.focus_shape import Shape
from costline.connectors.focus_withdrawal import Attribution
from costline.connectors.redis_client import RedisClient

KEEP_S = 400 * 86400
# An import holds the lock this long at most: one that died leaves it for this long.
LOCK_S = 3600

Row = tuple[str, str]  # (month YYYY-MM, row id)


def rows_key(namespace: str, row: Row) -> str:
    month, row_id = row
    return f"{{{namespace}:focus:{month}:{_shard(row_id)}}}:rows"


def attribution_key(namespace: str, scope: str, row_id: str) -> str:
    return _attribution_key(namespace, scope, _shard(row_id))


def _attribution_key(namespace: str, scope: str, shard: str) -> str:
    return f"{{{namespace}:focus:scope:{scope}:{shard}}}:attribution"


def shapes_key(namespace: str, scope: str) -> str:
    return f"{{{namespace}:focus:scope:{scope}}}:shapes"


def counted_shapes_key(namespace: str, month: str) -> str:
    return f"{{{namespace}:focus:{month}}}:shapes"


def _shard(row_id: str) -> str:
    return hashlib.blake2b(row_id.encode(), digest_size=1).hexdigest()


def lock_key(namespace: str) -> str:
    return f"{{{namespace}:focus}}:import"


class RowLedger:
    """Bill rows' states by (month, row id)."""

    def __init__(self, redis: RedisClient, namespace: str) -> None:
        self.redis, self.namespace = redis, namespace
        self._kept: set[tuple[str, str]] = set()  # (month, shape id) kept by this import

    def states(self, rows: Sequence[Row]) -> list[RowState | None]:
        with self.redis.pipeline(transaction=False) as pipe:
            for row in rows:
                pipe.hget(rows_key(self.namespace, row), row[1])
            found = pipe.execute()
        return [None if value is None else RowState.decode(_text(value)) for value in found]

    def write(self, states: Iterable[tuple[Row, RowState]]) -> None:
        by_key: dict[str, dict[str, str]] = {}
        months: set[str] = set()
        for row, state in states:
            by_key.setdefault(rows_key(self.namespace, row), {})[row[1]] = state.encode()
            months.add(row[0])
        # the shapes the states name are kept as long as they are
        self._set(by_key, [counted_shapes_key(self.namespace, month) for month in months])

    def attribute(self, rows: Iterable[tuple[str, Row, Attribution]],
                  replace: bool = True) -> None:
        """Name rows under their scopes: (scope, row, attribution); a row named before keeps
        its attribution unless ``replace``."""
        named_rows: dict[str, dict[str, str]] = {}
        shapes: dict[str, dict[str, str]] = {}
        for scope, (month, row_id), named in rows:
            named_rows.setdefault(attribution_key(self.namespace, scope, row_id), {})[
                f"{month}\t{row_id}"] = named.text
            shapes.setdefault(shapes_key(self.namespace, scope), {})[named.shape_id] = \
                named.shape
        if replace:
            self._set({**named_rows, **shapes})
            return
        self._set(shapes)
        with self.redis.pipeline(transaction=False) as pipe:
            for key, fields in named_rows.items():
                for field, value in fields.items():
                    pipe.hsetnx(key, field, value)
                pipe.expire(key, KEEP_S)
            pipe.execute()

    def unname(self, rows: Iterable[tuple[str, Row]]) -> None:
        """Take rows from under scopes that no longer hold them: (scope, row)."""
        rows = list(rows)
        if not rows:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for scope, (month, row_id) in rows:
                pipe.hdel(attribution_key(self.namespace, scope, row_id), f"{month}\t{row_id}")
            pipe.execute()

    def _set(self, by_key: dict[str, dict[str, str]], touched: Sequence[str] = ()) -> None:
        """Every key's fields, each key (and each of ``touched``) kept ``KEEP_S`` from now:
        one round trip."""
        if not by_key:
            return
        with self.redis.pipeline(transaction=False) as pipe:
            for key, fields in by_key.items():
                pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
                pipe.expire(key, KEEP_S)
            for key in touched:
                pipe.expire(key, KEEP_S)
            pipe.execute()

    def scope_rows(self, scope: str) -> list[Row]:
        """Every row named under ``scope``."""
        with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(256):
                pipe.hkeys(_attribution_key(self.namespace, scope, f"{shard:02x}"))
            found = pipe.execute()
        rows: list[Row] = []
        for fields in found:
            for field in fields:
                month, _, row_id = _text(field).partition("\t")
                rows.append((month, row_id))
        return rows

    def attributions(self, scope: str, rows: Sequence[Row]) -> list[str | None]:
        """What ``attribute`` kept of each of ``rows`` under ``scope``."""
        with self.redis.pipeline(transaction=False) as pipe:
            for month, row_id in rows:
                pipe.hget(attribution_key(self.namespace, scope, row_id), f"{month}\t{row_id}")
            found = pipe.execute()
        return [None if value is None else _text(value) for value in found]

    def shapes(self, scope: str, shape_ids: Sequence[str]) -> dict[str, str]:
        """The shapes ``attribute`` kept under ``scope``, by id."""
        ids = sorted(set(shape_ids))
        if not ids:
            return {}
        found = self.redis.hmget(shapes_key(self.namespace, scope), ids)
        return {i: _text(value) for i, value in zip(ids, found, strict=True)
                if value is not None}

    def keep_shapes(self, shapes: Iterable[tuple[str, Shape]]) -> None:
        """Keep the shapes rows of each month are counted under: (month, shape). A shape
        this ledger kept already is not written again: its id is its text's digest."""
        by_key: dict[str, dict[str, str]] = {}
        for month, kept in shapes:
            if (month, kept.id) not in self._kept:
                self._kept.add((month, kept.id))
                by_key.setdefault(counted_shapes_key(self.namespace, month), {})[kept.id] = \
                    kept.text
        self._set(by_key)

    def counted_shapes(self, wanted: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The texts of the shapes ``keep_shapes`` kept, by id: (month, shape id)."""
        by_key: dict[str, set[str]] = {}
        for month, shape_id in wanted:
            by_key.setdefault(counted_shapes_key(self.namespace, month), set()).add(shape_id)
        if not by_key:
            return {}
        asked = [(key, sorted(ids)) for key, ids in by_key.items()]
        with self.redis.pipeline(transaction=False) as pipe:
            for key, ids in asked:
                pipe.hmget(key, ids)
            found = pipe.execute()
        return {shape_id: _text(text) for (_, ids), texts in zip(asked, found, strict=True)
                for shape_id, text in zip(ids, texts, strict=True) if text is not None}

    def lock(self) -> Any:
        """redis-py's lock on this namespace's imports (``acquire(blocking=False)`` is False
        while another import holds it)."""
        return self.redis.lock(lock_key(self.namespace), timeout=LOCK_S)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
