"""``costline import focus`` on real FOCUS billing data, through real Kafka, the real worker
and Redis: what ``costline spend`` reports equals the sums taken straight from the CSV.

The data is the FinOps Foundation's FOCUS 1.0 sample (``FOCUS-Sample-Data``,
``FOCUS-1.0/focus_sample.csv``, 1,000 anonymized rows from AWS, Google Cloud, Microsoft and
Oracle), licensed CC BY 4.0: https://creativecommons.org/licenses/by/4.0/ — see
``/work/shared/data/focus/README.md`` and ``LICENSE.md``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.focus import missing_prices, price_book_lines
from costline.rules.prices import PriceBook
from costline.streams.settings import Settings
from costline.streams.topics import create_topics
from tests.integration.streamkit import (
    REPO,
    Worker,
    rows_by_group,
    run_cli,
    spend_json,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration

SAMPLE = Path("/work/shared/data/focus/focus_1.0_sample_1000.csv")
MONTH = ["--period", "month", "--at", "2024-09-15T00:00:00Z"]
# The documented ServiceCategory mapping (docs/FOCUS.md), written out independently here.
CATEGORY = {
    "AI and Machine Learning": "compute", "Compute": "compute", "Databases": "database",
    "Identity": "security", "Integration": "other", "Management and Governance": "observability",
    "Networking": "network", "Other": "other", "Security": "security", "Storage": "storage",
}


def expected_spend(column: str, key: str) -> dict[tuple[str, ...], int]:
    """Per group, the row amounts rounded to micro-units half to even and summed; negative
    amounts (credits, refunds) are reported by the import, never counted as spend."""
    totals: dict[tuple[str, ...], int] = {}
    with SAMPLE.open(newline="") as handle:
        for row in csv.DictReader(handle):
            amount = Decimal(row[column])
            if amount < 0:
                continue
            micro = int((amount * 1_000_000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
            group = (CATEGORY[row["ServiceCategory"]] if key == "category"
                     else row["SubAccountId"],)
            totals[group] = totals.get(group, 0) + micro
    return {group: micro for group, micro in totals.items() if micro}


@pytest.fixture
def prices(tmp_path: Path) -> Path:
    """The example price book plus whatever ``focus.*`` entries it does not have yet."""
    example = REPO / "rules" / "prices" / "example.yaml"
    missing = missing_prices(PriceBook.load(example))
    path = tmp_path / "prices.yaml"
    path.write_text(example.read_text().rstrip("\n") + "\n"
                    + "\n".join(price_book_lines("USD", missing)) + "\n")
    return path


@pytest.fixture
def worker(services: Any, kafka_namespace: str, prices: Path, tmp_path: Path
           ) -> Iterator[Worker]:
    env = worker_env(kafka_namespace, services.bootstrap, services.redis_url,
                     COSTLINE_PRICES=str(prices))
    create_topics(Settings(kafka_bootstrap=services.bootstrap, namespace=kafka_namespace,
                           partitions=4))
    proc = Worker(env, tmp_path / "worker.log")
    proc.start()
    yield proc
    proc.stop()


def import_focus(worker: Worker, *args: str) -> dict[str, Any]:
    done = run_cli(worker.env, "import", "focus", str(SAMPLE), "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def caught_up(worker: Worker, services: Any) -> None:
    wait_caught_up(worker.env, worker)


def spend_by(worker: Worker, key: str) -> dict[tuple[str, ...], int]:
    return rows_by_group(spend_json(worker.env, "--by", key, *MONTH), [key], "cost")


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"the FOCUS sample is not at {SAMPLE}")
def test_spend_of_the_billing_month_equals_the_csv_to_the_micro_unit(
    services: Any, worker: Worker,
) -> None:
    summary = import_focus(worker)
    assert (summary["rows_read"], summary["failed_messages"]) == (1000, 0)
    assert summary["sent_events"] == summary["events"] == 1000 - sum(
        skip["rows"] for skip in summary["skipped"].values())
    assert set(summary["skipped"]) == {"credit", "negative_cost"}
    caught_up(worker, services)

    by_category = spend_by(worker, "category")
    assert by_category == expected_spend("EffectiveCost", "category")
    assert spend_by(worker, "sub_account") == expected_spend("EffectiveCost", "sub_account")
    assert sum(by_category.values()) == int(Decimal(summary["cost_total"]) * 1_000_000)


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"the FOCUS sample is not at {SAMPLE}")
def test_a_reimport_in_other_batches_or_cost_basis_counts_nothing_twice(
    services: Any, worker: Worker,
) -> None:
    """Every event travels on its own id's partition, where the worker remembers it."""
    import_focus(worker, "--cost", "billed")
    caught_up(worker, services)
    first = spend_by(worker, "sub_account")
    assert first == expected_spend("BilledCost", "sub_account")

    again = import_focus(worker, "--batch", "7")
    assert again["sent_messages"] > 100
    import_focus(worker, "--cost", "billed", "--batch", "1000")
    caught_up(worker, services)
    assert spend_by(worker, "sub_account") == first
