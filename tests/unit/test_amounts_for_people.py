"""Amounts outside the spend and alert tables, as people read them: a release's saving in
``costline actions``, the import's summary; the exact figures stay in ``--json``."""

from __future__ import annotations

import json


def test_an_action_line_shows_the_saving_as_money() -> None:
    from costline.streams.cli.actions_cmd import action_line

    record = {"at": "2026-12-02T00:00:00Z", "step": "executed", "rule": "gpu-idle",
              "resource_id": "lab/dev-gpu-01", "connector": "slurm", "mode": "live",
              "currency": "USD", "saved": "1974.311500", "reason": "cancelled Slurm job 7"}
    assert action_line(record) == (
        "2026-12-02T00:00:00Z executed gpu-idle lab/dev-gpu-01 via slurm (live) saved "
        "$1,974.31: cancelled Slurm job 7")
    dry = {**record, "step": "skipped", "mode": "dry_run", "saved": "0.000000",
           "would_save": "37.647192", "reason": "dry run: would cancel Slurm job 7"}
    assert "(dry_run) would save $37.65: dry run" in action_line(dry)
    assert action_line({**record, "saved": "0.000000"}).endswith(
        "via slurm (live): cancelled Slurm job 7")


def test_the_import_summary_shows_money_and_json_keeps_it_exact(capsys) -> None:
    from collections import Counter

    from costline.connectors.focus import CostBasis, SkipReason
    from costline.connectors.focus_tally import ImportTally
    from costline.streams.cli.import_cmd import ImportReport
    from costline.streams.cli.produce_cmd import Summary

    tally = ImportTally(rows=1000, events=999, cost_micro=14_976_514, credits_micro=3_161_972,
                        skipped_rows=Counter({SkipReason.null_cost: 1}),
                        skipped_micro={SkipReason.null_cost: Counter({"USD": -3_000_000})})
    report = ImportReport("bill.csv", CostBasis.effective, "USD", True, tally, Summary(), {},
                          0.5, [])
    report.print()
    assert capsys.readouterr().out.splitlines()[1:] == [
        "dry run: would send 999 events, $14.98 net ($18.14 gross, $3.16 credits)",
        "  skipped 1 row (null_cost): -$3.00 not counted"]
    assert "14.976514" in json.dumps(report.as_dict())
