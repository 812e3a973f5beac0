"""The connectors without a cluster: the registry, Slurm's commands, signing, object names."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from costline.connectors.plugins import PLUGINS
from costline.connectors.reclaim import (
    RECLAIMERS,
    NotReclaimable,
    build_connectors,
    secret_from_env,
)
from costline.connectors.reclaim.dry_run import DryRunReclaimer
from costline.connectors.reclaim.kubernetes import KubernetesParams, object_of
from costline.connectors.reclaim.slurm import Completed, SlurmReclaimer, job_id_of, parse_job
from costline.connectors.reclaim.webhook import WebhookReclaimer, body_of, sign
from costline.rules.findings import ReclaimRequest
from costline.rules.loader import rules_json_schema
from costline.rules.reclaim import Plan, make_plan
from tests.unit.rulefiles.builders import T0


def request(resource_id: str = "slurm/4211", **params: object) -> ReclaimRequest:
    return ReclaimRequest(resource_id=resource_id, resource_type="gpu.h100",
                          tags={"team": "pretrain"}, connector="slurm",
                          params={"action": "cancel", **params}, grace=900, mode="live",
                          idle_since=T0, requested_at=T0)


def plan_for(target: dict[str, str], **params: object) -> Plan:
    return make_plan(request(**params), "gpu-idle", target, 0, "USD", T0)


def test_every_reclaimer_is_a_rule_file_connector_with_its_own_parameters() -> None:
    assert sorted(RECLAIMERS) == ["dry_run", "kubernetes", "slurm", "webhook"]
    assert PLUGINS.reclaimers is RECLAIMERS
    for name, cls in RECLAIMERS.items():
        assert cls.name == name
        assert cls.params_model.model_config.get("extra") == "forbid"
    options = rules_json_schema(PLUGINS)["$defs"]["Reclaim"]["oneOf"]
    slurm = next(o for o in options if o["properties"]["connector"]["const"] == "slurm")
    assert {"action", "job_id_tag", "approval", "max_per_hour", "max_percent"} <= set(
        slurm["properties"])


def test_build_connectors_makes_one_of_each_and_takes_overrides() -> None:
    fake = DryRunReclaimer()
    built = build_connectors(slurm=fake)
    assert sorted(built) == sorted(RECLAIMERS) and built["slurm"] is fake


def test_a_secret_is_read_from_the_named_variable_and_never_echoed() -> None:
    assert secret_from_env("HOOK_SECRET", {"HOOK_SECRET": "s3cr3t"}) == "s3cr3t"
    with pytest.raises(NotReclaimable) as caught:
        secret_from_env("HOOK_SECRET", {})
    assert caught.value.reason == "environment variable HOOK_SECRET is not set"


# ── Slurm ─────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("resource_id", "tags", "tag", "job"), [
    ("cluster-a/node-017", {"slurm_job_id": "4211"}, None, "4211"),
    ("cluster-a/node-017", {"jobid": "77_3"}, "jobid", "77_3"),
    ("slurm/4211", {}, None, "4211"),
    ("slurm/4211_2", {"slurm_job_id": "not-a-number"}, None, "4211_2"),
])
def test_the_job_behind_a_resource(resource_id: str, tags: dict[str, str], tag: str | None,
                                   job: str) -> None:
    assert job_id_of(resource_id, tags, tag) == job


def test_a_resource_without_a_job_id_is_not_reclaimable() -> None:
    with pytest.raises(NotReclaimable, match="names no Slurm job"):
        job_id_of("cluster-a/node-017", {"job": "run-42"}, None)


def test_a_job_name_may_contain_the_separator() -> None:
    job = parse_job("42|alice|2026-11-30T07:00:00|2026-11-30T07:01:00|RUNNING|a|b c")
    assert (job.job_id, job.user, job.state, job.name) == ("42", "alice", "RUNNING", "a|b c")


@dataclass
class FakeSlurmCommands:
    """Plays squeue/scancel/scontrol: a table of jobs the commands read and change."""

    jobs: dict[str, list[str]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def add(self, job_id: str, state: str = "RUNNING", name: str = "run-42",
            start: str = "2026-11-30T07:01:00") -> None:
        self.jobs[job_id] = [job_id, "alice", "2026-11-30T07:00:00", start, state, name]

    async def __call__(self, argv: Sequence[str]) -> Completed:
        self.calls.append(list(argv))
        if argv[0] == "squeue":
            job = self.jobs.get(argv[argv.index("--jobs") + 1])
            if job is None:
                return Completed(1, "", "slurm_load_jobs error: Invalid job id specified\n")
            return Completed(0, "|".join(job) + "\n", "")
        job_id = argv[-1]
        if argv[0] == "scancel" and f"--name={self.jobs[job_id][5]}" in argv:
            self.jobs[job_id][4] = "CANCELLED"
        if argv[0] == "scontrol":
            self.jobs[job_id][4] = "PENDING"
        return Completed(0, "", "")


async def no_wait(seconds: float) -> None:
    return None


async def test_slurm_records_the_job_identity_when_planning() -> None:
    commands = FakeSlurmCommands()
    commands.add("4211")
    target = await SlurmReclaimer(run=commands).identify(request())
    assert target == {"job_id": "4211", "name": "run-42", "user": "alice",
                      "submit_time": "2026-11-30T07:00:00", "start_time": "2026-11-30T07:01:00"}


@pytest.mark.parametrize(("jobs", "reason"), [
    ({}, "Slurm job 4211 does not exist"),
    ({"4211": "COMPLETED"}, "Slurm job 4211 is COMPLETED, not running"),
])
async def test_slurm_plans_nothing_for_a_job_that_is_not_running(jobs: dict[str, str],
                                                                 reason: str) -> None:
    commands = FakeSlurmCommands()
    for job_id, state in jobs.items():
        commands.add(job_id, state)
    with pytest.raises(NotReclaimable) as caught:
        await SlurmReclaimer(run=commands).identify(request())
    assert (caught.value.step, caught.value.reason) == ("skipped", reason)


async def test_slurm_cancels_with_name_and_user_filters() -> None:
    commands = FakeSlurmCommands()
    commands.add("4211")
    slurm = SlurmReclaimer(run=commands, sleep=no_wait)
    outcome = await slurm.release(plan_for(await slurm.identify(request())))
    assert (outcome.step, outcome.reason) == (
        "executed", "cancelled Slurm job 4211 (run-42, alice); now CANCELLED")
    assert ["scancel", "--name=run-42", "--user=alice", "4211"] in commands.calls


async def test_slurm_never_cancels_a_reused_job_id() -> None:
    commands = FakeSlurmCommands()
    commands.add("4211")
    slurm = SlurmReclaimer(run=commands, sleep=no_wait)
    plan = plan_for(await slurm.identify(request()))
    commands.add("4211", name="someone-else", start="2026-11-30T09:00:00")
    outcome = await slurm.release(plan)
    assert outcome.step == "skipped"
    assert outcome.reason == (
        "Slurm job id 4211 no longer names the job planned (name was 'run-42', now "
        "'someone-else'; start_time was '2026-11-30T07:01:00', now '2026-11-30T09:00:00'): "
        "reused or restarted, left alone")
    assert not [call for call in commands.calls if call[0] != "squeue"]


async def test_slurm_reports_a_cancel_that_did_not_take() -> None:
    commands = FakeSlurmCommands()
    commands.add("4211")
    slurm = SlurmReclaimer(run=commands, sleep=no_wait, settle_s=0.4)
    plan = plan_for(await slurm.identify(request()))

    async def refuse(argv: Sequence[str]) -> Completed:
        if argv[0] == "scancel":
            return Completed(0, "", "scancel: error: Kill job error: Access/permission denied")
        return await commands(argv)

    outcome = await SlurmReclaimer(run=refuse, sleep=no_wait, settle_s=0.4).release(plan)
    assert outcome.step == "failed" and "permission denied" in outcome.reason


@pytest.mark.parametrize(("action", "verb", "reason"), [
    ("requeue", "requeue", "requeued Slurm job 4211 (run-42, alice)"),
    ("hold", "requeuehold", "requeued and held Slurm job 4211 (run-42, alice)"),
])
async def test_slurm_requeues_or_holds(action: str, verb: str, reason: str) -> None:
    commands = FakeSlurmCommands()
    commands.add("4211")
    slurm = SlurmReclaimer(run=commands, sleep=no_wait)
    plan = plan_for(await slurm.identify(request(action=action)), action=action)
    outcome = await slurm.release(plan)
    assert (outcome.step, outcome.reason) == ("executed", reason)
    assert commands.calls[-1] == ["scontrol", verb, "4211"]


async def test_slurm_skips_a_job_that_ended_meanwhile() -> None:
    commands = FakeSlurmCommands()
    commands.add("4211")
    slurm = SlurmReclaimer(run=commands, sleep=no_wait)
    plan = plan_for(await slurm.identify(request()))
    commands.jobs["4211"][4] = "COMPLETED"
    outcome = await slurm.release(plan)
    assert (outcome.step, outcome.reason) == ("skipped",
                                              "Slurm job 4211 already ended (COMPLETED)")


async def test_a_failing_squeue_is_an_error_not_a_missing_job() -> None:
    async def broken(argv: Sequence[str]) -> Completed:
        return Completed(1, "", "slurm_load_jobs error: Unable to contact slurm controller")

    with pytest.raises(RuntimeError, match="Unable to contact slurm controller"):
        await SlurmReclaimer(run=broken).identify(request())


# ── webhook, Kubernetes, dry run ──────────────────────────────────────────────────────────


def test_the_webhook_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"a":1}'
    expected = hmac.new(b"k", b"1796030000." + body, hashlib.sha256).hexdigest()
    assert sign("k", "1796030000", body) == f"v1={expected}"


def test_the_webhook_body_describes_the_plan_without_secrets() -> None:
    plan = plan_for({"url": "https://platform.example/release"},
                    url="https://platform.example/release", secret_env="HOOK_SECRET")
    body = json.loads(body_of(plan))
    assert body["action"] == "release" and body["plan_id"] == plan.plan_id
    assert body["resource_id"] == "slurm/4211" and "params" not in body


async def test_the_webhook_refuses_to_plan_without_its_secret() -> None:
    hook = WebhookReclaimer(environ={})
    found = ReclaimRequest(**{**request().__dict__, "connector": "webhook",
                              "params": {"url": "https://platform.example/release"}})
    with pytest.raises(NotReclaimable, match="COSTLINE_WEBHOOK_SECRET is not set"):
        await hook.identify(found)


@pytest.mark.parametrize(("resource_id", "tags", "action", "expected"), [
    ("k8s/ml/deployment/notebook-7", {}, "scale_to_zero", "deployment ml/notebook-7"),
    ("cluster-a/gpu-3", {"k8s_kind": "Job", "k8s_name": "train-9", "k8s_namespace": "ml"},
     "delete", "job ml/train-9"),
    ("cluster-a/gpu-3", {"k8s_kind": "pod", "k8s_name": "p-1"}, "delete", "pod batch/p-1"),
])
def test_the_kubernetes_object_behind_a_resource(resource_id: str, tags: dict[str, str],
                                                 action: str, expected: str) -> None:
    params = KubernetesParams.model_validate({"action": action, "namespace": "batch"})
    assert str(object_of(resource_id, tags, params)) == expected


@pytest.mark.parametrize(("resource_id", "action", "message"), [
    ("k8s/ml/pod/p-1", "scale_to_zero", "cannot scale_to_zero a pod: delete it instead"),
    ("k8s/ml/daemonset/d", "delete", "names no Kubernetes object"),
    ("cluster-a/gpu-3", "delete", "names no Kubernetes object"),
])
def test_kubernetes_refuses_what_it_cannot_release(resource_id: str, action: str,
                                                  message: str) -> None:
    params = KubernetesParams.model_validate({"action": action})
    with pytest.raises(NotReclaimable, match=message):
        object_of(resource_id, {}, params)


async def test_the_dry_run_connector_touches_nothing_and_remembers() -> None:
    connector = DryRunReclaimer()
    plan = plan_for(await connector.identify(request()))
    outcome = await connector.release(plan)
    assert outcome.step == "skipped" and "nothing was touched" in outcome.reason
    assert connector.would_release == [plan]


@pytest.mark.parametrize(("name", "written"), [
    ("slurm", {"action": "requeue", "job_id_tag": "jobid", "max_per_hour": 5}),
    ("webhook", {"url": "https://platform.example/release", "secret_env": "HOOK_SECRET",
                 "timeout": "5s", "backoff": "2s", "approval": "manual"}),
    ("kubernetes", {"action": "delete", "api_url": "https://k8s.example:6443",
                    "token_env": "K8S_TOKEN", "timeout": "30s", "max_percent": 10}),
    ("dry_run", {"timezone": "Europe/Berlin"}),
])
def test_parameters_pass_on_as_written_and_validate_again(name: str,
                                                         written: dict[str, object]) -> None:
    model = RECLAIMERS[name].params_model
    passed_on = model.model_validate(written).model_dump(mode="json")
    assert model.model_validate(passed_on) == model.model_validate(written)
    assert all(value is not None for value in passed_on.values())
