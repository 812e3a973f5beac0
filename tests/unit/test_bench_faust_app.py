"""``bench/faust_app.py`` times both apps' per-message costs and prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_faust_app_bench_prints_each_cost_for_both_apps() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "faust_app.py"), "--json", "--messages", "200",
         "--repeat", "1"], capture_output=True, text=True, timeout=120, check=True)
    figures = json.loads(done.stdout)
    assert set(figures) == {"sensors", "buffer size"}
    for by_app in figures.values():
        assert set(by_app) == {"faust", "worker"}
        assert all(us > 0 for us in by_app.values())
