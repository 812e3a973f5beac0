"""What a FOCUS import did: rows read and counted, events made, money by category and charge,
and the rows skipped with their amounts, each in its own currency (the import's summary)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from costline.connectors.focus import HELD, Converted, Skipped, SkipReason
from costline.connectors.focus_revision import Sent
from costline.rules.money import money_micro
from costline.rules.prices import format_micro


@dataclass
class ImportTally:
    """Rows read, events made, money by category and charge, skips by reason with their
    amounts (in each row's own currency), warnings: the summary."""

    rows: int = 0
    converted_rows: int = 0
    revised_rows: int = 0  # counted before with another amount: the difference sent
    moved_rows: int = 0  # of those, counted under another shape (tags, service): moved
    unchanged_rows: int = 0  # counted before with this amount: nothing sent
    other_basis_rows: int = 0  # of those, counted on the other cost basis, which stays
    resent_rows: int = 0  # steps an earlier import left unacknowledged, sent again as they were
    unsent_rows: int = 0  # such steps Kafka did not acknowledge this time either: next import
    recorded_rows: int = 0  # --record-only: recorded as counted by an earlier import
    missing_rows: int = 0  # --complete: named under an export of the files, not in them
    withdrawn_rows: int = 0  # of those, the ones whose counted amount was reversed
    withdrawn_micro: int = 0  # what withdrawing them sent (minus what they had counted)
    # exports whose missing rows were too many to withdraw: (label, missing, named)
    withdrawals_refused: list[tuple[str, int, int]] = field(default_factory=list)
    events: int = 0
    cost_micro: int = 0
    credits_micro: int = 0
    by_category: Counter[str] = field(default_factory=Counter)
    by_charge: Counter[str] = field(default_factory=Counter)
    skipped_rows: Counter[SkipReason] = field(default_factory=Counter)
    skipped_micro: dict[SkipReason, Counter[str]] = field(default_factory=dict)

    def count(self, outcome: Converted | Sent | Skipped | None, revised: bool = False,
              moved: bool = False) -> None:
        """A row's outcome: what was sent for it (a revision when ``revised``, a move from
        another shape when ``moved``), nothing (``None``) when it was counted before as it
        is, or why it was skipped."""
        self.rows += 1
        if isinstance(outcome, Converted):
            outcome = (outcome,)
        if outcome is None:
            self.unchanged_rows += 1
        elif isinstance(outcome, tuple):
            if revised:
                self.revised_rows += 1
                self.moved_rows += int(moved)
            else:
                self.converted_rows += 1
            for part in outcome:
                self._sent(part)
        else:
            self.skipped_rows[outcome.reason] += 1
            self.skipped_micro.setdefault(outcome.reason, Counter())[outcome.currency] += \
                outcome.micro

    def count_withdrawn(self, outcome: Sent | None) -> None:
        """A row missing from a complete export: what was sent to take it to zero, or
        ``None`` when nothing was (withdrawn before, or counted on the other cost basis)."""
        if outcome is not None:
            self.withdrawn_rows += 1
            for part in outcome:
                self.withdrawn_micro += part.micro
                self._sent(part)

    def _sent(self, outcome: Converted) -> None:
        self.events += len(outcome.events)
        self.cost_micro += outcome.micro
        self.credits_micro += max(-outcome.micro, 0)
        event = outcome.event
        self.by_category[event.category.value if event.category else "other"] += outcome.micro
        self.by_charge[event.charge.value] += outcome.micro

    def count_unsent(self, read: bool = True) -> None:
        """A row whose earlier step Kafka did not acknowledge again: nothing new was set out
        (``read``: a row of the files, not one missing from them)."""
        self.rows += read
        self.unsent_rows += 1

    @property
    def invalid_rows(self) -> int:
        """Rows skipped for a fault in the data (held rows are not)."""
        return sum(n for reason, n in self.skipped_rows.items() if reason not in HELD)

    def skipped_text(self, reason: SkipReason) -> str:
        """A skip's total for people, in each currency it has: ``-$3.00, €12.50``."""
        return ", ".join(money_micro(micro, currency)
                         for currency, micro in sorted(self.skipped_micro[reason].items()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows_read": self.rows,
            "rows_counted": self.converted_rows,
            "rows_revised": self.revised_rows,
            "rows_unchanged": self.unchanged_rows,
            "rows_moved": self.moved_rows,
            "rows_on_other_basis": self.other_basis_rows,
            "rows_resent": self.resent_rows,
            "rows_unsent": self.unsent_rows,
            "rows_recorded": self.recorded_rows,
            "rows_missing": self.missing_rows,
            "rows_withdrawn": self.withdrawn_rows,
            "withdrawn_total": format_micro(self.withdrawn_micro),
            "withdrawals_refused": [{"export": label, "missing_rows": gone, "named_rows": named}
                                    for label, gone, named in self.withdrawals_refused],
            "events": self.events,
            "cost_total": format_micro(self.cost_micro),
            "gross_total": format_micro(self.cost_micro + self.credits_micro),
            "credits_total": format_micro(self.credits_micro),
            "cost_by_category": {k: format_micro(v) for k, v in sorted(self.by_category.items())},
            "cost_by_charge": {k: format_micro(v) for k, v in sorted(self.by_charge.items())},
            "skipped": {
                reason.value: {
                    "rows": n,
                    "cost": {currency: format_micro(micro) for currency, micro
                             in sorted(self.skipped_micro[reason].items())},
                }
                for reason, n in sorted(self.skipped_rows.items())
            },
        }
