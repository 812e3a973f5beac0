"""The Kubernetes connector against a local server that plays the API server's part.

No API server can run here, so ``FakeApiServer`` answers the few calls the connector makes the
way Kubernetes does: the resource paths of apps/v1, batch/v1 and core v1, bearer-token auth,
``application/merge-patch+json`` on the ``scale`` subresource, and the UID precondition (in the
patched ``metadata.uid`` of a scale, in ``DeleteOptions.preconditions.uid`` of a delete)
refused with 409 Conflict when the object was recreated.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from costline.connectors.reclaim import NotReclaimable
from costline.connectors.reclaim.kubernetes import KubernetesReclaimer
from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import Plan, make_plan

TOKEN = "k8s-token-3f9a1c77"
ENV = {"K8S_TOKEN": TOKEN}
GROUPS = {"deployments": "apps/v1", "statefulsets": "apps/v1", "jobs": "batch/v1",
          "pods": "v1"}
_uids = itertools.count(1)


def status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "reason": reason, "message": message, "code": code},
                             status=code)


@dataclass
class FakeApiServer:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str, Any]] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)

    def create(self, plural: str, namespace: str, name: str, replicas: int = 3) -> str:
        uid = f"uid-{next(_uids):04d}"
        self.objects[(plural, namespace, name)] = {
            "apiVersion": GROUPS[plural], "metadata": {"name": name, "namespace": namespace,
                                                       "uid": uid, "resourceVersion": "1"},
            "spec": {"replicas": replicas}}
        return uid

    def app(self) -> web.Application:
        app = web.Application()
        for plural, group in GROUPS.items():
            prefix = "/api/v1" if group == "v1" else f"/apis/{group}"
            base = f"{prefix}/namespaces/{{namespace}}/{plural}/{{name}}"
            app.router.add_route("*", base, self._object(plural))
            if plural in ("deployments", "statefulsets"):
                app.router.add_route("*", base + "/scale", self._scale(plural))
        return app

    async def _check(self, request: web.Request) -> tuple[web.Response | None, Any]:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.calls.append((request.method, request.path,
                           request.headers.get("Content-Type", ""), body))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return status(401, "Unauthorized", "Unauthorized"), body
        if self.failures:
            return status(self.failures.pop(0), "InternalError", "etcd leader changed"), body
        return None, body

    def _found(self, plural: str, request: web.Request) -> dict[str, Any] | None:
        key = (plural, request.match_info["namespace"], request.match_info["name"])
        return self.objects.get(key)

    def _object(self, plural: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            refused, body = await self._check(request)
            if refused is not None:
                return refused
            found = self._found(plural, request)
            if found is None:
                return status(404, "NotFound", f'{plural} "{request.match_info["name"]}" '
                              "not found")
            if request.method == "GET":
                return web.json_response(found)
            if request.method != "DELETE" or plural not in ("jobs", "pods"):
                return status(405, "MethodNotAllowed", "not supported by this fake")
            return self._delete(plural, request, found, body or {})

        return handle

    def _delete(self, plural: str, request: web.Request, found: dict[str, Any],
                options: dict[str, Any]) -> web.Response:
        wanted = (options.get("preconditions") or {}).get("uid")
        uid = found["metadata"]["uid"]
        if wanted and wanted != uid:
            return status(409, "Conflict", f"Precondition failed: UID in precondition: "
                          f"{wanted}, UID in object meta: {uid}")
        del self.objects[(plural, request.match_info["namespace"], request.match_info["name"])]
        return web.json_response({"kind": "Status", "status": "Success"})

    def _scale(self, plural: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            refused, body = await self._check(request)
            if refused is not None:
                return refused
            found = self._found(plural, request)
            if found is None:
                return status(404, "NotFound", "not found")
            meta = found["metadata"]
            if request.method == "PATCH":
                if request.headers.get("Content-Type") != "application/merge-patch+json":
                    return status(415, "UnsupportedMediaType", "unsupported patch type")
                wanted = (body.get("metadata") or {}).get("uid")
                if wanted and wanted != meta["uid"]:
                    return status(409, "Conflict", f"Precondition failed: UID in "
                                  f"precondition: {wanted}, UID in object meta: {meta['uid']}")
                found["spec"]["replicas"] = body["spec"]["replicas"]
            scale = {"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                                  "uid": meta["uid"]},
                     "spec": {"replicas": found["spec"]["replicas"]}}
            return web.json_response(scale)

        return handle


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


async def no_wait(seconds: float) -> None:
    return None


def request(url: str, resource_id: str, action: str, **tags: str) -> ReclaimRequest:
    return ReclaimRequest(resource_id=resource_id, resource_type="gpu.a100", tags=tags,
                          connector="kubernetes",
                          params={"action": action, "api_url": url, "token_env": "K8S_TOKEN",
                                  "timeout": "5s"},
                          grace=900, mode="live", idle_since=0.0, requested_at=0.0)


async def planned(connector: KubernetesReclaimer, found: ReclaimRequest) -> Plan:
    return make_plan(found, "k8s-idle", await connector.identify(found), 0, "USD", 0.0)


@pytest.mark.parametrize("plural", ["deployments", "statefulsets"])
async def test_a_workload_is_scaled_to_zero_with_its_uid_as_precondition(
        api: tuple[FakeApiServer, str], plural: str) -> None:
    fake, url = api
    uid = fake.create(plural, "ml", "notebook-7", replicas=3)
    kind = plural[:-1]
    connector = KubernetesReclaimer(environ=ENV, sleep=no_wait)
    plan = await planned(connector, request(url, f"k8s/ml/{kind}/notebook-7", "scale_to_zero"))
    assert plan.target == {"kind": kind, "namespace": "ml", "name": "notebook-7", "uid": uid}
    outcome = await connector.release(plan)
    assert (outcome.step, outcome.reason) == ("executed", f"scaled {kind} ml/notebook-7 to zero")
    assert outcome.detail == {"replicas_before": 3}
    assert fake.objects[(plural, "ml", "notebook-7")]["spec"]["replicas"] == 0
    method, path, content_type, body = fake.calls[-1]
    assert (method, path, content_type) == (
        "PATCH", f"/apis/apps/v1/namespaces/ml/{plural}/notebook-7/scale",
        "application/merge-patch+json")
    assert body == {"metadata": {"uid": uid}, "spec": {"replicas": 0}}


async def test_a_recreated_workload_is_not_scaled(api: tuple[FakeApiServer, str]) -> None:
    fake, url = api
    fake.create("deployments", "ml", "notebook-7")
    connector = KubernetesReclaimer(environ=ENV, sleep=no_wait)
    plan = await planned(connector, request(url, "k8s/ml/deployment/notebook-7",
                                            "scale_to_zero"))
    fake.create("deployments", "ml", "notebook-7", replicas=2)
    outcome = await connector.release(plan)
    assert outcome.step == "skipped"
    assert outcome.reason.startswith("deployment ml/notebook-7 is not the object planned "
                                     "(UID precondition failed")
    assert fake.objects[("deployments", "ml", "notebook-7")]["spec"]["replicas"] == 2


@pytest.mark.parametrize(("plural", "path"), [
    ("jobs", "/apis/batch/v1/namespaces/ml/jobs/train-9"),
    ("pods", "/api/v1/namespaces/ml/pods/train-9"),
])
async def test_a_job_or_pod_is_deleted_with_its_uid_as_precondition(
        api: tuple[FakeApiServer, str], plural: str, path: str) -> None:
    fake, url = api
    uid = fake.create(plural, "ml", "train-9")
    connector = KubernetesReclaimer(environ=ENV, sleep=no_wait)
    found = request(url, "cluster-a/gpu-3", "delete", k8s_namespace="ml",
                    k8s_kind=plural[:-1], k8s_name="train-9")
    outcome = await connector.release(await planned(connector, found))
    assert (outcome.step, outcome.reason) == ("executed", f"deleted {plural[:-1]} ml/train-9")
    assert (plural, "ml", "train-9") not in fake.objects
    assert fake.calls[-1][:2] == ("DELETE", path)
    assert fake.calls[-1][3] == {"kind": "DeleteOptions", "apiVersion": "v1",
                                 "propagationPolicy": "Background",
                                 "preconditions": {"uid": uid}}


async def test_a_recreated_pod_is_not_deleted(api: tuple[FakeApiServer, str]) -> None:
    fake, url = api
    fake.create("pods", "ml", "train-9")
    connector = KubernetesReclaimer(environ=ENV, sleep=no_wait)
    plan = await planned(connector, request(url, "k8s/ml/pod/train-9", "delete"))
    new_uid = fake.create("pods", "ml", "train-9")
    outcome = await connector.release(plan)
    assert outcome.step == "skipped" and new_uid in outcome.reason
    assert ("pods", "ml", "train-9") in fake.objects


async def test_a_missing_object_is_nothing_to_reclaim(api: tuple[FakeApiServer, str]) -> None:
    fake, url = api
    connector = KubernetesReclaimer(environ=ENV, sleep=no_wait)
    with pytest.raises(NotReclaimable, match="pod ml/ghost does not exist"):
        await connector.identify(request(url, "k8s/ml/pod/ghost", "delete"))
    fake.create("pods", "ml", "gone-soon")
    plan = await planned(connector, request(url, "k8s/ml/pod/gone-soon", "delete"))
    fake.objects.clear()
    outcome = await connector.release(plan)
    assert (outcome.step, outcome.reason) == ("skipped", "pod ml/gone-soon is gone")


async def test_a_bad_token_is_an_error(api: tuple[FakeApiServer, str]) -> None:
    fake, url = api
    fake.create("pods", "ml", "p")
    connector = KubernetesReclaimer(environ={"K8S_TOKEN": "wrong"}, sleep=no_wait)
    with pytest.raises(RuntimeError, match="HTTP 401 Unauthorized"):
        await connector.identify(request(url, "k8s/ml/pod/p", "delete"))


async def test_server_errors_are_retried(api: tuple[FakeApiServer, str]) -> None:
    fake, url = api
    fake.create("jobs", "ml", "train-9")
    connector = KubernetesReclaimer(environ=ENV, sleep=no_wait)
    plan = await planned(connector, request(url, "k8s/ml/job/train-9", "delete"))
    fake.failures = [503, 500]
    outcome = await connector.release(plan)
    assert outcome.step == "executed"
    assert [call[0] for call in fake.calls[-3:]] == ["DELETE"] * 3


async def test_without_api_url_or_token_outside_a_cluster_nothing_is_planned(
        tmp_path: Any) -> None:
    connector = KubernetesReclaimer(environ={}, service_account=tmp_path)
    found = ReclaimRequest(resource_id="k8s/ml/pod/p", resource_type="gpu.a100", tags={},
                           connector="kubernetes", params={"action": "delete"}, grace=0,
                           mode="live", idle_since=0.0, requested_at=0.0)
    with pytest.raises(NotReclaimable, match="not running in a Kubernetes pod"):
        await connector.identify(found)
