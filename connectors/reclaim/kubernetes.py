"""Kubernetes: scale a Deployment or StatefulSet to zero, or delete a Job or Pod.

Plain HTTPS against the API server with a bearer token (no client library needed). Which
object: a resource id ``k8s/<namespace>/<kind>/<name>`` (kind ``deployment``,
``statefulset``, ``job`` or ``pod``), or the tags ``k8s_namespace``, ``k8s_kind`` and
``k8s_name`` (the namespace may also come from the ``namespace`` parameter).

The plan records the object's UID. The release carries it as a precondition, so the API
server itself refuses (409 Conflict) to touch an object of the same name that was deleted and
recreated meanwhile: scaling patches ``metadata.uid`` into the ``scale`` subresource, deleting
sends ``DeleteOptions.preconditions.uid``. A 409 or 404 closes the plan as skipped.

In a pod, the defaults are the in-cluster ones: ``https://$KUBERNETES_SERVICE_HOST:$PORT``,
the service account's token and CA. Elsewhere set ``api_url`` and ``token_env`` (the name of
the environment variable holding the token) and, for a private CA, ``ca_file``.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AnyHttpUrl, Field

from costline.connectors.params import EnvName, Seconds
from costline.connectors.reclaim import (
    NotReclaimable,
    ReclaimConnector,
    Sleep,
    backoff_delays,
    real_sleep,
    reclaimer,
    secret_from_env,
)
from costline.rules.findings import ReclaimRequest
from costline.rules.reclaim import Outcome, Plan
from costline.rules.reclaim_params import ReclaimParams

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RESOURCE_FORM = re.compile(r"^k8s/([^/]+)/([^/]+)/([^/]+)$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
MERGE_PATCH = "application/merge-patch+json"
RETRIES = 2
K8sName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]


class KubernetesParams(ReclaimParams):
    """Kubernetes: scale a Deployment/StatefulSet to zero, or delete a Job/Pod (UID-checked)."""

    action: Literal["scale_to_zero", "delete"] = Field(
        "scale_to_zero",
        description="scale_to_zero (Deployment, StatefulSet) or delete (Job, Pod)",
    )
    api_url: AnyHttpUrl | None = Field(
        None, description="API server; default in-cluster "
        "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
    )
    token_env: EnvName | None = Field(
        None, description="environment variable holding the bearer token; default the "
        "service account token file"
    )
    ca_file: str | None = Field(
        None, description="CA bundle of the API server; default the service account CA, "
        "if present"
    )
    namespace: K8sName | None = Field(None, description="namespace when the resource names none")
    timeout: Seconds = Field(
        10, json_schema_extra={"default": "10s"}, description="per API call"
    )


@dataclass(frozen=True)
class Kind:
    """Where a kind of object lives in the API, and what releasing it means."""

    group_version: str
    plural: str
    action: Literal["scale_to_zero", "delete"]

    def path(self, namespace: str, name: str) -> str:
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}/{name}"


KINDS: dict[str, Kind] = {
    "deployment": Kind("apps/v1", "deployments", "scale_to_zero"),
    "statefulset": Kind("apps/v1", "statefulsets", "scale_to_zero"),
    "job": Kind("batch/v1", "jobs", "delete"),
    "pod": Kind("v1", "pods", "delete"),
}


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str

    @property
    def path(self) -> str:
        return KINDS[self.kind].path(self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def object_of(resource_id: str, tags: Mapping[str, str], params: KubernetesParams) -> ObjectRef:
    """The object behind a resource id or its ``k8s_*`` tags; checks the action fits it."""
    found = RESOURCE_FORM.match(resource_id)
    namespace, kind, name = (found.groups() if found else
                             (tags.get("k8s_namespace") or params.namespace or "",
                              tags.get("k8s_kind", ""), tags.get("k8s_name", "")))
    kind = kind.lower()
    if kind not in KINDS or not NAME.match(name) or not NAME.match(namespace):
        raise NotReclaimable("failed", f"{resource_id} names no Kubernetes object: use "
                             "k8s/<namespace>/<kind>/<name> or the k8s_namespace, k8s_kind, "
                             f"k8s_name tags (kinds: {', '.join(KINDS)})")
    if KINDS[kind].action != params.action:
        raise NotReclaimable("failed", f"cannot {params.action} a {kind}: "
                             f"{KINDS[kind].action} it instead")
    return ObjectRef(kind, namespace, name)


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message") or self.body.get("reason") or "")[:200]


@dataclass(frozen=True)
class Endpoint:
    """The API server and the credentials to call it."""

    url: str
    token: str = field(repr=False)
    ssl: ssl.SSLContext | bool


class Retry(Exception):
    """5xx, timeout or no connection: worth trying again."""


@reclaimer("kubernetes")
class KubernetesReclaimer(ReclaimConnector):
    """Calls the API server over HTTPS; the object's UID is a precondition of every change.

    ```yaml
    rules:
      - name: idle-inference
        kind: idle
        match: {resource_type: "gpu.*", env: staging}
        below: 0.02
        for: 2h
        reclaim: {connector: kubernetes, action: scale_to_zero, namespace: serving}
    ```
    """

    params_model = KubernetesParams

    def __init__(self, environ: Mapping[str, str] | None = None, sleep: Sleep = real_sleep,
                 service_account: Path = SERVICE_ACCOUNT) -> None:
        self._environ = environ
        self._sleep = sleep
        self._service_account = service_account

    async def identify(self, request: ReclaimRequest) -> dict[str, str]:
        params = KubernetesParams.model_validate(request.params)
        ref = object_of(request.resource_id, request.tags, params)
        answer = await self._call(params, "GET", ref.path)
        if answer.status == 404:
            raise NotReclaimable("skipped", f"{ref} does not exist")
        if answer.status != 200:
            raise RuntimeError(f"GET {ref}: HTTP {answer.status} {answer.message}")
        uid = str(answer.body.get("metadata", {}).get("uid", ""))
        return {"kind": ref.kind, "namespace": ref.namespace, "name": ref.name, "uid": uid}

    def describe(self, plan: Plan) -> str:
        target = plan.target
        kind = KINDS.get(target.get("kind", ""))
        verb = "scale to zero" if kind is not None and kind.action == "scale_to_zero" else "delete"
        return f"{verb} {target.get('kind')} {target.get('namespace')}/{target.get('name')}"

    async def release(self, plan: Plan) -> Outcome:
        params = KubernetesParams.model_validate(plan.params)
        ref = ObjectRef(plan.target["kind"], plan.target["namespace"], plan.target["name"])
        uid = plan.target["uid"]
        if KINDS[ref.kind].action == "scale_to_zero":
            return await self._scale_to_zero(params, ref, uid)
        return await self._delete(params, ref, uid)

    async def _scale_to_zero(self, params: KubernetesParams, ref: ObjectRef,
                             uid: str) -> Outcome:
        before = await self._call(params, "GET", f"{ref.path}/scale")
        replicas = before.body.get("spec", {}).get("replicas") if before.status == 200 else None
        patch = {"metadata": {"uid": uid}, "spec": {"replicas": 0}}
        answer = await self._call(params, "PATCH", f"{ref.path}/scale", patch, MERGE_PATCH)
        detail = {"replicas_before": replicas} if replicas is not None else {}
        return _outcome(answer, ref, f"scaled {ref} to zero", detail)

    async def _delete(self, params: KubernetesParams, ref: ObjectRef, uid: str) -> Outcome:
        options = {"kind": "DeleteOptions", "apiVersion": "v1",
                   "propagationPolicy": "Background", "preconditions": {"uid": uid}}
        answer = await self._call(params, "DELETE", ref.path, options)
        return _outcome(answer, ref, f"deleted {ref}", {})

    async def _call(self, params: KubernetesParams, method: str, path: str,
                    body: Mapping[str, Any] | None = None,
                    content_type: str = "application/json") -> Answer:
        """One API call, retried on 5xx and connection errors (the UID precondition makes a
        repeated PATCH or DELETE harmless)."""
        endpoint = self._endpoint(params)
        delays = backoff_delays(RETRIES, 1.0)
        problem = ""
        for attempt in range(RETRIES + 1):
            if attempt:
                await self._sleep(delays[attempt - 1])
            try:
                return await _send(endpoint, params.timeout, method, path, body, content_type)
            except Retry as exc:
                problem = str(exc)
        raise RuntimeError(f"{method} {path}: no answer after {RETRIES + 1} tries: {problem}")

    def _endpoint(self, params: KubernetesParams) -> Endpoint:
        environ = os.environ if self._environ is None else self._environ
        url = str(params.api_url) if params.api_url else _in_cluster_url(environ)
        if params.token_env:
            token = secret_from_env(params.token_env, environ)
        else:
            token = _read(self._service_account / "token", "service account token")
        ca = params.ca_file or _existing(self._service_account / "ca.crt")
        context: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
        return Endpoint(url.rstrip("/"), token, context)


async def _send(endpoint: Endpoint, timeout_s: int, method: str, path: str,
                body: Mapping[str, Any] | None, content_type: str) -> Answer:
    headers = {"Authorization": f"Bearer {endpoint.token}", "Accept": "application/json"}
    data = None
    if body is not None:
        headers["Content-Type"] = content_type
        data = json.dumps(body).encode()
    import aiohttp  # here, not at the top: every costline command loads the connectors

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
                method, endpoint.url + path, data=data, headers=headers, ssl=endpoint.ssl,
                allow_redirects=False) as response:
            text = await response.text(errors="replace")
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Retry(type(exc).__name__) from None
    if status >= 500:
        raise Retry(f"HTTP {status}")
    return Answer(status, _json_object(text))


def _outcome(answer: Answer, ref: ObjectRef, done: str, detail: dict[str, Any]) -> Outcome:
    if answer.status in (200, 202):
        return Outcome("executed", done, detail)
    if answer.status == 409:
        return Outcome("skipped", f"{ref} is not the object planned (UID precondition "
                       f"failed: recreated since?): {answer.message}")
    if answer.status == 404:
        return Outcome("skipped", f"{ref} is gone")
    return Outcome("failed", f"{ref}: HTTP {answer.status} {answer.message}".strip())


def _json_object(text: str) -> dict[str, Any]:
    try:
        found = json.loads(text)
    except ValueError:
        return {"message": text[:200]}
    return found if isinstance(found, dict) else {}


def _in_cluster_url(environ: Mapping[str, str]) -> str:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise NotReclaimable("failed", "no api_url, and not running in a Kubernetes pod")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://{f'[{host}]' if ':' in host else host}:{port}"


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        raise NotReclaimable("failed", f"no token_env, and no {what} at {path}") from None


def _existing(path: Path) -> str | None:
    return str(path) if path.is_file() else None
