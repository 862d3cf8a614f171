"""kopf registration: parse the spec, plan, build, apply, report. Nothing else lives here."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from inferop_operator.builders import Service, build_config_map, build_deployment, build_hpa, build_service
from inferop_operator.kubeapi import KubeApi, load_client
from inferop_operator.plan import Refusal, plan_service
from inferop_operator.settings import OperatorSettings
from inferop_operator.spec import GROUP, KIND, PLURAL, VERSION, SpecError, parse_spec
from inferop_operator.status import deployed_status, invalid_status, refused_status

SETTINGS = OperatorSettings()
MANAGED = {"app.kubernetes.io/managed-by": "inferop"}
_api: KubeApi | None = None


def api() -> KubeApi:
    global _api
    if _api is None:
        _api = KubeApi(load_client(), SETTINGS.field_manager)
    return _api


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our state lives in our own annotation prefix, not kopf's default, so two tools never collide.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-applied-spec")
    # Every wait is bounded: a dropped watch reconnects rather than hanging silently.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    # Decisions at INFO and above become Kubernetes Events a user sees in `kubectl describe`.
    settings.posting.level = logging.INFO
    # Sync handlers run in threads; 100 services applied at once must converge in seconds.
    settings.execution.max_workers = 32
    settings.queueing.error_delays = [1, 2, 5, 10, 30]


def reconcile(name: str, namespace: str, uid: str, raw_spec: Any, generation: int | None, status: Any, body: Any) -> dict[str, Any]:
    """Apply the children for a valid, safe spec and return the status; raise PermanentError otherwise."""
    previous = (status or {}).get("conditions")
    try:
        spec = parse_spec(raw_spec)
    except SpecError as error:
        _report(body, invalid_status(str(error), generation, previous), "InvalidSpec", str(error), namespace, name)
        raise kopf.PermanentError(f"invalid spec: {error}") from None
    try:
        plan = plan_service(spec)
    except Refusal as refusal:
        _report(
            body,
            refused_status(refusal.condition, refusal.reason, refusal.message, generation, previous),
            refusal.reason,
            refusal.message,
            namespace,
            name,
        )
        raise kopf.PermanentError(refusal.message) from None
    for warning in plan.warnings:
        kopf.warn(body, reason="Warning", message=warning)

    service = Service(name=name, namespace=namespace, uid=uid, spec=spec, plan=plan, image=spec.runtime.image or SETTINGS.triton_image)
    kube = api()
    try:
        kube.apply(build_config_map(service))
        deployment = kube.apply(build_deployment(service))
        kube.apply(build_service(service))
        if spec.autoscaling is not None:
            kube.apply(build_hpa(service, kube.hpa_api_version))
        elif kube.delete(kube.hpa_api_version, "HorizontalPodAutoscaler", namespace, name):
            kopf.info(body, reason="AutoscalingRemoved", message="autoscaling unset: HorizontalPodAutoscaler deleted")
    except ApiException as error:
        # The status code stays visible; 4xx other than conflicts will not heal by retrying fast.
        delay = 5 if error.status in (409, 429) or error.status >= 500 else 30
        raise kopf.TemporaryError(f"applying children failed: {error.status} {error.reason}: {error.body}", delay=delay) from error
    new_status = deployed_status(service, deployment, generation, previous)
    api().patch_service_status(namespace, name, new_status)
    return new_status


def _report(body: Any, new_status: dict[str, Any], reason: str, message: str, namespace: str, name: str) -> None:
    kopf.warn(body, reason=reason, message=message)
    api().patch_service_status(namespace, name, new_status)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_change(name: str, namespace: str, uid: str, spec: Any, meta: Any, status: Any, body: Any, **_: Any) -> None:
    result = reconcile(name, namespace, uid, spec, meta.get("generation"), status, body)
    threads = result["threads"]
    kopf.info(
        body,
        reason="Reconciled",
        message=(
            f"Triton Deployment applied: {threads['instances']} instance(s) x {threads['intraOp']} intra-op + "
            f"{threads['interOp']} inter-op threads on {threads['cpus']:g} CPU(s); phase {result['phase']}"
        ),
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.resync_seconds, initial_delay=SETTINGS.resync_seconds)
def resync(name: str, namespace: str, uid: str, spec: Any, meta: Any, status: Any, body: Any, **_: Any) -> None:
    """Re-apply on a timer so manual edits of children are reverted; invalid specs stay as reported."""
    if (status or {}).get("phase") == "Failed" and (status or {}).get("observedGeneration") == meta.get("generation"):
        return
    reconcile(name, namespace, uid, spec, meta.get("generation"), status, body)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
def deployment_event(body: Any, namespace: str, type: str | None, **_: Any) -> None:
    """Follow the Deployment's status into the owner's status (readiness, replicas, Available)."""
    owner = next((o for o in body.get("metadata", {}).get("ownerReferences", []) if o.get("kind") == KIND), None)
    if owner is None or type == "DELETED":
        return
    kube = api()
    parent = kube.get(f"{GROUP}/{VERSION}", KIND, namespace, owner["name"])
    if parent is None or parent["metadata"].get("uid") != owner.get("uid"):
        return
    try:
        spec = parse_spec(parent.get("spec"))
        plan = plan_service(spec)
    except (SpecError, Refusal):
        return  # the service's own handler reports it; this Deployment predates the bad spec
    service = Service(
        name=owner["name"], namespace=namespace, uid=owner["uid"], spec=spec, plan=plan, image=spec.runtime.image or SETTINGS.triton_image
    )
    previous = parent.get("status") or {}
    # observedGeneration stays what the service handler last reconciled; this only refreshes readiness.
    new_status = deployed_status(service, dict(body), previous.get("observedGeneration"), previous.get("conditions"))
    kube.patch_service_status(namespace, owner["name"], new_status)
