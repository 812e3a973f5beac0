"""Every benchmark script starts: a name it imports that has moved fails here, not on the day
someone runs the benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py")
                 if 'if __name__ == "__main__"' in path.read_text())


def test_the_benchmarks_are_found() -> None:
    assert {"throughput.py", "chaos.py", "api.py", "latency.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_answers_help(script: str) -> None:
    run = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                         text=True, timeout=60, cwd=BENCH.parent, check=False)
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout
