"""What a rollout in progress observes before the state machine (rollout.advance) takes its next step: the
Deployments and pods (from the operator's in-memory indices), what the candidate's pods report, the HTTPRoute's
acceptance by its Gateway, the agreement check against the pods, and the analysis from Prometheus. Each is asked
only when the state needs it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from inferop_core.tritonconfig import pipeline_members
from inferop_operator.agreement import AgreementError, compare_revisions
from inferop_operator.analysis import PrometheusUnreachable, prometheus_reader, route_clusters
from inferop_operator.builders import HTTP_PORT, Service, build_http_route, candidate_name
from inferop_operator.diagnosis import candidate_failure
from inferop_operator.identity import COMPONENTS, ROUTE_API, Track
from inferop_operator.kubeapi import KubeApi
from inferop_operator.rollout import (
    JUDGED_PHASES,
    AnalysisStatus,
    Observed,
    RolloutStatus,
    TrackFigures,
    analysis_due,
    analysis_window,
    judge,
    roll_back,
    seconds_of,
    takes_live_traffic,
    timestamp,
)
from inferop_operator.spec import InferenceServiceSpec

log = logging.getLogger(__name__)


def rolled_out(deployment: Mapping[str, Any] | None, replicas: int | None = None) -> bool:
    """A Deployment (its index summary) runs its current template on every replica, all ready: `replicas` of them
    when given."""
    if not deployment:
        return False
    want = deployment.get("specReplicas") if replicas is None else replicas
    return bool(
        deployment.get("generation") == deployment.get("observedGeneration")
        and want is not None
        and deployment.get("replicas", 0) == want
        and deployment.get("updatedReplicas", 0) == want
        and deployment.get("readyReplicas", 0) == want
    )


def deployment_summary(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the Deployments index keeps: enough to tell a finished rollout, nothing more."""
    status, spec = body.get("status") or {}, body.get("spec") or {}
    return {
        "generation": (body.get("metadata") or {}).get("generation"),
        "observedGeneration": status.get("observedGeneration"),
        "specReplicas": spec.get("replicas"),
        "replicas": status.get("replicas", 0),
        "updatedReplicas": status.get("updatedReplicas", 0),
        "readyReplicas": status.get("readyReplicas", 0),
    }


def ready_pod_url(pods: Iterable[Mapping[str, Any]], track: Track) -> str | None:
    """Triton's HTTP endpoint on one ready pod of the track, by its IP (agreement goes to the pods, not to callers'
    routes)."""
    for pod in sorted(pods, key=lambda p: str(p.get("name"))):
        if pod.get("component") == COMPONENTS[track] and pod.get("ready") and pod.get("ip"):
            return f"http://{pod['ip']}:{HTTP_PORT}"
    return None


def route_settled(route: Mapping[str, Any] | None) -> bool:
    """Every Gateway the route names accepted its current generation and resolved its backends."""
    if not route:
        return False
    generation = (route.get("metadata") or {}).get("generation")
    parents = ((route.get("status") or {}).get("parents")) or []
    if not parents:
        return False
    for parent in parents:
        conditions = {c.get("type"): c for c in parent.get("conditions") or []}
        for kind in ("Accepted", "ResolvedRefs"):
            found = conditions.get(kind)
            if not found or found.get("status") != "True" or found.get("observedGeneration") != generation:
                return False
    return True


def observe(
    service: Service,
    spec: InferenceServiceSpec,
    state: RolloutStatus,
    split: str,
    kube: KubeApi,
    deployments: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    prometheus_url: str | None,
    now: float,
    ablated: frozenset[str] = frozenset(),
) -> tuple[Observed, RolloutStatus]:
    """What the state machine needs now (and the state with the agreement check's trouble noted, if any), without
    the safeguards `ablated` (rollout.SAFEGUARDS)."""
    assert spec.rollout is not None and service.candidate is not None
    pods = list(pods)
    stable_deployment = deployments.get(service.name)
    candidate_deployment = deployments.get(service.candidate.object_name)
    candidate_ready = rolled_out(candidate_deployment, service.routing.candidate_replicas)
    settled = _traffic_settled(service, split, kube, stable_deployment, candidate_deployment)
    failure = None
    if state.phase in JUDGED_PHASES and "pod-failures" not in ablated:  # from the pods index: no API request
        candidate_pods = [pod for pod in pods if pod.get("component") == COMPONENTS["candidate"]]
        required = service.candidate.plan.memory.required_bytes
        failure = candidate_failure(candidate_pods, required, takes_live_traffic(state))
    agreement = None
    if failure is None and state.phase == "Agreement" and candidate_ready and state.scaling_for is None:
        agreement, state = _agreement(service, spec, state, pods, now)  # not once it agreed
    analysis = None
    if failure is None and analysis_due(state, spec.rollout, now):
        gateway = split == "gateway" and service.routing.gateway is not None
        reader = figures_reader(service, spec, prometheus_url, gateway, ablated)
        analysis = analyse(state, spec, reader, now, through_gateway=gateway, ablated=ablated)
    observed = Observed(
        now=now,
        candidate_ready=candidate_ready,
        traffic_settled=settled,
        stable_rolled_out=rolled_out(stable_deployment),
        stable_full=spec.replicas if split == "gateway" and spec.autoscaling is None else None,
        agreement=agreement,
        analysis=analysis,
        candidate_failure=failure,
        ablated=ablated,
    )
    return observed, state


def _traffic_settled(
    service: Service,
    split: str,
    kube: KubeApi,
    stable: Mapping[str, Any] | None,
    candidate: Mapping[str, Any] | None,
) -> bool:
    if split == "gateway":
        return route_settled(kube.get(ROUTE_API, "HTTPRoute", service.namespace, service.name))
    routing = service.routing
    stable_count = routing.stable_replicas if routing.stable_replicas is not None else None
    return rolled_out(stable, stable_count) and rolled_out(candidate, routing.candidate_replicas)


def _agreement(
    service: Service, spec: InferenceServiceSpec, state: RolloutStatus, pods: list[Mapping[str, Any]], now: float
) -> tuple[Any, RolloutStatus]:
    """The check, once both tracks have a ready pod; a pod that does not answer is retried until the startup budget
    is spent, then the candidate is rolled back: one that cannot be compared never gets traffic."""
    stable_url, candidate_url = ready_pod_url(pods, "stable"), ready_pod_url(pods, "candidate")
    trouble = None
    if stable_url is None or candidate_url is None:
        trouble = "no ready pod of " + ("the stable revision" if stable_url is None else "the candidate") + " yet"
    else:
        try:
            return compare_revisions(stable_url, candidate_url, service.spec, spec), state
        except AgreementError as error:
            trouble = str(error)
    since = seconds_of(state.changed_at) or now
    if now - since > spec.timeouts.startup_seconds:
        message = f"the agreement check could not run for {spec.timeouts.startup_seconds} s: {trouble}"
        return None, roll_back(state, now, "AgreementUnavailable", message)
    return None, state.model_copy(update={"reason": "AgreementPending", "message": f"agreement check waits: {trouble}"})


Reader = Callable[[Track, float], TrackFigures]  # one track's figures over the last seconds


def figures_reader(
    service: Service,
    spec: InferenceServiceSpec,
    prometheus_url: str | None,
    through_gateway: bool,
    ablated: frozenset[str] = frozenset(),
) -> Reader | None:
    """What an analysis reads from Prometheus: Triton's figures, and the gateway's for the clusters of the route as
    the operator writes it now (the traffic of the step analysed). None without a Prometheus."""
    if not prometheus_url:
        return None
    clusters = None
    if through_gateway:
        tracks: dict[str, Track] = {service.name: "stable", candidate_name(service): "candidate"}
        clusters = route_clusters(build_http_route(service, ROUTE_API), service.namespace, tracks)
    # behind a pipeline, the ensemble counts the images its decoding refuses as failures: its members' are counted
    members = spec.pipeline is not None and "member-failures" not in ablated
    failing = list(pipeline_members(spec.model.name).values()) if members else []
    return prometheus_reader(prometheus_url, service.namespace, service.name, spec.model.name, clusters, failing)


def analyse(
    state: RolloutStatus,
    spec: InferenceServiceSpec,
    read: Reader | None,
    now: float,
    through_gateway: bool = False,
    ablated: frozenset[str] = frozenset(),
) -> AnalysisStatus:
    """The analysis due at `now`: both tracks' figures over the window `analysis_window` gives (the last interval of
    the step), judged. `read` asks Prometheus (None: none is configured); one it cannot ask is Unreachable."""
    assert spec.rollout is not None
    since, window = analysis_window(state, spec.rollout, now, ablated)
    step = state.step or 0

    def unreachable(message: str) -> AnalysisStatus:
        return AnalysisStatus(
            verdict="Unreachable", message=message, step=step, weight=state.weight, at=timestamp(now),
            since=timestamp(since), window_seconds=round(window, 1),
        )  # fmt: skip

    if read is None:
        return unreachable(
            "no Prometheus is configured (the operator's INFEROP_PROMETHEUS_URL, the chart's rollout.prometheusUrl): "
            "the rollout cannot be judged"
        )
    try:
        candidate, stable = read("candidate", window), read("stable", window)
    except PrometheusUnreachable as error:
        return unreachable(str(error))
    return judge(candidate, stable, spec.rollout, step, state.weight, window, now, through_gateway, ablated)
