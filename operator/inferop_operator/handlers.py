"""kopf registration: parse the spec, plan, build, apply, report. Nothing else lives here."""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, ParamSpec, TypeVar

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from inferop_core.errors import InferopError
from inferop_operator.builders import CHILDREN, Service, routing_for
from inferop_operator.diagnosis import pod_facts
from inferop_operator.identity import (
    API_VERSION,
    CANDIDATE_SUFFIX,
    GROUP,
    INSTANCE,
    KIND,
    MANAGED,
    PLURAL,
    ROUTE_API,
    TRITON_PODS_SELECTOR,
    VERSION,
    label_selector,
)
from inferop_operator.kubeapi import ApiFailure, KubeApi, load_client
from inferop_operator.plan import Plan, Refusal, check_routing, plan_service
from inferop_operator.progress import deployment_summary, observe
from inferop_operator.rollout import (
    CANDIDATE_PHASES,
    RolloutStatus,
    advance,
    decide,
    revision_of,
    served_fields,
    stable_spec,
)
from inferop_operator.settings import OperatorSettings
from inferop_operator.spec import GatewayRef, InferenceServiceSpec, SpecError, Webhook, parse_spec
from inferop_operator.status import (
    AdviceLedger,
    Status,
    children_failed_status,
    deployed_status,
    failure_message,
    follow_deployment,
    follow_pods,
    invalid_status,
    new_warnings,
    read_status,
    refused_status,
    same_condition,
    status_patch,
)
from inferop_operator.webhook import NOTIFIER, decision

log = logging.getLogger(__name__)
# Seconds before a reconcile that could not reach the API server is tried again.
UNREACHABLE_RETRY = 2.0
# Seconds before a service whose Gateway does not exist is tried again (someone may create it), doubled on each
# retry up to GATEWAY_RETRY_MAX.
GATEWAY_RETRY, GATEWAY_RETRY_MAX = 5.0, 60.0
_memo_guard = threading.Lock()  # creates each object's lock once
P = ParamSpec("P")
R = TypeVar("R")
_api: KubeApi | None = None
_threads: Executor | None = None  # kopf's threads for sync handlers, shared by the async handlers' API calls
_advised = AdviceLedger()  # shared by the service's, the Deployment's and the pods' handlers
_settings: OperatorSettings | None = None  # read when the operator starts (`registry`)


def registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    """The operator's handlers, for a run with `settings` (read when the operator starts, not when this module is
    imported): the timers' intervals are settings, and a process may run the operator several times."""
    global _settings
    _settings = settings
    handlers = kopf.OperatorRegistry()
    kopf.on.startup(registry=handlers)(configure)
    kopf.on.login(registry=handlers)(login)
    for on in (kopf.on.resume, kopf.on.create):
        on(GROUP, VERSION, PLURAL, registry=handlers)(on_change)
    kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=handlers)(on_change)
    resync_every = settings.resync_seconds
    kopf.timer(GROUP, VERSION, PLURAL, interval=resync_every, initial_delay=resync_every, registry=handlers)(resync)
    tick = settings.rollout_tick_seconds
    kopf.timer(GROUP, VERSION, PLURAL, interval=tick, when=rollout_in_flight, registry=handlers)(rollout_tick)
    for index in (services, service_uids):
        kopf.index(GROUP, VERSION, PLURAL, registry=handlers)(index)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=handlers)(forget_deleted)
    kopf.index("apps", "v1", "deployments", labels=MANAGED, registry=handlers)(deployments)
    kopf.index("", "v1", "pods", labels=MANAGED, registry=handlers)(pods)
    # kopf passes indices as keyword arguments its handler protocols do not list.
    kopf.on.event("apps", "v1", "deployments", labels=MANAGED, registry=handlers)(deployment_event)  # type: ignore[arg-type]
    kopf.on.event("", "v1", "pods", labels=MANAGED, registry=handlers)(pod_event)  # type: ignore[arg-type]
    return handlers


def operator_settings() -> OperatorSettings:
    assert _settings is not None, "the operator's settings are read when it starts (registry)"
    return _settings


def api() -> KubeApi:
    global _api
    if _api is None:
        settings = operator_settings()
        _api = KubeApi(load_client(settings.api_workers), settings.field_manager)
    return _api


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    if ablated := operator_settings().ablated_safeguards():
        log.warning("rollout safeguards removed by INFEROP_ROLLOUT_ABLATE (a drill's ablation): %s", sorted(ablated))
    # Our state lives in our own annotation prefix, not kopf's default, so two tools never collide.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-applied-spec")
    # Every wait is bounded: a dropped watch reconnects rather than hanging silently.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    # Decisions at INFO and above become Kubernetes Events a user sees in `kubectl describe`.
    settings.posting.level = logging.INFO
    # kopf posts each object's Events on a task of its own, each open request on a TLS connection of its own, and
    # asyncio gives every TLS connection a 256 KiB read buffer: a few posters send a burst's Events in order.
    settings.posting.worker_limit = 4
    # Sync handlers (the reconciles) run in threads, each waiting on the API server: more threads than the server
    # answers at once only hold more objects in flight.
    settings.execution.max_workers = operator_settings().api_workers
    global _threads, _api
    _threads = settings.execution.executor
    _api = None  # logged in again by each run: a process may run the operator against several clusters in turn
    settings.queueing.error_delays = [1, 2, 5, 10, 30]
    # kopf retries a failed API request (a watch among them) after 1, 1, 2, 3, 5, 8, 13 and 21 s, then gives up:
    # after an apiserver outage of 20 s its watches came back 13 s late. Capped at 5 s (for 5 minutes), they are
    # back within 5 s of the apiserver (measured by `make drills`: the control-plane restart drill).
    settings.networking.error_backoffs = [1, 1, 2, 3, *[5] * 60]
    # The API server sends only our Deployments and Triton pods: the handlers' label filters alone would have every
    # pod and Deployment of the cluster streamed to the operator and remembered by kopf.
    settings.watching.label_selectors["apps", "v1", "deployments"] = label_selector(MANAGED)
    settings.watching.label_selectors["", "v1", "pods"] = TRITON_PODS_SELECTOR
    await_served(operator_settings().crd_wait_seconds)


class NotServed(InferopError, kopf.PermanentError):
    """The API server does not serve InferenceServices: the CRD is missing, or was never established."""


def await_served(timeout: float) -> None:
    """Return once the API server serves InferenceServices; raise NotServed (the operator exits) after `timeout`.

    kopf looks up what it serves once, right after the startup handlers (and again only when a CRD changes, where it
    watches CRDs at all). Started in the moment between a CRD's creation and the API server serving its version, it
    never served InferenceServices and said so only in a log line (on 1.37, kopf's scan found none 0.1 s after
    kubectl had listed the group). With one namespace watched, it would not notice a CRD installed later either."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            if PLURAL in api().resources(API_VERSION):
                return
            why = f"the API server does not serve {PLURAL}.{API_VERSION}"
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            why = f"the API server did not answer: {error}"
        if not said:  # one line, not one a poll
            log.info("waiting up to %g s for %s to be served (%s)", timeout, PLURAL, why)
            said = True
        if time.monotonic() > deadline:
            raise NotServed(
                f"{why} after {timeout:g} s: install the CRD (charts/inferop/crds, or helm install inferop) "
                "and start the operator again"
            )
        time.sleep(0.2)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, the service account; elsewhere the KUBECONFIG of this moment (the client library would
    use the one seen when it was first imported)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def retried_when_unreachable(function: Callable[P, R]) -> Callable[P, R]:
    """An API server that cannot be reached is back within seconds or not at all: retry in UNREACHABLE_RETRY
    seconds (not kopf's growing error delays, which kept services 30 s behind a restarted control plane), and log
    it without a traceback."""

    @functools.wraps(function)
    def retried(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise kopf.TemporaryError(f"the API server cannot be reached: {error}", delay=UNREACHABLE_RETRY) from None

    return retried


@retried_when_unreachable
def reconcile(
    name: str,
    namespace: str,
    uid: str,
    raw_spec: Any,
    generation: int | None,
    status: Any,
    body: Any,
    retry: int = 0,
    pods: Callable[[], list[dict[str, Any]]] = list,
    delete_unwanted: bool = True,
    memo: Any = None,
    deployments: Mapping[str, Mapping[str, Any]] | None = None,
    old_spec: Any = None,
    tick: bool = False,
) -> tuple[Status, bool]:
    """Apply the children for a valid, safe spec and return the status and whether it changed; raise PermanentError
    for a spec that cannot run, TemporaryError (with a backoff over `retry`) for a child the API server refused for
    now.

    With spec.rollout, a changed spec becomes a candidate beside the stable revision; `tick` (the rollout timer) also
    observes and takes the rollout's next step. `deployments` are the service's Deployments by name (the index's
    summaries), `old_spec` the spec handled before this change (kopf's diff base). `pods` reads what the service's
    pods report now: the status is derived after the children are applied, not from what the pods said when the
    handler was called (a resync that read a pod before its OOM kill, then wrote it healthy, made the kill's Warning
    go out twice). A Warning event is posted only for what the status written last did not already say, so resyncs
    and restarts repeat none. `delete_unwanted` False (a resync) only applies: children are deleted when the spec
    changes."""
    with object_lock(memo):
        return _reconcile(
            name, namespace, uid, raw_spec, generation, status, body, retry, pods, delete_unwanted,
            memo, deployments or {}, old_spec, tick,
        )  # fmt: skip


def _reconcile(
    name: str,
    namespace: str,
    uid: str,
    raw_spec: Any,
    generation: int | None,
    status: Any,
    body: Any,
    retry: int,
    pods: Callable[[], list[dict[str, Any]]],
    delete_unwanted: bool,
    memo: Any,
    deployments: Mapping[str, Mapping[str, Any]],
    old_spec: Any,
    tick: bool,
) -> tuple[Status, bool]:
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
        plan = plan_service(spec, operator_settings().runtime_costs())
        split, gateway, routing_warning = routing_mode(spec, namespace)
    except Refusal as refusal:
        new_status = refused_status(refusal.condition, refusal.reason, refusal.message, generation, previous)
        if not same_condition(refusal.condition, previous, new_status):
            kopf.warn(body, reason=refusal.reason, message=refusal.message)
        patch_status(namespace, name, current, new_status)
        raise kopf.PermanentError(refusal.message) from None
    except GatewayMissing as missing:
        new_status = refused_status("ChildrenApplied", "GatewayNotFound", str(missing), generation, previous)
        new_status = new_status.model_copy(update={"phase": "Pending"})
        if not same_condition("ChildrenApplied", previous, new_status):
            kopf.warn(body, reason="GatewayNotFound", message=str(missing))
        patch_status(namespace, name, current, new_status)
        delay = min(GATEWAY_RETRY * 2 ** min(retry, 8), GATEWAY_RETRY_MAX)
        raise kopf.TemporaryError(str(missing), delay=delay) from None

    now = time.time()
    known = latest_rollout(memo, previous)
    image = image_for(spec)
    state = decide(spec, revision_of(spec, image), known, split, now, former(old_spec))
    service = service_tree(name, namespace, uid, spec, plan, state, split, gateway, deployments)
    if tick and spec.rollout is not None and state.candidate_wanted:
        configured = operator_settings()
        observed, state = observe(
            service, spec, state, split, api(), deployments, pods(), configured.prometheus_url, now,
            configured.ablated_safeguards(),
        )  # fmt: skip
        state = advance(state, spec.rollout, observed, served_fields(spec))
        if state == known:
            return previous, False  # nothing moved: no write
        service = service_tree(name, namespace, uid, spec, plan, state, split, gateway, deployments)
    try:
        deployment = apply_children(service, body, delete_unwanted)
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
    new_status = advise(
        body, uid, previous, lambda: deployed_status(service, deployment, generation, previous, pods(), state)
    )
    if routing_warning:
        new_status = new_status.model_copy(update={"warnings": [*(new_status.warnings or []), routing_warning]})
    warn_new(body, previous, new_status)
    announce_rollout(body, known, state, spec.rollout.webhook if spec.rollout is not None else None)
    changed = patch_status(namespace, name, current, new_status)
    if memo is not None:
        memo["rollout"] = state
    return new_status, changed


class GatewayMissing(InferopError, LookupError):
    """The Gateway the spec (or the operator's default) names does not exist; the message names the field."""


def routing_mode(spec: InferenceServiceSpec, namespace: str) -> tuple[str, GatewayRef | None, str | None]:
    """How callers are routed: through the Gateway the spec or the operator's settings name, where Gateway API is
    served ("gateway"), else by the share of pods behind the one Service ("replicas"); and a warning, if any. Header
    matches and mirroring need a gateway: without one they are refused, saying what to install."""
    wanted = spec.gateway or operator_settings().gateway()
    served = wanted is not None and api().serves(ROUTE_API, "httproutes")
    check_routing(spec, wanted, served)
    if wanted is None or not served:
        warning = None
        if spec.gateway is not None:
            warning = (
                f"spec.gateway: Gateway API ({ROUTE_API} httproutes) is not served by this cluster: no HTTPRoute is "
                "written, and a rollout splits traffic by the share of pods behind the Service (approximate)"
            )
        return "replicas", None, warning
    gateway = wanted.model_copy(update={"namespace": wanted.namespace or namespace})
    assert gateway.namespace is not None
    if api().get(ROUTE_API, "Gateway", gateway.namespace, gateway.name) is None:
        field = (
            "spec.gateway.name"
            if spec.gateway is not None
            else "the operator's default gateway (INFEROP_DEFAULT_GATEWAY)"
        )
        raise GatewayMissing(
            f"{field}: Gateway {gateway.name} does not exist in namespace {gateway.namespace}: create it or name "
            "another; the service is routed once it exists"
        )
    return "gateway", gateway, None


def service_tree(
    name: str,
    namespace: str,
    uid: str,
    spec: InferenceServiceSpec,
    plan: Plan,
    state: RolloutStatus,
    split: str,
    gateway: GatewayRef | None,
    deployments: Mapping[str, Mapping[str, Any]],
) -> Service:
    """The stable track (the stable revision's spec, or the spec itself without a rollout) with its routing and,
    while a candidate runs, the candidate track built from the spec."""
    stable = stable_spec(spec, state)
    stable_plan = plan if stable is spec else plan_service(stable, operator_settings().runtime_costs())

    def replicas(deployment_name: str) -> int | None:
        found = deployments.get(deployment_name)
        return None if found is None else found.get("specReplicas")

    routing = routing_for(state, split, gateway, spec, replicas(name), replicas(f"{name}{CANDIDATE_SUFFIX}"))
    settings = operator_settings()
    fetch, operator_namespace = settings.fetch_image, settings.operator_namespace
    candidate = None
    if state.candidate_wanted:
        candidate = Service(
            name, namespace, uid, spec, plan, image_for(spec), track="candidate", routing=routing, fetch_image=fetch,
            operator_namespace=operator_namespace,
        )  # fmt: skip
    return Service(
        name, namespace, uid, stable, stable_plan, image_for(stable), routing=routing, candidate=candidate,
        fetch_image=fetch, operator_namespace=operator_namespace,
    )  # fmt: skip


def latest_rollout(memo: Any, previous: Status) -> RolloutStatus | None:
    """The rollout state this process wrote last (a status event may still be on its way), else the status's."""
    written = memo.get("rollout") if memo is not None else None
    return written if isinstance(written, RolloutStatus) else previous.rollout


def former(old_spec: Any) -> tuple[InferenceServiceSpec, str] | None:
    """The spec handled before this change and its revision, when kopf has it and it is valid."""
    if not old_spec:
        return None
    try:
        spec = parse_spec(old_spec)
    except SpecError:
        return None
    return spec, revision_of(spec, image_for(spec))


def object_lock(memo: Any) -> threading.Lock:
    """One lock per InferenceService, kept in its kopf memo (dropped with the object): its rollout timer and its
    change handlers run on different tasks and must not interleave."""
    if memo is None:
        return threading.Lock()
    with _memo_guard:
        lock = memo.get("lock")
        if lock is None:
            lock = memo["lock"] = threading.Lock()
    return lock  # type: ignore[no-any-return]


def announce_rollout(body: Any, before: RolloutStatus | None, after: RolloutStatus, webhook: Webhook | None) -> None:
    """One Event per move of a rollout (its phase, reason or traffic), and one post to the spec's webhook."""
    if after.phase is None:
        return

    def moved(state: RolloutStatus | None) -> tuple[Any, ...] | None:
        if state is None:
            return None
        return state.phase, state.reason, state.candidate, state.weight, state.mirror_percent, state.header

    if moved(before) == moved(after):
        return
    traffic = f" (candidate weight {after.weight}%)" if after.phase in CANDIDATE_PHASES else ""
    message = f"{after.phase}{traffic}: {after.message}"
    if after.phase in ("RollingBack", "RolledBack"):
        kopf.warn(body, reason=after.reason or after.phase, message=message)
    else:
        kopf.info(body, reason=after.reason or after.phase, message=message)
    if webhook is not None:
        metadata = body.get("metadata") or {}
        NOTIFIER.notify(webhook.url, decision(metadata, after), webhook.timeout_seconds, webhook.attempts)


def warn_new(body: Any, previous: Status, new: Status) -> None:
    """A Warning event for each of the plan's warnings that the status written last did not carry."""
    for warning in new_warnings(previous, new):
        kopf.warn(body, reason="Warning", message=warning)


def advise(body: Any, uid: str, previous: Status, derive: Callable[[], Status]) -> Status:
    """The status `derive` makes, with a Warning event for each advice condition (a stuck rollout, failing pods)
    that fails with something new: one per change, not one per resync."""
    new, fresh = _advised.derive(uid, previous, derive)
    for advice in fresh:
        kopf.warn(body, reason=advice.reason, message=advice.message)
    return new


class ChildFailed(InferopError):
    """The API server refused a request about one child; `failure` says which and why."""

    def __init__(self, failure: ApiFailure):
        super().__init__(failure.explain())
        self.failure = failure


def apply_children(service: Service, body: Any, delete_unwanted: bool = True) -> dict[str, Any]:
    """Apply every child the spec wants and delete those it no longer wants; return the stable Deployment."""
    kube = api()
    applied: dict[tuple[str, str], dict[str, Any]] = {}
    for child in CHILDREN:
        name = child.name(service)
        action = "apply" if child.wanted(service) else "delete"
        if action == "delete" and not delete_unwanted:
            continue
        try:
            version = kube.served_version(child)
            if child.extension and not kube.serves(version, child.plural):
                continue
            if action == "apply":
                applied[child.kind, name] = kube.apply(child.build(service, version))
            elif kube.delete(version, child.kind, service.namespace, name):
                reason, why = child.removal
                kopf.info(body, reason=reason, message=f"{why}: {child.kind} {name} deleted")
        except ApiException as error:
            raise ChildFailed(ApiFailure.of(error, action, child.kind, name)) from error
    return applied["Deployment", service.name]


def image_for(spec: InferenceServiceSpec) -> str:
    return spec.runtime.image or operator_settings().triton_image


def patch_status(namespace: str, name: str, current: Mapping[str, Any], new: Status) -> bool:
    """Patch only what changed: a resync of a converged service costs no write. True when something was written;
    a service deleted meanwhile (404) has no status to write."""
    patch = status_patch(current, new)
    if not patch:
        return False
    try:
        api().patch_service_status(namespace, name, patch)
    except ApiException as error:
        if error.status != 404:
            raise
        log.info("status of %s/%s not written: the service is gone", namespace, name)
        return False
    return True


def on_change(
    name: str,
    namespace: str | None,
    uid: str,
    spec: Any,
    meta: Any,
    status: Any,
    body: Any,
    retry: int,
    reason: str,
    memo: Any,
    old: Any = None,
    **indices: Any,
) -> None:
    assert namespace is not None, "InferenceServices are namespaced"
    # A service just created has no children to remove: three DELETEs answered 404 per create were a third of the
    # requests of a burst of creates.
    deletes = reason != kopf.Reason.CREATE
    result, changed = reconcile(
        name, namespace, uid, spec, meta.get("generation"), status, body, retry,
        lambda: service_pods(indices, namespace, name), deletes,
        memo=memo, deployments=service_deployments(indices, namespace, name), old_spec=old,
    )  # fmt: skip
    if not changed:
        return  # a restart that resumes a converged service has nothing to say
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


def resync(
    name: str,
    namespace: str | None,
    uid: str,
    spec: Any,
    meta: Any,
    status: Any,
    body: Any,
    memo: Any,
    retry: int = 0,
    **indices: Any,
) -> None:
    """Re-apply on a timer so manual edits of children are reverted; a spec that failed for good (Failed: invalid,
    refused, or a child the API server rejects as invalid) stays as reported until it changes."""
    if (status or {}).get("phase") == "Failed" and (status or {}).get("observedGeneration") == meta.get("generation"):
        return
    on_timer(name, namespace, uid, spec, meta, status, body, memo, retry, indices, tick=False)


def rollout_in_flight(status: Any, **_: Any) -> bool:
    """A candidate runs: its rollout needs looking after."""
    return ((status or {}).get("rollout") or {}).get("phase") in CANDIDATE_PHASES


def rollout_tick(
    name: str,
    namespace: str | None,
    uid: str,
    spec: Any,
    meta: Any,
    status: Any,
    body: Any,
    memo: Any,
    retry: int = 0,
    **indices: Any,
) -> None:
    """Take the rollout's next step when what it waits for has happened (pods ready, the route accepted, an
    analysis due); nothing is written while nothing moves."""
    on_timer(name, namespace, uid, spec, meta, status, body, memo, retry, indices, tick=True)


def on_timer(
    name: str,
    namespace: str | None,
    uid: str,
    spec: Any,
    meta: Any,
    status: Any,
    body: Any,
    memo: Any,
    retry: int,
    indices: Mapping[str, Any],
    tick: bool,
) -> None:
    """A timer's reconcile: applies only (children are deleted when the spec changes), unless a rollout's `tick`
    moves it on."""
    assert namespace is not None, "InferenceServices are namespaced"
    deployments = service_deployments(indices, namespace, name)
    generation = meta.get("generation")
    reconcile(
        name, namespace, uid, spec, generation, status, body, retry, lambda: service_pods(indices, namespace, name),
        delete_unwanted=tick,
        memo=memo, deployments=deployments, tick=tick,
    )  # fmt: skip


def service_pods(indices: Mapping[str, Any], namespace: str, name: str) -> list[dict[str, Any]]:
    """The `pod_facts` of a service's pods, from the pods index kopf passes every handler as a keyword argument
    (which the protocols of kopf's change and timer handlers do not list)."""
    return list(indices["pods"].get((namespace, name), []))


def service_deployments(indices: Mapping[str, Any], namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The service's Deployments (stable and candidate), by name, from the Deployments index."""
    found = {}
    for deployment in (name, f"{name}{CANDIDATE_SUFFIX}"):
        summary = next(iter(indices["deployments"].get((namespace, deployment), [])), None)
        if summary is not None:
            found[deployment] = summary
    return found


# The indices and the Deployment's and pods' handlers are coroutines: kopf runs a plain function on a thread, and
# every event would wait behind the queued reconciles holding its object's body (945 of them 19 s into a burst of
# 1,000 creates).
async def services(uid: str, status: Any, **_: Any) -> dict[str, dict[str, Any]]:
    """Statuses of the services by uid, kept in memory from the watch, so following a Deployment costs no GET."""
    return {uid: copy.deepcopy(dict(status or {}))}


async def forget_deleted(event: kopf.RawEvent, uid: str, **_: Any) -> None:
    """A deleted service's advice is forgotten with it: a long-running operator does not keep every uid it saw."""
    if event["type"] == "DELETED":
        _advised.forget(uid)


async def service_uids(name: str, namespace: str | None, uid: str, **_: Any) -> dict[tuple[str | None, str], str]:
    """Uids of the services by namespace and name: a pod names its service only by its instance label."""
    return {(namespace, name): uid}


async def deployments(name: str, namespace: str | None, body: Any, **_: Any) -> dict[tuple[str | None, str], Any]:
    """Each Triton Deployment's progress (`deployment_summary`), by namespace and name: a rollout asks no GET."""
    return {(namespace, name): deployment_summary(dict(body))}


async def pods(body: Any, namespace: str | None, labels: Any, **_: Any) -> dict[tuple[str | None, str], dict[str, Any]]:
    """What each service's pods report about their containers (`pod_facts`), by namespace and service name."""
    return {(namespace, str(labels.get(INSTANCE))): pod_facts(dict(body))}


async def deployment_event(
    body: Any,
    namespace: str | None,
    type: str,
    services: kopf.Index[str, dict[str, Any]],
    pods: kopf.Index[tuple[str, str], dict[str, Any]],
    **_: Any,
) -> None:
    """Follow the Deployment's rollout and readiness (replicas, readyReplicas, Progressing, Available, Ready, phase)
    and the pods' health into the owner's status, on top of what the service handler last wrote: no re-parsing, no
    re-planning."""
    owner = next((o for o in body.get("metadata", {}).get("ownerReferences", []) if o.get("kind") == KIND), None)
    known = services.get(owner["uid"]) if owner else None
    if owner is None or namespace is None or type == "DELETED" or not known:
        return
    if body.get("metadata", {}).get("name") != owner["name"]:
        return  # the candidate's Deployment: the rollout timer follows it
    written = next(iter(known))
    current = read_status(written)
    # Not reconciled yet, a spec that cannot run, or a child missing: the service handler reports those.
    if current.phase not in ("Ready", "Progressing"):
        return
    followed = follow_deployment(current, dict(body), current)
    new_status = advise(
        service_ref(namespace, owner["name"], owner["uid"]),
        owner["uid"],
        current,
        lambda: follow_pods(followed, list(pods.get((namespace, owner["name"]), [])), current),
    )
    await write_status(namespace, owner["name"], written, new_status)


async def pod_event(
    namespace: str | None,
    labels: Any,
    services: kopf.Index[str, dict[str, Any]],
    service_uids: kopf.Index[tuple[str, str], str],
    pods: kopf.Index[tuple[str, str], dict[str, Any]],
    **_: Any,
) -> None:
    """Explain the service's failing pods (PodsHealthy, with the fix) from what all of its pods report now, on
    top of the status last written; a deleted pod is already out of the index, so a replaced pod clears it."""
    name = str(labels.get(INSTANCE))
    uid = next(iter(service_uids.get((namespace, name), [])), None) if namespace else None
    known = services.get(uid) if uid else None
    if namespace is None or uid is None or not known:
        return
    written = next(iter(known))
    current = read_status(written)
    if current.phase not in ("Ready", "Progressing"):
        return
    new_status = advise(
        service_ref(namespace, name, uid),
        uid,
        current,
        lambda: follow_pods(current, list(pods.get((namespace, name), [])), current),
    )
    await write_status(namespace, name, written, new_status)


async def write_status(namespace: str, name: str, written: Mapping[str, Any], new: Status) -> None:
    """Take a thread (behind every queued reconcile) only to write a change: most events change nothing."""
    if status_patch(written, new):
        await asyncio.get_running_loop().run_in_executor(_threads, patch_status, namespace, name, written, new)


def service_ref(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """What kopf needs of an InferenceService to post an Event about it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
    }
