"""The price book's dated exchange rates: which rate holds when, exact conversion, and bad
tables reported as ``FILE:LINE:COL``."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from costline.rules.prices import PriceBook
from costline.rules.yaml_source import SourceInvalid

BOOK = """currency: USD
prices:
  gpu.h100: {unit: gpu_hour, price: 2.49, category: compute}
rates:
  EUR:
    - {from: 2024-01-01, rate: 1.0931}
    - {from: 2024-07-01, rate: 1.0712}
  JPY:
    - {from: 2024-09-01, rate: 0.006921}
"""


def load(tmp_path: Path, text: str) -> PriceBook:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    return PriceBook.load(path)


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("currency", "when", "rate"), [
    ("EUR", "2024-01-01T00:00:00", Decimal("1.0931")),
    ("EUR", "2024-06-30T23:59:59", Decimal("1.0931")),
    ("EUR", "2024-07-01T00:00:00", Decimal("1.0712")),
    ("EUR", "2031-01-01T00:00:00", Decimal("1.0712")),  # the last rate holds from then on
    ("EUR", "2023-12-31T23:59:59", None),  # before the first date: no rate held yet
    ("JPY", "2024-09-18T22:00:00", Decimal("0.006921")),
    ("GBP", "2024-09-18T22:00:00", None),
])
def test_a_rate_holds_from_its_date_until_the_next(
    tmp_path: Path, currency: str, when: str, rate: Decimal | None,
) -> None:
    assert load(tmp_path, BOOK).rates.rate(currency, moment(when)) == rate


def test_the_date_is_the_utc_date_of_the_moment(tmp_path: Path) -> None:
    rates = load(tmp_path, BOOK).rates
    before_midnight_utc = datetime.fromisoformat("2024-07-01T01:00:00+02:00")
    assert rates.rate("EUR", before_midnight_utc) == Decimal("1.0931")


def test_conversion_is_exact(tmp_path: Path) -> None:
    rates = load(tmp_path, BOOK).rates
    assert rates.convert(Decimal("-3.00000000001"), "EUR", moment("2024-09-18T00:00:00")) \
        == Decimal("-3.2136000000107120")
    assert rates.convert(Decimal("12"), "GBP", moment("2024-09-18T00:00:00")) is None


def test_a_book_without_rates_has_none(tmp_path: Path) -> None:
    book = load(tmp_path, BOOK.split("rates:")[0])
    assert book.rates.currencies == []
    assert book.rates.rate("EUR", moment("2024-09-18T00:00:00")) is None


@pytest.mark.parametrize(("rates", "line", "col", "words"), [
    ("  EUR:\n    - {from: 2024-07-01, rate: 1.07}\n    - {from: 2024-01-01, rate: 1.09}\n",
     5, 3, ["rates.EUR", "ascending"]),
    ("  EUR:\n    - {from: 2024-07-01, rate: 1.07}\n    - {from: 2024-07-01, rate: 1.09}\n",
     5, 3, ["each date once"]),
    ("  EUR:\n    - {from: 2024-07-01, rate: 0}\n", 6, 26, ["rates.EUR.0.rate", "greater than 0"]),
    ("  EUR:\n    - {from: someday, rate: 1.07}\n", 6, 8, ["rates.EUR.0.from", "date"]),
    ("  EUR: []\n", 5, 3, ["rates.EUR", "at least one dated rate"]),
    ("  euro:\n    - {from: 2024-07-01, rate: 1.07}\n", 5, 3, ["rates.euro", "pattern"]),
    ("  USD:\n    - {from: 2024-07-01, rate: 1}\n", 4, 1, ["USD is the book's own currency"]),
])
def test_a_bad_rate_table_reports_file_line_and_column(
    tmp_path: Path, rates: str, line: int, col: int, words: list[str],
) -> None:
    text = BOOK.split("rates:")[0] + "rates:\n" + rates
    with pytest.raises(SourceInvalid) as caught:
        load(tmp_path, text)
    [error] = caught.value.errors
    assert (error.line, error.col) == (line, col), str(error)
    for word in words:
        assert word in error.message, str(error)


def test_a_misnamed_key_is_reported_with_the_missing_one(tmp_path: Path) -> None:
    text = BOOK.split("rates:")[0] + "rates:\n  EUR:\n    - {since: 2024-07-01, rate: 1.07}\n"
    with pytest.raises(SourceInvalid) as caught:
        load(tmp_path, text)
    assert [(e.line, e.col, e.message) for e in caught.value.errors] == [
        (6, 7, "rates.EUR.0.from: Field required"),
        (6, 8, "rates.EUR.0.since: Extra inputs are not permitted"),
    ]
