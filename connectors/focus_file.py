"""Reading a FOCUS export file: plain or gzip CSV, and the columns an import needs."""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

from costline.connectors.focus import CostBasis

REQUIRED_COLUMNS = ("ChargePeriodStart", "ServiceCategory", "BillingCurrency")


class FocusFormatError(ValueError):
    """The file is not a FOCUS export costline can read (the message says why)."""


@contextmanager
def open_focus(path: Path) -> Iterator[tuple[IO[str], IO[bytes]]]:
    """The CSV as text (gzip recognised by its magic bytes, a BOM dropped) and the raw file,
    whose position tells how far the import got."""
    with path.open("rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        binary: IO[bytes] = raw
        if compressed:
            binary = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
        text = io.TextIOWrapper(binary, encoding="utf-8-sig", newline="")
        try:
            yield text, raw
        finally:
            text.close()


def read_rows(text: IO[str], basis: CostBasis, spread: bool = False, complete: bool = False
              ) -> Iterator[dict[str, str | None]]:
    """The rows of a FOCUS CSV; refuses a file without the columns an event needs (and the
    billing period, for ``--complete``)."""
    reader = csv.DictReader(text)
    header = set(reader.fieldnames or ())
    needed = (*REQUIRED_COLUMNS, basis.column, *(["ChargePeriodEnd"] if spread else []))
    missing = [c for c in needed if c not in header]
    if missing:
        raise FocusFormatError(f"not a FOCUS export: no column {', '.join(missing)}")
    if complete and "BillingPeriodStart" not in header:
        raise FocusFormatError("no column BillingPeriodStart: --complete needs the period")
    yield from reader
