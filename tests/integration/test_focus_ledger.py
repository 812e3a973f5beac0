"""The FOCUS row memory in a real Redis, single and Cluster: rows' states, and the rows named
under their export, read back whole (``--complete`` lists a scope's rows over 256 shards in
one pipeline, which a cluster client splits by slot)."""

from __future__ import annotations

import secrets

import pytest

from costline.connectors.focus import Converted, CostBasis, FocusConverter
from costline.connectors.focus_ledger import KEEP_S, RowLedger, counted_shapes_key
from costline.connectors.focus_revision import RowState
from costline.connectors.focus_shape import shape
from costline.connectors.focus_withdrawal import attribution, rebuilt
from costline.connectors.redis_client import connect
from costline.streams.cli.focus_delivery import row_key
from tests.conftest import forget_redis_keys
from tests.unit.test_focus import NOW, row

pytestmark = pytest.mark.integration


def test_named_rows_read_back_whole_per_scope(any_redis_url: str) -> None:
    namespace = "t" + secrets.token_hex(5)
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    rows: list[Converted] = []
    for index in range(600):
        outcome = converter.convert(row(
            ResourceId=f"i-{index}", EffectiveCost=f"{index}.5",
            BillingPeriodStart="2024-09-01 00:00:00",
            BillingAccountId="999" if index % 3 else "888"))
        assert isinstance(outcome, Converted)
        rows.append(outcome)
    try:
        with connect(any_redis_url) as redis:
            ledger = RowLedger(redis, namespace)
            ledger.attribute((r.scope, row_key(r), attribution(r)) for r in rows)
            ledger.write((row_key(r), RowState("effective", r.micro)) for r in rows)
            by_scope: dict[str, set[tuple[str, str]]] = {}
            for r in rows:
                by_scope.setdefault(r.scope, set()).add(row_key(r))
            assert len(by_scope) == 2
            for scope, keys in by_scope.items():
                named = ledger.scope_rows(scope)
                assert sorted(named) == sorted(keys)
                texts = ledger.attributions(scope, named)
                assert all(texts)
                shapes = ledger.shapes(scope, [t.split("\t")[2] for t in texts if t])
                again = [rebuilt(key[1], text, shapes, scope)
                         for key, text in zip(named, texts, strict=True) if text]
                original = {row_key(r): r for r in rows}
                assert [(a.event.event_id, a.event.ts, a.event.tags, a.micro) for a in again] == [
                    (original[k].event.event_id, original[k].event.ts, original[k].event.tags, 0)
                    for k in named]
            assert ledger.states([row_key(rows[7])]) == [RowState("effective", 7_500_000)]
            kept = {shape(r) for r in rows}
            ledger.keep_shapes((row_key(r)[0], shape(r)) for r in rows)
            wanted = [("2024-09", k.id) for k in kept] + [("2024-09", "0" * 16),
                                                           ("2024-08", next(iter(kept)).id)]
            assert ledger.counted_shapes(wanted) == {k.id: k.text for k in kept}
            shapes_key = counted_shapes_key(namespace, "2024-09")
            redis.expire(shapes_key, 60)
            ledger.write([(row_key(rows[0]), RowState("effective", 1))])
            assert redis.ttl(shapes_key) > KEEP_S - 60  # kept as long as the states
            ledger.unname([(rows[7].scope, row_key(rows[7]))])
            assert row_key(rows[7]) not in ledger.scope_rows(rows[7].scope)
            assert len(ledger.scope_rows(rows[7].scope)) == len(by_scope[rows[7].scope]) - 1
    finally:
        forget_redis_keys(any_redis_url, namespace)
