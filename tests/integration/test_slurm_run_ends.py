"""A training run's job that fails on the real Slurm is reported as a failed run's end, once,
by every scraper round that sees it; a job that is no training run is not."""

from __future__ import annotations

import subprocess
import time

import pytest

from costline.connectors.slurm_scrape import SlurmScraper, parse_squeue, run_squeue
from costline.rules.events import RunEndEvent
from tests.integration.test_scrape_slurm import PRICES, slurm  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration


def submit(name: str, comment: str, script: str) -> str:
    done = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--comment={comment}",
                           "--output=/dev/null", "--wrap", script],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip().split(";")[0]


def ends(scraper: SlurmScraper, job_ids: set[str]) -> list[RunEndEvent]:
    found = scraper.events(parse_squeue(run_squeue()), time.time())
    return [e for e in found if isinstance(e, RunEndEvent)
            and e.tags.get("slurm_job_id") in job_ids]


def test_a_failed_training_job_is_a_failed_runs_end(slurm: None) -> None:  # noqa: F811
    failing = submit("run-broken", "project=llm-70b stage=pretrain", "sleep 1; exit 3")
    notebook = submit("notebook-x", "stage=dev", "sleep 1; exit 3")
    scraper = SlurmScraper(60, PRICES)
    deadline = time.time() + 90
    found: list[RunEndEvent] = []
    while time.time() < deadline and not found:
        time.sleep(2)
        found = ends(scraper, {failing, notebook})
    assert [(e.tags["job"], e.status.value) for e in found] == [("run-broken", "failed")]
    assert found[0].reason == f"Slurm job {failing} FAILED"
    assert [e.event_id for e in ends(scraper, {failing})] == [found[0].event_id]
