"""What failing pods say and what to do about it: each pod's reported facts, and the first failure found among
them with advice (an image that cannot be pulled, an OOM kill sized against the memory estimate, a crash loop with
the server's last words). Pure functions over the pods index's entries; status.py turns them into PodsHealthy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from inferop_core.objectstore import ADVICE
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_operator.identity import COMPONENT, FETCH_CONTAINER, TRITON_CONTAINER
from inferop_operator.plan import MEMORY_MARGIN, memory_limit

# The kubelet alternates these while it retries a pull: one reason for both, so the condition does not flap.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
# A container the kubelet cannot create from its spec: most often a Secret or ConfigMap it references is missing.
CONFIG_ERROR_REASONS = frozenset({"CreateContainerConfigError"})
# Where in the InferenceService each failed fetch is fixed: the fetch's advice speaks of the object store, this
# names the field.
FETCH_FIELDS = {
    "BucketNotFound": "spec.model.storageUri (spec.model.storage.endpoint for an S3-compatible server)",
    "ObjectNotFound": "spec.model.storageUri",
    "AccessDenied": "the Secret spec.model.storage.credentialsSecret names",
    "EndpointUnreachable": "spec.model.storage.endpoint",
    "DigestMismatch": "spec.model.sha256, or the object",
    "DownloadTimeout": "spec.model.storage.downloadTimeoutSeconds",
    "TooLarge": "spec.model.storage.maxSize",
    "ServerError": "the storage server (spec.model.storage.endpoint)",
    "NotAModel": "spec.model.storageUri",
}


def pod_facts(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the pods index keeps of a pod: to explain its failures, its name, each container's memory limit, and
    each container's state, last termination, restarts and readiness (init containers first); for a rollout, its
    track (component label), IP, readiness and whether it is being deleted."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    limits = {c.get("name"): ((c.get("resources") or {}).get("limits") or {}).get("memory") for c in containers}
    states = []
    for item in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state, last = item.get("state") or {}, item.get("lastState") or {}
        states.append(
            {
                "name": item.get("name"),
                "image": item.get("image"),
                "ready": bool(item.get("ready")),
                "memoryLimit": limits.get(item.get("name")),
                "waiting": state.get("waiting"),
                "terminated": state.get("terminated"),
                "lastTerminated": last.get("terminated"),
                "restarts": int(item.get("restartCount") or 0),
            }
        )
    metadata = pod.get("metadata") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    return {
        "name": metadata.get("name"),
        "component": (metadata.get("labels") or {}).get(COMPONENT),
        "ip": status.get("podIP"),
        "ready": ready.get("status") == "True",
        "terminating": bool(metadata.get("deletionTimestamp")),
        "containers": states,
    }


class Diagnosis(NamedTuple):
    """A failure the pods report: PodsHealthy's reason and a message that says what to do."""

    reason: str
    message: str


def diagnose(pods: Iterable[Mapping[str, Any]], required_bytes: int | None) -> Diagnosis | None:
    """The first failure found in the pods' reports (`pod_facts` of each), in pod name order, or None. An image that
    cannot be pulled comes first (nothing else can run), then a container the kubelet cannot create (a missing
    Secret), then a model that could not be fetched from object storage (its reason is the fetch's: Model<reason>,
    such as ModelDigestMismatch), then an OOM kill (its advice is a size, from the memory estimate `required_bytes`
    where there is one), then a crash loop (its advice is the server's last words).

    An OOM kill counts while the kubelet reports it as the container's last termination, even after the container
    restarted and became ready: the same load kills it again. A pod of a fixed spec replaces it and clears it."""
    failures: dict[str, list[tuple[str, str]]] = {"ImagePullFailed": [], "ContainerConfigError": []}
    failures |= {f"Model{reason}": [] for reason in ADVICE}
    failures |= {"ModelFetchFailed": [], "OOMKilled": [], "CrashLoopBackOff": []}
    for pod in sorted(pods, key=lambda p: str(p.get("name"))):
        for container in pod.get("containers") or []:
            where = f"container {container.get('name')} of pod {pod.get('name')}"
            waiting = container.get("waiting") or {}
            ended = container.get("terminated") or container.get("lastTerminated") or {}
            if waiting.get("reason") in IMAGE_PULL_REASONS:
                failures["ImagePullFailed"].append((where, image_advice(where, str(container.get("image")))))
            elif waiting.get("reason") in CONFIG_ERROR_REASONS:
                failures["ContainerConfigError"].append((where, config_advice(where, waiting)))
            elif container.get("name") == FETCH_CONTAINER and ended and ended.get("exitCode") != 0:
                reason, message = fetch_failure(ended)
                failures[reason].append((where, f"{where} could not fetch the model: {message}"))
            elif ended.get("reason") == "OOMKilled":
                failures["OOMKilled"].append((where, oom_advice(where, container, required_bytes)))
            elif waiting.get("reason") == "CrashLoopBackOff" or (
                # between back-offs the kubelet restarts it: still crashing until it is ready again
                ended and ended.get("exitCode") != 0 and not container.get("ready")
            ):
                failures["CrashLoopBackOff"].append((where, crash_advice(where, ended)))
    for reason, found in failures.items():
        if found:
            more = f" ({len(found) - 1} more container(s) likewise)" if len(found) > 1 else ""
            return Diagnosis(reason, found[0][1] + more)
    return None


def candidate_failure(
    pods: Iterable[Mapping[str, Any]], required_bytes: int | None, takes_traffic: bool
) -> Diagnosis | None:
    """What of a rollout's candidate pods (`pod_facts` of each, the candidate's only) fails it, whatever its metrics
    say: a container OOM-killed (reason OOMKilled), in CrashLoopBackOff, a Triton container restarted (Restarted: a
    new revision's pods have no reason to), or, while its step sends it live requests (`takes_traffic`), no Ready pod
    (Unavailable: through a gateway, Envoy answers its share 503; split by replicas, it serves nothing to judge). A
    failing pod serves no metrics, so these come from the API, not from Prometheus. None when none of these holds;
    in that order when several do.

    An init container that failed and was run again (a fetch from object storage retried) is not a restart: the pod
    served nothing yet. A pod being deleted is not looked at: it may be a previous candidate's, rolled back for what
    it reports."""
    pods = sorted((pod for pod in pods if not pod.get("terminating")), key=lambda p: str(p.get("name")))
    found: dict[str, list[str]] = {"OOMKilled": [], "CrashLoopBackOff": [], "Restarted": []}
    for pod in pods:
        for container in pod.get("containers") or []:
            where = f"container {container.get('name')} of pod {pod.get('name')}"
            waiting = container.get("waiting") or {}
            ended = container.get("terminated") or container.get("lastTerminated") or {}
            if ended.get("reason") == "OOMKilled":
                found["OOMKilled"].append(oom_advice(where, container, required_bytes))
            elif waiting.get("reason") == "CrashLoopBackOff":
                found["CrashLoopBackOff"].append(crash_advice(where, ended))
            elif container.get("name") == TRITON_CONTAINER and container.get("restarts"):
                found["Restarted"].append(restart_message(where, container, ended))
    for reason, messages in found.items():
        if messages:
            more = f" ({len(messages) - 1} more container(s) likewise)" if len(messages) > 1 else ""
            return Diagnosis(reason, messages[0] + more)
    if takes_traffic and not any(pod.get("ready") for pod in pods):
        names = ", ".join(str(pod.get("name")) for pod in pods) or "none exists"
        return Diagnosis(
            "Unavailable",
            f"no pod of the candidate is Ready ({names}) while its step sends it live requests",
        )
    return None


def restart_message(where: str, container: Mapping[str, Any], ended: Mapping[str, Any]) -> str:
    said = f"{where} restarted {container.get('restarts')} time(s)"
    if not ended:
        return f"{said}; `kubectl describe pod` shows why"
    words = str(ended.get("message") or "").strip() or "no termination message"
    return f"{said}; it last exited with code {ended.get('exitCode')} ({ended.get('reason') or 'no reason'}): {words}"


def fetch_failure(ended: Mapping[str, Any]) -> tuple[str, str]:
    """The condition reason and message of a failed fetch, from the "<reason>: <message>" it wrote as its last
    words; ModelFetchFailed with the exit code where it wrote none (killed, or the image has no `inferop fetch`)."""
    words = str(ended.get("message") or "").strip()
    reason, _, message = words.partition(": ")
    if reason in ADVICE and message:
        return f"Model{reason}", f"{message} (to change: {FETCH_FIELDS[reason]})"
    said = words or "no termination message"
    return "ModelFetchFailed", (
        f"it exited with code {ended.get('exitCode')} ({ended.get('reason') or 'no reason'}): {said}; "
        "`kubectl logs -c fetch-model` shows why"
    )


def config_advice(where: str, waiting: Mapping[str, Any]) -> str:
    said = str(waiting.get("message") or "").strip() or "no message"
    return (
        f"{where} cannot be created: {said}. A Secret or ConfigMap it references is missing: create it in the "
        "service's namespace (model.storage.credentialsSecret needs the keys AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY)"
    )


def image_advice(where: str, image: str) -> str:
    return (
        f'{where} cannot pull image "{image}": check the image name and tag (runtime.image, or oci:// in '
        "model.storageUri), that the registry is reachable from the nodes, and the pods' imagePullSecrets "
        "(a private registry needs one in the service account)"
    )


def oom_advice(where: str, container: Mapping[str, Any], required_bytes: int | None) -> str:
    raw_limit = container.get("memoryLimit")
    limit = parse_quantity(raw_limit) if raw_limit else None
    at = f"at its memory limit of {format_bytes(limit)}" if limit else "with no memory limit (the node ran out)"
    said = f"{where} was OOM-killed {at}"
    if container.get("name") != TRITON_CONTAINER:  # an init container, whose limit the operator fixes
        return f"{said}: the operator sets this init container's limit; report the model directory that needs more"
    if required_bytes is None:
        return f"{said}: raise resources.limits.memory"
    estimate = required_bytes
    fits = memory_limit(estimate)
    if limit is None or estimate >= limit:
        return (
            f"{said}; the memory model estimates {format_bytes(estimate)} with the queue full: set "
            f"resources.limits.memory to {fits} (the estimate x {MEMORY_MARGIN}, the margin that covers the worst "
            "underestimate measured, as inferop export sizes it)"
        )
    grown = memory_limit(limit)
    return (
        f"{said}, above the memory model's estimate of {format_bytes(estimate)} with the queue full: the pod "
        f"needed at least {format_bytes(limit - estimate)} ({(limit - estimate) / estimate:.0%}) more than "
        f"estimated; raise runtime.memoryOverhead by at least that (the container's baseline is an assumption until "
        f"measured) or set resources.limits.memory to {grown} (the limit x {MEMORY_MARGIN})"
    )


def crash_advice(where: str, ended: Mapping[str, Any]) -> str:
    said = f"{where} keeps crashing (CrashLoopBackOff)"
    if not ended:
        return f"{said}: `kubectl logs --previous` shows why"
    words = str(ended.get("message") or "").strip() or "no termination message"
    return (
        f"{said}; it last exited with code {ended.get('exitCode')} ({ended.get('reason') or 'no reason'}): "
        f"{words}. Fix what it says (a model that does not load, a config the image's Triton rejects) or see "
        "`kubectl logs --previous`"
    )
