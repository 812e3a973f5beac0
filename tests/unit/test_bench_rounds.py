"""``bench/throughput.py --rounds``: each round's rates and ratios, and how their spread is
printed (the rounds themselves need Kafka and Redis; their figures are not asserted)."""

from __future__ import annotations

import pytest

from bench.throughput import add_rates, print_rounds, round_figures


def test_a_round_gives_each_consumers_rate_and_the_ratios() -> None:
    b, b_plain, c = (add_rates({"elapsed_s": s, "cpu_s": 1.0}, 100_000) for s in (10.0, 8.0, 12.5))
    figures = round_figures(b, b_plain, c, True)
    assert figures["events_per_s"] == {"b": 10_000, "b_plain": 12_500, "c": 8_000}
    assert figures["c_over_b"] == pytest.approx(0.8)
    assert figures["c_over_b_plain"] == pytest.approx(0.64)
    assert c["cpu_us_per_event"] == pytest.approx(10.0)


def test_rounds_print_the_median_and_range_and_any_mismatch(
        capsys: pytest.CaptureFixture[str]) -> None:
    def run(elapsed: float) -> dict[str, float]:
        return add_rates({"elapsed_s": elapsed, "cpu_s": 1.0}, 1_000)

    rounds = [round_figures(run(10.0), run(5.0), run(c), ok)
              for c, ok in ((10.0, True), (20.0, True), (12.5, False))]
    print_rounds({"single": {"rounds": rounds}, "batched": {}}, ["single", "batched"])
    out = capsys.readouterr().out
    assert "3 times" in out
    assert "single: c/b 0.800 (0.500–1.000), c/b' 0.400 (0.250–0.500)" in out
    assert "c 80 (50–100)" in out and "totals MISMATCH" in out
    assert "batched" not in out.split("median", 1)[1]


def test_without_rounds_nothing_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    print_rounds({"single": {}}, ["single"])
    assert capsys.readouterr().out == ""
