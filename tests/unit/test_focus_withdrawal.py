"""``costline import focus --complete``: a row an earlier import counted that a later export
of the same billing period no longer holds is withdrawn, once, at its own time and tags, and
nothing else is: not another provider's, account's or period's rows, not a row the export
holds but skips, not a row counted on the other cost basis."""

from __future__ import annotations

from typing import Any

from costline.connectors.focus import Converted, CostBasis, FocusConverter, billing_scope
from costline.connectors.focus_revision import RowState
from costline.connectors.focus_tally import ImportTally
from costline.connectors.focus_withdrawal import attribution, missing, rebuilt
from costline.rules.events import ChargeKind
from costline.streams.cli.focus_delivery import Delivery, Recording, row_key
from costline.streams.cli.produce_cmd import Summary
from tests.unit.test_focus import NOW, row
from tests.unit.test_focus_revision import Kafka, Memory, micro_of

SEPTEMBER = "2024-09-01 00:00:00"


def bill_row(resource: str, cost: str, **cells: str) -> dict[str, str | None]:
    return row(**{"ResourceId": resource, "EffectiveCost": cost,
                  "BillingPeriodStart": SEPTEMBER, **cells})


class Account:
    """A namespace's row memory and a worker that counts each id once."""

    def __init__(self) -> None:
        self.memory, self.summary = Memory(), Summary()
        self.kafka = Kafka(self.summary)

    def import_(self, rows: list[dict[str, str | None]], *, complete: bool = True,
                down: bool = False, dry_run: bool = False, spread: bool = False,
                basis: CostBasis = CostBasis.effective, max_percent: float = 100) -> ImportTally:
        self.kafka.down, tally = down, ImportTally()
        converter = FocusConverter(basis, "USD", now=NOW, spread=spread)
        delivery = Delivery(tally, basis, None if dry_run else self.kafka,  # type: ignore[arg-type]
                            self.memory, self.summary, complete)  # type: ignore[arg-type]
        for cells in rows:
            outcome = converter.convert(cells)
            if isinstance(outcome, Converted):
                delivery.add(outcome)
            else:
                tally.count(outcome)
        delivery.flush()
        if complete:
            delivery.withdraw(converter.scopes, converter.skipped_ids, max_percent)
        return tally

    @property
    def total(self) -> int:
        return sum(self.kafka.counted.values())


def test_a_row_missing_from_a_later_export_is_withdrawn_once_and_counted_if_it_returns(
) -> None:
    account = Account()
    # Counted by a plain import: rows counted anew are named under their export all the same.
    account.import_([bill_row("i-1", "10"), bill_row("i-2", "4.5"), bill_row("i-3", "-1")],
                    complete=False)
    assert account.total == 13_500_000

    later = [bill_row("i-1", "10"), bill_row("i-3", "-1")]
    tally = account.import_(later)
    assert (tally.rows, tally.unchanged_rows, tally.withdrawn_rows, tally.withdrawn_micro) == (
        2, 2, 1, -4_500_000)
    assert (tally.events, tally.cost_micro, dict(tally.by_charge)) == (
        1, -4_500_000, {"adjustment": -4_500_000})
    assert account.total == 9_000_000
    gone = FocusConverter(CostBasis.effective, "USD", now=NOW).convert(bill_row("i-2", "4.5"))
    assert isinstance(gone, Converted)
    withdrawal = account.kafka.counted[f"{gone.event.event_id}:r1"]
    assert withdrawal == -4_500_000

    again = account.import_(later)  # withdrawn already: nothing more
    assert (again.withdrawn_rows, again.events, account.total) == (0, 0, 9_000_000)
    back = account.import_([*later, bill_row("i-2", "7")])
    assert (back.revised_rows, back.withdrawn_rows, account.total) == (1, 0, 16_000_000)


def test_the_withdrawal_is_at_the_rows_own_time_and_tags() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-2", "2", Tags='{"team": "eval"}',
                                                   ChargePeriodStart="2024-09-20 05:00:00")])
    flight: list[Any] = []
    account.kafka.emit = flight.append  # type: ignore[method-assign]
    account.import_([bill_row("i-1", "10")])
    [event] = flight
    assert (event.ts, event.tags["team"], event.charge, micro_of(event)) == (
        "2024-09-20T05:00:00Z", "eval", ChargeKind.adjustment, -2_000_000)


def test_other_scopes_skipped_rows_and_rows_without_a_billing_period_stay() -> None:
    account = Account()
    late = bill_row("i-late", "3", BillingPeriodStart="2024-10-01 00:00:00")  # a later bill's
    other = bill_row("i-9", "5", BillingAccountId="888")
    loose = row(ResourceId="i-loose", EffectiveCost="6")  # no billing period: never named
    kept = bill_row("i-2", "4")
    account.import_([bill_row("i-1", "10"), kept, late, other, loose])
    assert account.total == 28_000_000
    # The same export, i-2 now with a cost that cannot be read: held by the file, not missing.
    tally = account.import_([bill_row("i-1", "10"), {**kept, "EffectiveCost": "n/a"}])
    assert (tally.withdrawn_rows, tally.invalid_rows, account.total) == (0, 1, 28_000_000)
    # Without --complete nothing is withdrawn.
    assert account.import_([bill_row("i-1", "10")], complete=False).withdrawn_rows == 0
    assert account.import_([bill_row("i-1", "10")]).withdrawn_rows == 1
    assert account.total == 24_000_000  # i-2 alone: September's other accounts and October stay


def test_a_row_counted_on_the_other_basis_is_left_as_it_was_counted() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-2", "4")], basis=CostBasis.billed)
    tally = account.import_([bill_row("i-1", "10")])
    assert (tally.withdrawn_rows, tally.events) == (0, 0)


def test_a_spread_row_is_withdrawn_over_the_hours_it_was_spread_over() -> None:
    account = Account()
    fee = bill_row("support", "24.000001", ChargePeriodStart="2024-09-18 00:00:00",
                   ChargePeriodEnd="2024-09-19 00:00:00", ChargeFrequency="Recurring")
    account.import_([bill_row("i-1", "10"), fee], spread=True)
    counted = dict(account.kafka.counted)
    tally = account.import_([bill_row("i-1", "10")], spread=True)
    assert (tally.withdrawn_rows, tally.events) == (1, 24)
    sent = {k: v for k, v in account.kafka.counted.items() if k not in counted}
    pieces = {k.rsplit(":r1/", 1)[1]: v for k, v in sent.items()}
    assert sorted(int(k) for k in pieces) == list(range(24))
    assert sum(pieces.values()) == -24_000_001 and account.total == 10_000_000


def test_a_withdrawal_kafka_did_not_take_goes_again_as_it_was() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-2", "4")])
    failed = account.import_([bill_row("i-1", "10")], down=True)
    assert (failed.withdrawn_rows, account.total) == (1, 14_000_000)  # set out, not taken
    tally = account.import_([bill_row("i-1", "10")])
    assert (tally.resent_rows, tally.withdrawn_rows, account.total) == (1, 0, 10_000_000)


def test_a_dry_run_tallies_the_withdrawal_and_changes_nothing() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-2", "4")])
    held, named = dict(account.memory.held), dict(account.memory.named)
    tally = account.import_([bill_row("i-1", "10")], dry_run=True)
    assert (tally.withdrawn_rows, tally.withdrawn_micro) == (1, -4_000_000)
    assert (account.memory.held, account.memory.named, account.total) == (held, named,
                                                                         14_000_000)


def test_an_attribution_rebuilds_the_row_at_zero() -> None:
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW, spread=True)
    outcome = converter.convert(bill_row("fee", "5", ChargePeriodStart="2024-09-18 00:00:00",
                                         ChargePeriodEnd="2024-09-18 03:00:00"))
    assert isinstance(outcome, Converted) and outcome.scope == billing_scope(
        {"ProviderName": "AWS", "BillingAccountId": "999", "BillingPeriodStart": SEPTEMBER})
    named = attribution(outcome)
    again = rebuilt(outcome.event.event_id, named.text, {named.shape_id: named.shape},
                    outcome.scope)
    assert again.micro == 0 and row_key(again) == row_key(outcome)
    assert [(e.event_id, e.ts, e.tags) for e in again.events] == \
        [(e.event_id, e.ts, e.tags) for e in outcome.events]


def test_missing_names_what_is_neither_held_nor_skipped() -> None:
    named = [("2024-09", "focus:aa"), ("2024-09", "focus:bb:2"), ("2024-09", "focus:cc")]
    assert missing(named, {("2024-09", "focus:aa")}, {"focus:bb:2"}) == [
        ("2024-09", "focus:cc")]


def test_a_state_keeps_the_export_that_last_held_its_row() -> None:
    assert RowState("effective", 0, 1).encode() == "effective:0:1:"
    held = RowState("effective", 5, 2, None, "8f0b7cafc56c3b42")
    assert held.encode() == "effective:5:2::8f0b7cafc56c3b42"
    assert RowState.decode(held.encode()) == held
    assert held.held_by("") == held and held.held_by("aa").scope == "aa"


def test_an_export_missing_too_many_of_its_rows_withdraws_none_of_them() -> None:
    """A file cut short looks like a restatement that dropped most rows."""
    account = Account()
    rows = [bill_row(f"i-{n}", "1") for n in range(10)]
    account.import_(rows)
    tally = account.import_(rows[:8], max_percent=10)
    assert tally.withdrawals_refused == [
        ("AWS account 999 period 2024-09-01T00:00:00Z", 2, 10)]
    assert (tally.withdrawn_rows, tally.as_dict()["withdrawals_refused"], account.total) == (
        0, [{"export": "AWS account 999 period 2024-09-01T00:00:00Z", "missing_rows": 2,
             "named_rows": 10}], 10_000_000)
    assert account.import_(rows[:9], max_percent=10).withdrawn_rows == 1  # one of ten: 10 %
    assert account.import_(rows[:8], max_percent=100).withdrawn_rows == 1  # the other one
    assert account.total == 8_000_000


def test_a_row_now_on_another_periods_bill_is_not_withdrawn_from_the_first() -> None:
    """Its id does not depend on the billing period: September's restated export without it
    leaves it to October's, which holds it now."""
    account = Account()
    moving = bill_row("i-9", "7")
    account.import_([bill_row("i-1", "10"), moving])
    october = {**moving, "BillingPeriodStart": "2024-10-01 00:00:00"}
    account.import_([october], complete=False)  # unchanged: only its export is noted
    tally = account.import_([bill_row("i-1", "10")])  # September, restated without it
    assert (tally.missing_rows, tally.withdrawn_rows, account.total) == (0, 0, 17_000_000)
    # Gone from October's too: withdrawn there, once, also with both exports in one import.
    tally = account.import_([bill_row("i-1", "10"),
                             bill_row("i-2", "1", BillingPeriodStart="2024-10-01 00:00:00")])
    assert (tally.missing_rows, tally.withdrawn_rows, account.total) == (1, 1, 11_000_000)


def test_a_split_line_skipped_keeps_its_number_and_its_amount() -> None:
    """Two lines of one identity (tags are not part of it); the first one's cost can no longer
    be read: it keeps what it counted, and the second keeps its own id."""
    account = Account()
    first, second = bill_row("i-1", "5", Tags='{"team": "a"}'), bill_row("i-1", "3",
                                                                          Tags='{"team": "b"}')
    account.import_([first, second])
    unreadable = {**first, "EffectiveCost": "n/a"}
    tally = account.import_([unreadable, second])
    assert (tally.unchanged_rows, tally.missing_rows, account.total) == (1, 0, 8_000_000)
    tally = account.import_([unreadable])  # the second line dropped: withdrawn alone
    assert (tally.withdrawn_rows, tally.withdrawn_micro, account.total) == (
        1, -3_000_000, 5_000_000)


def test_a_row_is_withdrawn_the_way_it_was_counted_not_as_a_later_import_converted_it(
) -> None:
    account = Account()
    fee = bill_row("support", "24", ChargePeriodStart="2024-09-18 00:00:00",
                   ChargePeriodEnd="2024-09-19 00:00:00", ChargeFrequency="Recurring")
    account.import_([bill_row("i-1", "10"), fee])  # counted as one event
    account.import_([bill_row("i-1", "10"), fee], spread=True)  # unchanged, spread this time
    counted = set(account.kafka.counted)
    tally = account.import_([bill_row("i-1", "10")], spread=True)
    sent = {k: v for k, v in account.kafka.counted.items() if k not in counted}
    assert (tally.withdrawn_rows, list(sent.values())) == (1, [-24_000_000])
    assert not any("/" in k for k in sent)  # one event, at the hour it was counted at


def test_a_named_row_with_nothing_counted_is_not_withdrawn() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-2", "4")])
    kept = FocusConverter(CostBasis.effective, "USD", now=NOW).convert(bill_row("i-1", "10"))
    assert isinstance(kept, Converted)
    gone = next(key for key in account.memory.held if key != row_key(kept))
    del account.memory.held[gone]  # its state lost, its name kept
    tally = account.import_([bill_row("i-1", "10")])
    assert (tally.missing_rows, tally.withdrawn_rows, tally.events) == (1, 0, 0)


def test_a_billing_period_left_empty_is_a_warning() -> None:
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    converter.convert(row(BillingPeriodStart="NULL"))
    converter.convert(row())  # a file without the column: nothing to warn about
    assert converter.warnings == {"no_billing_period": 1}


def test_a_row_on_another_bill_while_its_step_was_pending_is_that_bills_to_withdraw() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-9", "7")])
    account.import_([bill_row("i-1", "10"), bill_row("i-9", "8")], down=True)  # pending
    october = bill_row("i-9", "8", BillingPeriodStart="2024-10-01 00:00:00")
    account.import_([october], complete=False)  # the pending step goes, on October's bill
    assert account.total == 18_000_000
    assert account.import_([bill_row("i-1", "10")]).missing_rows == 0  # not September's
    tally = account.import_([bill_row("i-2", "1", BillingPeriodStart="2024-10-01 00:00:00")])
    assert (tally.withdrawn_rows, account.total) == (1, 11_000_000)


def test_a_row_on_another_bill_with_another_amount_leaves_the_first_bill() -> None:
    account = Account()
    rows = [bill_row(f"i-{n}", "1") for n in range(10)]
    account.import_(rows)
    october = [{**row, "EffectiveCost": "2", "BillingPeriodStart": "2024-10-01 00:00:00"}
               for row in rows[:2]]
    account.import_(october)
    tally = account.import_(rows[2:], max_percent=10)  # September holds the other eight
    assert (tally.withdrawals_refused, tally.missing_rows, account.total) == ([], 0, 12_000_000)


def test_the_guard_counts_the_rows_missing_now_not_those_withdrawn_before() -> None:
    account = Account()
    rows = [bill_row(f"i-{n}", "1") for n in range(20)]
    account.import_(rows)
    assert account.import_(rows[2:], max_percent=100).withdrawn_rows == 2
    tally = account.import_(rows[3:], max_percent=10)  # one more of the 18 left
    assert (tally.withdrawals_refused, tally.missing_rows, tally.withdrawn_rows) == ([], 1, 1)
    assert account.total == 17_000_000


def test_recording_an_export_notes_the_bill_each_row_is_on_now() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10"), bill_row("i-9", "7")])
    recording = Recording(ImportTally(), CostBasis.effective, account.memory)  # type: ignore[arg-type]
    converter = FocusConverter(CostBasis.effective, "USD", now=NOW)
    moved = converter.convert(bill_row("i-9", "7", BillingPeriodStart="2024-10-01 00:00:00"))
    assert isinstance(moved, Converted)
    recording.add(moved)
    recording.flush()
    tally = account.import_([bill_row("i-1", "10")])  # September's export, without it
    assert (tally.missing_rows, account.total) == (0, 17_000_000)


def test_a_state_from_before_the_export_was_kept_keeps_the_way_its_row_was_counted() -> None:
    account = Account()
    fee = bill_row("support", "24", ChargePeriodStart="2024-09-18 00:00:00",
                   ChargePeriodEnd="2024-09-19 00:00:00", ChargeFrequency="Recurring")
    account.import_([bill_row("i-1", "10"), fee])  # counted as one event
    for key, state in list(account.memory.held.items()):  # as an older costline left them
        account.memory.held[key] = RowState.decode(":".join(state.encode().split(":")[:4]))
    account.import_([bill_row("i-1", "10"), fee], spread=True, complete=False)
    counted = set(account.kafka.counted)
    account.import_([bill_row("i-1", "10")], spread=True)
    sent = [k for k in account.kafka.counted if k not in counted]
    assert len(sent) == 1 and "/" not in sent[0] and account.total == 10_000_000
