"""A bill row restated under other tags (or another service category) keeps its id,
so a later import moves what it counted: minus under the shape it was counted under, plus under
the row's shape now. Whatever Kafka acknowledges, in whatever order the exports come, what a
worker that counts each event id once holds by tag is the latest export's."""

from __future__ import annotations

from costline.connectors.focus import Converted, CostBasis, FocusConverter
from costline.connectors.focus_revision import RowState, next_step
from costline.connectors.focus_shape import row_in, shape
from costline.rules.events import ChargeKind
from costline.streams.cli.focus_delivery import row_key
from tests.unit.test_focus import NOW
from tests.unit.test_focus_revision import micro_of
from tests.unit.test_focus_withdrawal import Account, bill_row


def team(name: str) -> str:
    return f'{{"team": "{name}"}}'


def test_a_row_restated_under_other_tags_moves_its_money_there() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("pretrain")),
                     bill_row("i-2", "4", Tags=team("eval"))], complete=False)
    assert account.kafka.by("team") == {"eval": 4_000_000, "pretrain": 10_000_000}
    flight_before = set(account.kafka.counted)

    tally = account.import_([bill_row("i-1", "10", Tags=team("posttrain")),
                             bill_row("i-2", "4", Tags=team("eval"))], complete=False)
    assert account.kafka.by("team") == {"eval": 4_000_000, "posttrain": 10_000_000}
    assert (tally.revised_rows, tally.moved_rows, tally.unchanged_rows, tally.events,
            tally.cost_micro) == (1, 1, 1, 2, 0)
    # -10 under the old tags, then +10 under the new ones: revisions 1 and 2 of the row
    sent = {k.rsplit(":", 1)[1]: (account.kafka.tags[k]["team"], account.kafka.counted[k])
            for k in account.kafka.counted if k not in flight_before}
    assert sent == {"r1": ("pretrain", -10_000_000), "r2": ("posttrain", 10_000_000)}

    again = account.import_([bill_row("i-1", "12", Tags=team("posttrain"))], complete=False)
    assert (again.moved_rows, account.kafka.by("team")) == (
        0, {"eval": 4_000_000, "posttrain": 12_000_000})


def test_a_move_with_a_new_amount_and_back_leaves_each_tag_at_the_latest_export() -> None:
    account = Account()
    for tags, cost in ((team("a"), "10"), (team("b"), "12.5"), (team("a"), "3"),
                       ('{"team": "a", "owner": "kim"}', "3"), ("{}", "-1")):
        account.import_([bill_row("i-1", cost, Tags=tags)], complete=False)
        expected = {"": -1_000_000} if tags == "{}" else {tags[10]: round(float(cost) * 1e6)}
        assert account.kafka.by("team") == expected
    assert account.kafka.by("owner") == {"": -1_000_000}


def test_split_lines_that_swap_their_tags_keep_each_tags_money() -> None:
    """Two lines of one identity, numbered by their order: reordered, each line moves."""
    account = Account()
    account.import_([bill_row("i-1", "5", Tags=team("a")), bill_row("i-1", "3", Tags=team("b"))],
                    complete=False)
    tally = account.import_([bill_row("i-1", "3", Tags=team("b")),
                             bill_row("i-1", "5", Tags=team("a"))], complete=False)
    assert (tally.moved_rows, account.kafka.by("team")) == (2, {"a": 5_000_000, "b": 3_000_000})


def test_a_row_moved_and_then_missing_is_withdrawn_from_where_it_is_counted() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("a")), bill_row("i-2", "4", Tags=team("b"))])
    account.import_([bill_row("i-1", "10", Tags=team("a")), bill_row("i-2", "6", Tags=team("c"))])
    assert account.kafka.by("team") == {"a": 10_000_000, "c": 6_000_000}
    tally = account.import_([bill_row("i-1", "10", Tags=team("a"))])
    assert (tally.withdrawn_rows, tally.withdrawn_micro) == (1, -6_000_000)
    assert account.kafka.by("team") == {"a": 10_000_000}


def test_a_move_kafka_did_not_acknowledge_goes_again_as_it_was() -> None:
    """Set out from a to b, taken by the broker without a word: the next import, whose export
    says c, sends the a-to-b move again under the same ids and tags (counted once), then b to
    c."""
    for unanswered in (False, True):
        account = Account()
        account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
        account.kafka.unanswered = unanswered
        tally = account.import_([bill_row("i-1", "12", Tags=team("b"))], complete=False,
                                down=not unanswered)
        assert tally.moved_rows == 1
        account.kafka.unanswered = False
        state = next(iter(account.memory.held.values()))
        assert state.moving and state.pending == 12_000_000
        tally = account.import_([bill_row("i-1", "7", Tags=team("c"))], complete=False)
        assert (tally.resent_rows, tally.moved_rows) == (1, 1)
        assert account.kafka.by("team") == {"c": 7_000_000}
        assert sum(account.kafka.counted.values()) == 7_000_000


def test_a_state_from_before_shapes_were_kept_learns_its_shape_without_sending() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
    key, state = next(iter(account.memory.held.items()))
    account.memory.held[key] = RowState(state.basis, state.micro, state.step,
                                        scope=state.scope)  # as an older costline wrote it
    account.memory.counted.clear()
    tally = account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
    assert (tally.unchanged_rows, tally.events) == (1, 0)
    assert account.memory.held[key].shape == state.shape
    account.import_([bill_row("i-1", "10", Tags=team("b"))], complete=False)
    assert account.kafka.by("team") == {"b": 10_000_000}


def test_without_the_old_shapes_text_only_the_difference_reaches_the_new_tags() -> None:
    """The memory lost the shape (its key evicted): what was counted cannot be taken from
    under its tags, so the new ones get the difference; the step keeps a move's ids."""
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
    account.memory.counted.clear()
    tally = account.import_([bill_row("i-1", "12", Tags=team("b"))], complete=False)
    assert (tally.revised_rows, tally.moved_rows) == (1, 0)
    assert account.kafka.by("team") == {"a": 10_000_000, "b": 2_000_000}
    assert next(iter(account.memory.held.values())).step == 2


def test_a_dry_run_tallies_the_move_and_changes_nothing() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
    held = dict(account.memory.held)
    tally = account.import_([bill_row("i-1", "10", Tags=team("b"))], complete=False,
                            dry_run=True)
    assert (tally.moved_rows, tally.events) == (1, 2)
    assert account.memory.held == held and account.kafka.by("team") == {"a": 10_000_000}


def test_a_spread_row_moves_hour_by_hour() -> None:
    day = {"ChargePeriodStart": "2024-09-18 00:00:00", "ChargePeriodEnd": "2024-09-19 00:00:00"}
    account = Account()
    account.import_([bill_row("i-1", "24.000005", Tags=team("a"), **day)], complete=False,
                    spread=True)
    account.import_([bill_row("i-1", "24.000005", Tags=team("b"), **day)], complete=False,
                    spread=True)
    assert account.kafka.by("team") == {"b": 24_000_005}
    hourly: dict[tuple[str, str], int] = {}
    for event_id, micro in account.kafka.counted.items():
        hour = event_id.rsplit("/", 1)[1]
        where = (account.kafka.tags[event_id]["team"], hour)
        hourly[where] = hourly.get(where, 0) + micro
    assert {k: v for k, v in hourly.items() if k[0] == "a" and v} == {}
    assert hourly[("b", "0")] == 1_000_000 and hourly[("b", "23")] == 1_000_005


def test_the_move_is_two_adjustments_under_the_old_and_the_new_shape() -> None:
    convert = FocusConverter(CostBasis.effective, "USD", now=NOW).convert
    before = convert(bill_row("i-1", "10", Tags=team("a"), ServiceCategory="Compute"))
    now = FocusConverter(CostBasis.effective, "USD", now=NOW).convert(
        bill_row("i-1", "10", Tags=team("b"), ServiceCategory="Storage"))
    assert isinstance(before, Converted) and isinstance(now, Converted)
    assert row_key(before) == row_key(now) and shape(before) != shape(now)
    state = RowState("effective", before.micro, 1, shape=shape(before).id)
    step = next_step(now, "effective", state, {shape(before).id: shape(before).text})
    assert step is not None
    (out, into), ahead, done = step
    assert [(p.event.event_id, p.event.charge, micro_of(p.event), p.event.tags["team"],
             str(p.event.category)) for p in (out, into)] == [
        (f"{now.event.event_id}:r2", ChargeKind.adjustment, -10_000_000, "a", "compute"),
        (f"{now.event.event_id}:r3", ChargeKind.adjustment, 10_000_000, "b", "storage")]
    assert (out.event.ts, out.event.resource_id) == (now.event.ts, now.event.resource_id)
    assert ahead == RowState("effective", before.micro, 1, 10_000_000, shape=shape(before).id,
                             to=shape(now).id)
    assert done == RowState("effective", now.micro, 3, scope=now.scope, shape=shape(now).id)
    assert shape(row_in(shape(before).text, now)) == shape(before)


def as_older_costline(account: Account) -> None:
    """The states as a costline before shapes were kept wrote them, and no shapes kept."""
    for key, state in list(account.memory.held.items()):
        account.memory.held[key] = RowState.decode(":".join(state.encode().split(":")[:4]))
    account.memory.counted.clear()


def test_an_older_state_restated_on_its_first_import_moves_from_where_it_was_counted(
) -> None:
    """The export named the row under the shape of the last step sent for it: that is where
    its amount is, not under the tags this export gives it."""
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
    as_older_costline(account)
    tally = account.import_([bill_row("i-1", "10", Tags=team("b"))], complete=False)
    assert (tally.moved_rows, account.kafka.by("team")) == (1, {"b": 10_000_000})
    account.import_([bill_row("i-1", "10", Tags=team("b"))])
    assert account.kafka.by("team") == {"b": 10_000_000}


def test_an_older_pending_step_resent_keeps_its_shape_for_a_later_move() -> None:
    account = Account()
    account.import_([bill_row("i-1", "10", Tags=team("a"))], complete=False)
    account.import_([bill_row("i-1", "12", Tags=team("a"))], complete=False, down=True)
    as_older_costline(account)  # an older costline left the step pending
    account.import_([bill_row("i-1", "12", Tags=team("a"))], complete=False)  # resent
    account.import_([bill_row("i-1", "12", Tags=team("b"))], complete=False)
    assert account.kafka.by("team") == {"b": 12_000_000}


def test_a_move_resent_without_its_neighbours_is_still_a_move() -> None:
    """The shape a move starts from was known from another row of the chunk only (the month's
    shapes lost); the broker took the move without a word. Resent by an import without that
    row, it keeps a move's ids, so the next revision is not taken for a copy."""
    account = Account()
    two = [bill_row("i-1", "10", Tags=team("a")), bill_row("i-2", "2", Tags=team("a"))]
    account.import_(two, complete=False)
    account.memory.counted.clear()
    account.kafka.unanswered = True
    account.import_([bill_row("i-1", "10", Tags=team("b")), two[1]], complete=False)
    account.kafka.unanswered = False
    account.import_([bill_row("i-1", "10", Tags=team("b"))])  # i-2 withdrawn
    account.import_([bill_row("i-1", "15", Tags=team("b"))])
    assert account.kafka.by("team") == {"b": 15_000_000}


def test_a_row_of_no_amount_or_a_change_of_sign_is_not_a_move() -> None:
    account = Account()
    account.import_([bill_row("i-1", "0", Tags=team("a")), bill_row("i-2", "5", Tags=team("a"))],
                    complete=False)
    tally = account.import_([bill_row("i-1", "0", Tags=team("b")),
                             bill_row("i-2", "-1", Tags=team("a"))], complete=False)
    assert (tally.unchanged_rows, tally.revised_rows, tally.moved_rows, tally.events) == (
        1, 1, 0, 1)
    assert account.kafka.by("team") == {"a": -1_000_000}
    account.import_([bill_row("i-1", "3", Tags=team("b")),
                     bill_row("i-2", "-1", Tags=team("a"))], complete=False)
    assert account.kafka.by("team") == {"a": -1_000_000, "b": 3_000_000}


DAY = {"ChargePeriodStart": "2024-09-18 00:00:00", "ChargePeriodEnd": "2024-09-19 00:00:00",
       "ChargeFrequency": "Recurring"}


def test_a_step_is_resent_in_the_form_it_was_set_out_in_whatever_this_imports_spread(
) -> None:
    """Taken by the broker without a word, spread over 24 hours (or as one event); resent by
    an import with the other ``--spread`` choice: the same ids, counted once."""
    for spread_first in (True, False):
        for tags in (team("a"), team("b")):  # a revision, and a move
            account = Account()
            account.import_([bill_row("i-1", "24", Tags=team("a"), **DAY)], complete=False,
                            spread=spread_first)
            account.kafka.unanswered = True
            account.import_([bill_row("i-1", "30", Tags=tags, **DAY)], complete=False,
                            spread=spread_first)
            account.kafka.unanswered = False
            tally = account.import_([bill_row("i-1", "30", Tags=tags, **DAY)],
                                    complete=False, spread=not spread_first)
            assert tally.resent_rows == 1
            assert account.kafka.by("team") == {tags[10]: 30_000_000}, (spread_first, tags)


def test_an_older_pending_spread_step_is_resent_spread() -> None:
    account = Account()
    account.import_([bill_row("i-1", "24", Tags=team("a"), **DAY)], complete=False, spread=True)
    account.kafka.unanswered = True
    account.import_([bill_row("i-1", "30", Tags=team("a"), **DAY)], complete=False,
                    spread=True)
    account.kafka.unanswered = False
    as_older_costline(account)  # its export named it spread when the step was set out
    account.import_([bill_row("i-1", "30", Tags=team("a"), **DAY)], complete=False)
    assert account.kafka.by("team") == {"a": 30_000_000}


def test_a_row_is_revised_in_the_form_it_was_counted_in() -> None:
    """The first form stays, as the first cost basis does: a row counted as one event is
    revised as one, one counted hour by hour is revised hour by hour, whatever a later
    import's ``--spread``; so each hour keeps what the bill says of it."""
    for spread_first in (True, False):
        account = Account()
        account.import_([bill_row("i-1", "24", Tags=team("a"), **DAY)], complete=False,
                        spread=spread_first)
        counted = set(account.kafka.counted)
        account.import_([bill_row("i-1", "48", Tags=team("b"), **DAY)], complete=False,
                        spread=not spread_first)
        sent = [k for k in account.kafka.counted if k not in counted]
        assert len(sent) == (48 if spread_first else 2)
        assert all(("/" in k) == spread_first for k in sent)
        assert account.kafka.by("team") == {"b": 48_000_000}


def test_an_older_pending_step_on_the_other_cost_basis_is_resent_in_its_own_form() -> None:
    five = {"ChargePeriodStart": "2024-09-18 00:00:00",
            "ChargePeriodEnd": "2024-09-18 05:00:00", "ChargeFrequency": "Recurring"}
    billed = CostBasis.billed
    account = Account()
    account.import_([bill_row("i-1", "1", BilledCost="1", **five)], complete=False,
                    spread=True, basis=billed)
    account.kafka.unanswered = True
    account.import_([bill_row("i-1", "2", BilledCost="2", **five)], complete=False,
                    spread=True, basis=billed)
    account.kafka.unanswered = False
    as_older_costline(account)  # an older costline left it pending, spread over 5 hours
    for _ in range(2):
        account.import_([bill_row("i-1", "2", BilledCost="2", **five)], complete=False)
    assert account.total == 2_000_000
