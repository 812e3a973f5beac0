"""Slurm jobs → GPU-hour and vCPU-hour usage, from recorded ``squeue --json`` output.

``squeue-22.05-cpu.json`` was recorded from the single-node Slurm 22.05 of ``.ci/slurm.sh``
(two running CPU jobs with comments, seven finished ones). ``squeue-22.05-gpu.json`` keeps its
finished jobs and adds GPU, array and pending jobs in the same 22.05 shape;
``squeue-24.11-gpu.json`` holds those jobs in the shape of Slurm 23.02 and later (state lists,
``{"set", "number"}`` numbers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from costline.connectors.slurm_scrape import (
    SlurmScraper,
    SqueueError,
    comment_tags,
    number,
    parse_job,
    parse_squeue,
    run_squeue,
)
from costline.rules.events import UsageEvent
from costline.rules.prices import PriceBook

DATA = Path(__file__).resolve().parents[1] / "data"
BOOK = PriceBook.load(Path(__file__).resolve().parents[2] / "rules" / "prices" / "example.yaml")
WINDOW = 300.0
T = 1795853100.0  # a window end: 2026-11-28T00:05:00Z


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def by_id(events: list[UsageEvent]) -> dict[str, UsageEvent]:
    return {e.event_id: e for e in events}


def test_the_recorded_cpu_jobs_of_a_real_slurm() -> None:
    jobs = {job.job_id: job for job in parse_squeue(recorded("squeue-22.05-cpu.json"))}
    assert len(jobs) == 9
    running = {i: j for i, j in jobs.items() if "RUNNING" in j.state}
    assert sorted(running) == ["8", "9"]
    assert (running["8"].cpus, running["8"].gpus, running["8"].cluster) == (2, {}, "costline")
    assert running["8"].tags == {"job": "pretrain-llm70b", "project": "llm-70b",
                                 "team": "pretrain", "stage": "pretrain", "slurm_job_id": "8",
                                 "partition": "costline", "user": "root",
                                 "cluster": "costline"}
    assert running["9"].tags["team"] == "eval"  # a comma-separated comment


def test_running_cpu_jobs_count_vcpu_hours_from_their_start() -> None:
    jobs = parse_squeue(recorded("squeue-22.05-cpu.json"))
    started = 1796031005.0
    end = (started // WINDOW + 1) * WINDOW  # the first window end after the start
    events = by_id(SlurmScraper(WINDOW, BOOK).events(jobs, end + 7))
    job8 = events[f"slurm:costline:8:{int(end)}:cpu.general"]
    assert (job8.resource_type, job8.unit, job8.resource_id) == (
        "cpu.general", "vcpu_hour", "slurm/8")
    assert job8.quantity == pytest.approx(2 * (end - started) / 3600)
    assert job8.ts == started
    assert len(events) == 2


@pytest.mark.parametrize("name", ["squeue-22.05-gpu.json", "squeue-24.11-gpu.json"])
def test_gpu_jobs_count_gpu_hours_by_their_gres_type(name: str) -> None:
    scraper = SlurmScraper(WINDOW, BOOK)
    events = by_id(scraper.events(parse_squeue(recorded(name)), T + 17))
    end = int(T)
    assert sorted(events) == sorted([
        f"slurm:cluster-a:4242:{end}:gpu.h100", f"slurm:cluster-a:4300_7:{end}:gpu.a100",
        f"slurm:cluster-a:4310:{end}:gpu.h100", f"slurm:cluster-a:4250:{end}:cpu.general"])
    pretrain = events[f"slurm:cluster-a:4242:{end}:gpu.h100"]
    assert pretrain.quantity == pytest.approx(32 * WINDOW / 3600)  # 4 nodes × 8 GPUs
    assert (pretrain.ts, pretrain.resource_id) == (T - WINDOW, "slurm/4242")
    assert pretrain.tags == {"job": "pretrain-llm70b", "project": "llm-70b", "team": "pretrain",
                             "stage": "pretrain", "slurm_job_id": "4242", "account": "llm",
                             "partition": "gpu", "user": "akim", "cluster": "cluster-a"}
    array_task = events[f"slurm:cluster-a:4300_7:{end}:gpu.a100"]
    assert array_task.quantity == pytest.approx(2 * 100 / 3600)  # started 100 s before T
    assert array_task.tags["stage"] == "eval"  # pairs separated by ';'
    assert events[f"slurm:cluster-a:4250:{end}:cpu.general"].quantity == \
        pytest.approx(32 * WINDOW / 3600)
    assert scraper.skipped["gpu_type_unpriced_as_default"] == 1  # b200 is not in the book
    assert scraper.skipped["not_running"] >= 1


def test_both_squeue_shapes_give_the_same_events() -> None:
    def seen(name: str) -> list[tuple[str, float, dict[str, str]]]:
        events = SlurmScraper(WINDOW, BOOK).events(parse_squeue(recorded(name)), T + 1)
        return sorted((e.event_id, e.quantity, dict(e.tags)) for e in events)

    assert seen("squeue-22.05-gpu.json") == seen("squeue-24.11-gpu.json")


def test_each_window_is_counted_once_and_a_gap_is_caught_up() -> None:
    jobs = parse_squeue(recorded("squeue-22.05-gpu.json"))
    scraper = SlurmScraper(WINDOW, BOOK)
    first = scraper.events(jobs, T + 5)
    assert scraper.events(jobs, T + 250) == []  # same window: nothing new
    late = scraper.events(jobs, T + 3 * WINDOW + 2)  # two rounds missed
    pretrain = [e for e in late if e.resource_id == "slurm/4242"]
    assert pretrain[0].quantity == pytest.approx(32 * 3 * WINDOW / 3600)
    assert pretrain[0].ts == T
    other = SlurmScraper(WINDOW, BOOK)  # a second scraper, or a cron run, in the same window
    assert [e.event_id for e in other.events(jobs, T + 100)] == [e.event_id for e in first]


def test_after_a_long_pause_only_the_last_window_is_counted() -> None:
    jobs = parse_squeue(recorded("squeue-22.05-gpu.json"))
    scraper = SlurmScraper(WINDOW, BOOK)
    scraper.events(jobs, T + 1)
    resumed = scraper.events(jobs, T + 50 * WINDOW + 1)
    pretrain = [e for e in resumed if e.resource_id == "slurm/4242"]
    assert pretrain[0].quantity == pytest.approx(32 * WINDOW / 3600)


def job(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"job_id": 77, "job_state": "RUNNING", "start_time": T - 3600,
                            "name": "train", "account": "llm", "partition": "gpu",
                            "user_name": "akim", "cluster": "c1", "comment": "",
                            "tres_alloc_str": "cpu=8,node=1,gres/gpu=4", "cpus": 8}
    base.update(fields)
    return base


def test_typed_tres_counts_win_over_an_untyped_total() -> None:
    parsed = parse_job(job(tres_alloc_str="cpu=8,gres/gpu=6,gres/gpu:a100=4,gres/gpu:l40s=2"),
                       "x")
    assert parsed.gpus == {"a100": 4, "l40s": 2}
    events = SlurmScraper(WINDOW, BOOK).events([parsed], T + 1)
    assert sorted((e.resource_type, round(e.quantity * 3600 / WINDOW)) for e in events) == [
        ("gpu.a100", 4), ("gpu.l40s", 2)]


def test_an_untyped_gpu_count_without_detail_is_the_default_type() -> None:
    parsed = parse_job(job(), "x")
    assert parsed.gpus == {None: 4}
    events = SlurmScraper(WINDOW, BOOK, default_gpu="gpu.a100").events([parsed], T + 1)
    assert [e.resource_type for e in events] == ["gpu.a100"]


def test_a_comment_names_the_run_but_never_the_job_id_or_owner() -> None:
    tags = parse_job(job(comment="job=run-42 slurm_job_id=1 user=mallory Team=pretrain"),
                     "x").tags
    assert (tags["job"], tags["slurm_job_id"], tags["user"], tags["team"]) == (
        "run-42", "77", "akim", "pretrain")


def test_a_job_that_started_after_the_window_waits_for_the_next() -> None:
    parsed = parse_job(job(start_time=T + 10), "x")
    assert SlurmScraper(WINDOW, BOOK).events([parsed], T + 20) == []


def test_comment_pairs_ignore_what_is_not_a_pair() -> None:
    assert comment_tags("free text, owner=ana; CostCenter=ml-7 =x y=") == {
        "owner": "ana", "cost_center": "ml-7"}


@pytest.mark.parametrize(("raw", "value"), [
    (42, 42.0), ({"set": True, "infinite": False, "number": 7}, 7.0),
    ({"set": False, "number": 0}, None), ({"set": True, "infinite": True, "number": 0}, None),
    (None, None), (True, None),
])
def test_slurm_numbers_in_both_shapes(raw: Any, value: float | None) -> None:
    assert number(raw) == value


def test_squeue_failures_are_reported(tmp_path: Path) -> None:
    with pytest.raises(SqueueError, match="no-such-squeue"):
        run_squeue([str(tmp_path / "no-such-squeue")])
    with pytest.raises(SqueueError, match="exited 3"):
        run_squeue(["sh", "-c", "echo refused >&2; exit 3"])
    with pytest.raises(SqueueError, match="did not print JSON"):
        parse_squeue("squeue: error: Invalid user")
    with pytest.raises(SqueueError, match="no jobs list"):
        parse_squeue(json.dumps({"errors": ["x"]}))


# ── training runs' ends ───────────────────────────────────────────────────────────────────


def _ended(state: str, comment: str = "project=llm-70b stage=pretrain", end: float = 1000.0
           ) -> dict[str, object]:
    return {"job_id": 4242, "name": "run-42", "job_state": state, "start_time": 100,
            "end_time": end, "comment": comment, "tres_alloc_str": "cpu=8,gres/gpu=8"}


@pytest.mark.parametrize("state, status", [
    ("FAILED", "failed"), ("NODE_FAIL", "failed"), ("TIMEOUT", "failed"),
    ("OUT_OF_MEMORY", "failed"), ("CANCELLED", "cancelled"), ("COMPLETED", "succeeded")])
def test_a_training_runs_end_is_reported(state: str, status: str) -> None:
    from costline.rules.events import RunEndEvent

    scraper = SlurmScraper(60, BOOK)
    [end] = [e for e in scraper.events([parse_job(_ended(state), "a")], 2000.0)
             if isinstance(e, RunEndEvent)]
    assert (end.status.value, end.ts, end.event_id) == (status, 1000.0, "slurm:a:4242:end:1000")
    assert end.tags["job"] == "run-42" and end.reason == f"Slurm job 4242 {state}"


def test_only_training_runs_have_their_end_reported() -> None:
    scraper = SlurmScraper(60, BOOK)
    notebook = parse_job(_ended("CANCELLED", comment="stage=dev"), "a")
    running = parse_job({**_ended("RUNNING"), "end_time": 5000}, "a")
    assert [e.kind for e in scraper.events([notebook, running], 2000.0)] == ["usage"]
    everything = SlurmScraper(60, BOOK, runs={"stage": ("*",)})
    assert [e.kind for e in everything.events([notebook], 2000.0)] == ["run_end"]


def test_a_job_seen_ended_in_two_rounds_is_one_event() -> None:
    scraper = SlurmScraper(60, BOOK)
    job = parse_job(_ended("FAILED"), "a")
    first, second = scraper.events([job], 2000.0), scraper.events([job], 2060.0)
    assert [e.event_id for e in first] == [e.event_id for e in second]
