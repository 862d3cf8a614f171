"""The one module that talks to the API server: server-side apply, get, delete, discovery.

404 is interpreted here (absent, not an error); every other status travels up unchanged in the
`ApiException`, so callers can tell a conflict from a permission problem.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from inferop_operator.spec import GROUP, PLURAL, VERSION

PLURALS = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "Deployment": "deployments",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "InferenceService": PLURAL,
}
REQUEST_TIMEOUT = 30  # seconds; no call to the API server may hang


def load_client() -> client.ApiClient:
    """In-cluster credentials in a pod, else the current KUBECONFIG context."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # KUBECONFIG is read now: the client library's default was fixed when it was first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()


def resource_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class KubeApi:
    def __init__(self, api_client: client.ApiClient, field_manager: str):
        self.api_client = api_client
        self.field_manager = field_manager

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
        data = response.read()
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

    def patch_service_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self._call(
            "PATCH",
            resource_path(f"{GROUP}/{VERSION}", "InferenceService", namespace, name) + "/status",
            header_params={"Content-Type": "application/merge-patch+json"},
            body={"status": status},
        )

    @functools.cached_property
    def hpa_api_version(self) -> str:
        """autoscaling/v2 where the server offers it (1.23+), else autoscaling/v2beta2 (1.20-1.25)."""
        group = self._call("GET", "/apis/autoscaling")
        versions = {v["version"] for v in group.get("versions", [])}
        for version in ("v2", "v2beta2"):
            if version in versions:
                return f"autoscaling/{version}"
        raise RuntimeError(f"the API server offers no autoscaling/v2 or v2beta2 (only {sorted(versions)})")
