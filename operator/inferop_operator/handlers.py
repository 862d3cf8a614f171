"""kopf registration: parse the spec, plan, build, apply, report. Nothing else lives here."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from inferop.errors import InferopError
from inferop_operator.builders import CHILDREN, Service
from inferop_operator.kubeapi import ApiFailure, KubeApi, load_client
from inferop_operator.plan import Refusal, plan_service
from inferop_operator.settings import OperatorSettings
from inferop_operator.spec import GROUP, KIND, PLURAL, VERSION, InferenceServiceSpec, SpecError, parse_spec
from inferop_operator.status import (
    Status,
    children_failed_status,
    deployed_status,
    failure_message,
    follow_deployment,
    invalid_status,
    new_warnings,
    read_status,
    refused_status,
    same_condition,
    status_patch,
)

SETTINGS = OperatorSettings()
log = logging.getLogger(__name__)
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


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, the service account; elsewhere the KUBECONFIG of this moment (the client library would
    use the one seen when it was first imported)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def reconcile(
    name: str,
    namespace: str,
    uid: str,
    raw_spec: Any,
    generation: int | None,
    status: Any,
    body: Any,
    retry: int = 0,
) -> Status:
    """Apply the children for a valid, safe spec and return the status; raise PermanentError for a spec that
    cannot run, TemporaryError (with a backoff over `retry`) for a child the API server refused for now.

    A Warning event is posted only for what the status written last did not already say, so resyncs and restarts
    repeat none."""
    current = dict(status or {})
    previous = read_status(current)
    try:
        spec = parse_spec(raw_spec)
    except SpecError as error:
        new_status = invalid_status(str(error), generation, previous)
        if not same_condition("Valid", previous, new_status):
            kopf.warn(body, reason="InvalidSpec", message=str(error))
        patch_status(namespace, name, current, new_status)
        raise kopf.PermanentError(f"invalid spec: {error}") from None
    try:
        plan = plan_service(spec, SETTINGS.runtime_costs())
    except Refusal as refusal:
        new_status = refused_status(refusal.condition, refusal.reason, refusal.message, generation, previous)
        if not same_condition(refusal.condition, previous, new_status):
            kopf.warn(body, reason=refusal.reason, message=refusal.message)
        patch_status(namespace, name, current, new_status)
        raise kopf.PermanentError(refusal.message) from None

    service = Service(name=name, namespace=namespace, uid=uid, spec=spec, plan=plan, image=image_for(spec))
    try:
        deployment = apply_children(service, body)
    except ChildFailed as failed:
        failure = failed.failure
        new_status = children_failed_status(service, failure, generation, previous)
        warn_new(body, previous, new_status)
        # One Warning per new answer; retries that meet the same answer only log it.
        if not same_condition("ChildrenApplied", previous, new_status):
            kopf.warn(body, reason=failure.reason, message=failure_message(failure))
        try:
            patch_status(namespace, name, current, new_status)
        except ApiException as error:  # an apiserver that refuses the child may refuse this too
            log.warning("status of %s/%s not written: %s %s", namespace, name, error.status, error.reason)
        if failure.permanent:
            raise kopf.PermanentError(failure.explain()) from failed.__cause__
        raise kopf.TemporaryError(failure.explain(), delay=failure.delay(retry)) from failed.__cause__
    new_status = deployed_status(service, deployment, generation, previous)
    warn_new(body, previous, new_status)
    patch_status(namespace, name, current, new_status)
    return new_status


def warn_new(body: Any, previous: Status, new: Status) -> None:
    """A Warning event for each of the plan's warnings that the status written last did not carry."""
    for warning in new_warnings(previous, new):
        kopf.warn(body, reason="Warning", message=warning)


class ChildFailed(InferopError):
    """The API server refused a request about one child; `failure` says which and why."""

    def __init__(self, failure: ApiFailure):
        super().__init__(failure.explain())
        self.failure = failure


def apply_children(service: Service, body: Any) -> dict[str, Any]:
    """Apply every child the spec wants and delete those it no longer wants; return the applied Deployment."""
    kube = api()
    applied: dict[str, dict[str, Any]] = {}
    for child in CHILDREN:
        name = child.name(service)
        action = "apply" if child.wanted(service) else "delete"
        try:
            version = kube.served_version(child)
            if action == "apply":
                applied[child.kind] = kube.apply(child.build(service, version))
            elif kube.delete(version, child.kind, service.namespace, name):
                reason, why = child.removal
                kopf.info(body, reason=reason, message=f"{why}: {child.kind} {name} deleted")
        except ApiException as error:
            raise ChildFailed(ApiFailure.of(error, action, child.kind, name)) from error
    return applied["Deployment"]


def image_for(spec: InferenceServiceSpec) -> str:
    return spec.runtime.image or SETTINGS.triton_image


def patch_status(namespace: str, name: str, current: Mapping[str, Any], new: Status) -> None:
    """Patch only what changed: a resync of a converged service costs no write."""
    patch = status_patch(current, new)
    if patch:
        api().patch_service_status(namespace, name, patch)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_change(
    name: str, namespace: str | None, uid: str, spec: Any, meta: Any, status: Any, body: Any, retry: int, **_: Any
) -> None:
    assert namespace is not None, "InferenceServices are namespaced"
    result = reconcile(name, namespace, uid, spec, meta.get("generation"), status, body, retry)
    threads = result.threads
    assert threads is not None, "a reconciled status carries the thread plan"
    kopf.info(
        body,
        reason="Reconciled",
        message=(
            f"Triton Deployment applied: {threads.instances} instance(s) x {threads.intra_op} intra-op + "
            f"{threads.inter_op} inter-op threads on {threads.cpus:g} CPU(s); phase {result.phase}"
        ),
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.resync_seconds, initial_delay=SETTINGS.resync_seconds)
def resync(
    name: str, namespace: str | None, uid: str, spec: Any, meta: Any, status: Any, body: Any, retry: int = 0, **_: Any
) -> None:
    """Re-apply on a timer so manual edits of children are reverted; a spec that failed for good (Failed: invalid,
    refused, or a child the API server rejects as invalid) stays as reported until it changes."""
    assert namespace is not None, "InferenceServices are namespaced"
    if (status or {}).get("phase") == "Failed" and (status or {}).get("observedGeneration") == meta.get("generation"):
        return
    reconcile(name, namespace, uid, spec, meta.get("generation"), status, body, retry)


@kopf.index(GROUP, VERSION, PLURAL)
def services(uid: str, status: Any, **_: Any) -> dict[str, dict[str, Any]]:
    """Statuses of the services by uid, kept in memory from the watch, so following a Deployment costs no GET."""
    return {uid: copy.deepcopy(dict(status or {}))}


# kopf passes indices as keyword arguments its handler protocols do not list.
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)  # type: ignore[arg-type]
def deployment_event(
    body: Any, namespace: str | None, type: str, services: kopf.Index[str, dict[str, Any]], **_: Any
) -> None:
    """Follow the Deployment's readiness (replicas, readyReplicas, Available, Ready, phase) into the owner's status,
    on top of what the service handler last wrote: no re-parsing, no re-planning."""
    owner = next((o for o in body.get("metadata", {}).get("ownerReferences", []) if o.get("kind") == KIND), None)
    known = services.get(owner["uid"]) if owner else None
    if owner is None or namespace is None or type == "DELETED" or not known:
        return
    written = next(iter(known))
    current = read_status(written)
    # Not reconciled yet, a spec that cannot run, or a child missing: the service handler reports those.
    if current.phase not in ("Ready", "Progressing"):
        return
    patch_status(namespace, owner["name"], written, follow_deployment(current, dict(body), current))
