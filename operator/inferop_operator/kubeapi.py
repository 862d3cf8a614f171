"""The one module that talks to the API server: server-side apply, get, delete, discovery.

404 is interpreted here (absent, not an error); every other status travels up unchanged in the
`ApiException`, so callers can tell a conflict from a permission problem. `ApiFailure` reads such an
exception the way a user needs it: the status code, the server's reason and message, and whether
asking again can help.
"""

from __future__ import annotations

import http
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from inferop_core.errors import InferopError
from inferop_operator.builders import CHILDREN, Child
from inferop_operator.identity import API_VERSION, KIND, PLURAL

PLURALS = {**{child.kind: child.plural for child in CHILDREN}, KIND: PLURAL, "Gateway": "gateways"}
REQUEST_TIMEOUT = 30  # seconds; no call to the API server may hang
DISCOVERY_SECONDS = 60.0  # how long an answer about which APIs are served holds (a CRD may be installed later)
# The request itself is wrong (422 Invalid: a child's name or field the server rejects, 400, 413 too large,
# 415): the same spec sends the same request again, so asking again cannot help.
PERMANENT_STATUSES = frozenset({400, 413, 415, 422})
# Seconds before the first retry, doubled on each further one up to RETRY_MAX_SECONDS: a server error, a
# conflict or throttling may pass soon; a refusal (403 forbidden by RBAC or a quota, 404) waits for a person.
RETRY_SOON_SECONDS = 5.0
RETRY_LATER_SECONDS = 30.0
RETRY_MAX_SECONDS = 300.0


def load_client(connections: int) -> client.ApiClient:
    """In-cluster credentials in a pod, else the current KUBECONFIG context; one kept-alive connection per thread
    that calls the API server (the library's default pool of 5 per CPU drops the others, and each new one costs
    a TLS handshake on both sides)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # KUBECONFIG is read now: the client library's default was fixed when it was first imported.
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class NoServedVersion(InferopError, RuntimeError):
    """The API server offers none of the versions the operator can write for a child."""


@dataclass(frozen=True)
class ApiFailure:
    """A request about one object that the API server refused, as a user reads it: what was asked
    (`action` on `kind` `name`), the HTTP status, the server's reason (`Forbidden`, `Invalid`,
    `InternalError`...) and its message."""

    action: str  # apply, delete
    kind: str
    name: str
    status: int
    reason: str
    message: str
    retry_after: float | None = None  # seconds the server asked for (Retry-After)

    @classmethod
    def of(cls, error: ApiException, action: str, kind: str, name: str) -> ApiFailure:
        status = int(error.status or 0)
        body = error.body.decode(errors="replace") if isinstance(error.body, bytes) else str(error.body or "")
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        # Anything but a Status is not the apiserver's own answer (a proxy's page, an empty body).
        answer: dict[str, Any] = parsed if isinstance(parsed, dict) and parsed.get("kind") == "Status" else {}
        given = answer.get("details")
        details: dict[str, Any] = given if isinstance(given, dict) else {}
        retry_after = (error.headers or {}).get("Retry-After") or details.get("retryAfterSeconds")
        try:
            seconds = float(retry_after) if retry_after is not None else None
        except ValueError:
            seconds = None  # an HTTP date: the backoff decides
        return cls(
            action=action,
            kind=kind,
            name=name,
            status=status,
            reason=str(answer.get("reason") or _reason_of(status, error.reason)),
            message=str(answer.get("message") or body.strip() or error.reason or "no message"),
            retry_after=seconds,
        )

    @property
    def permanent(self) -> bool:
        return self.status in PERMANENT_STATUSES

    def delay(self, retry: int) -> float:
        """Seconds before attempt `retry + 1`: an exponential backoff, never shorter than Retry-After."""
        soon = self.status in (409, 429) or self.status >= 500 or self.status == 0
        first = RETRY_SOON_SECONDS if soon else RETRY_LATER_SECONDS
        backoff = min(first * 2.0 ** min(max(retry, 0), 16), RETRY_MAX_SECONDS)
        return max(backoff, self.retry_after or 0.0)

    def explain(self) -> str:
        return f"{self.action} {self.kind} {self.name}: {self.status} {self.reason}: {self.message}"


def _reason_of(status: int, phrase: str | None) -> str:
    """A CamelCase reason from the HTTP status, for an answer that is not the apiserver's (502 -> BadGateway)."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = phrase or "Unknown"
    return "".join(word[:1].upper() + word[1:] for word in phrase.replace("-", " ").split()) or "Unknown"


class KubeApi:
    def __init__(self, api_client: client.ApiClient, field_manager: str):
        self.api_client = api_client
        self.field_manager = field_manager
        self._served: dict[str, str] = {}  # child kind -> the apiVersion used for it, once discovered
        self._resources: dict[str, tuple[float, frozenset[str]]] = {}  # group/version -> (when read, resources)

    def _call(
        self,
        method: str,
        path: str,
        header_params: dict[str, str] | None = None,
        query_params: list[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> Any:
        """One request with a timeout; a non-2xx answer raises ApiException with its status and body."""
        serialized = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query_params,
            header_params={"Accept": "application/json", **(header_params or {})},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*serialized, _request_timeout=REQUEST_TIMEOUT)
        data = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return json.loads(data) if data else {}

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply with force: our fields converge to `manifest`, manual edits of them are reverted,
        and fields we do not set (an HPA's replica count) stay with their owners."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        return dict(
            self._call(
                "PATCH",
                path,
                query_params=[("fieldManager", self.field_manager), ("force", "true")],
                header_params={"Content-Type": "application/apply-patch+yaml"},
                body=manifest,
            )
        )

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self._call("GET", resource_path(api_version, kind, namespace, name)))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete if present; False when it was already gone."""
        try:
            self._call("DELETE", resource_path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def patch_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        """A merge patch of an InferenceService's spec: what a person edits (inferop rollout), never the
        operator."""
        self._call(
            "PATCH",
            resource_path(API_VERSION, KIND, namespace, name),
            header_params={"Content-Type": "application/merge-patch+json"},
            body={"spec": spec},
        )

    def patch_service_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self._call(
            "PATCH",
            resource_path(API_VERSION, KIND, namespace, name) + "/status",
            header_params={"Content-Type": "application/merge-patch+json"},
            body={"status": status},
        )

    def served_version(self, child: Child) -> str:
        """The apiVersion to use for `child`: its only candidate, or the first of its candidates that the server
        offers (one GET of /apis/<group>, the first time it is asked), so that both Kubernetes 1.20
        (autoscaling/v2beta2, policy/v1beta1) and current releases (autoscaling/v2, policy/v1) work."""
        if len(child.versions) == 1:
            return child.api_version(child.versions[0])
        if child.kind not in self._served:
            group = self._call("GET", f"/apis/{child.group}")
            offered = {v["version"] for v in group.get("versions", [])}
            version = next((v for v in child.versions if v in offered), None)
            if version is None:
                raise NoServedVersion(
                    f"the API server offers none of {', '.join(map(child.api_version, child.versions))} for "
                    f"{child.kind} (only {sorted(offered)})"
                )
            self._served[child.kind] = child.api_version(version)
        return self._served[child.kind]

    def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `api_version` (e.g. gateway.networking.k8s.io/v1 httproutes),
        asked again after DISCOVERY_SECONDS: Gateway API's CRDs may be installed while the operator runs."""
        known = self._resources.get(api_version)
        if known is None or time.monotonic() - known[0] > DISCOVERY_SECONDS:
            known = self._resources[api_version] = (time.monotonic(), self.resources(api_version))
        return plural in known[1]

    def resources(self, api_version: str) -> frozenset[str]:
        """The resources the API server serves in `api_version` now (its discovery document); none when it serves
        no such group or version."""
        try:
            listing = self._call("GET", "/api/v1" if api_version == "v1" else f"/apis/{api_version}")
        except ApiException as error:
            if error.status != 404:
                raise
            return frozenset()
        return frozenset(str(r.get("name")) for r in listing.get("resources", []))
