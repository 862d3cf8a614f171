"""Drill: the operator SIGKILLed at random moments while services are created, edited and deleted.

After the last restart every service must converge to its latest spec: children that render that spec, one of
each, none left behind by a deleted service, a status about the current generation, and a bounded number of
Events per service.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from inferop_devtools.drills.harness import (
    DrillCluster,
    OperatorProcess,
    converged,
    example_spec,
    service,
    wait_until,
    watch_until,
)
from inferop_operator.identity import GROUP, MANAGED, PLURAL, VERSION, label_selector

NAMESPACE = "kills"


def edited(spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The spec with one setting a user would change: batch size, queue delay, replicas or autoscaling."""
    changed = copy.deepcopy(spec)
    choice = rng.choice(["batch", "delay", "replicas", "autoscaling"])
    if choice == "batch":
        changed["batching"]["maxBatchSize"] = rng.choice([4, 8, 16, 32])
    elif choice == "delay":
        changed["batching"]["maxQueueDelayMicroseconds"] = rng.randint(100, 5000)
    elif choice == "replicas":
        changed["replicas"] = rng.choice([1, 2, 3])
    elif "autoscaling" in changed:
        del changed["autoscaling"]
    else:
        changed["autoscaling"] = {"minReplicas": 1, "maxReplicas": rng.choice([2, 4]), "metric": "cpu", "target": 70}
    return changed


def expected_config(name: str, uid: str, spec: dict[str, Any]) -> str:
    """The config.pbtxt the operator renders for `spec`: what the ConfigMap must hold once converged."""
    from inferop_operator.builders import CONFIG_KEY, Service
    from inferop_operator.plan import plan_service
    from inferop_operator.spec import parse_spec

    parsed = parse_spec(spec)
    return Service(name, NAMESPACE, uid, parsed, plan_service(parsed), "unused").config_files[CONFIG_KEY]


# Where each kind of child is listed on the apiserver the drills run (Kubernetes 1.20).
CHILD_PATHS = {
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "Deployment": "/apis/apps/v1/namespaces/{namespace}/deployments",
    "HorizontalPodAutoscaler": "/apis/autoscaling/v1/namespaces/{namespace}/horizontalpodautoscalers",
    "PodDisruptionBudget": "/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets",
}


REQUIRED_CHILDREN = {"ConfigMap", "Service", "Deployment"}


def children_by_owner(cluster: DrillCluster) -> dict[str, Counter[str]]:
    """Counts of each kind of child, by the uid of the service that owns it (a missing owner: an orphan)."""
    owners: dict[str, Counter[str]] = {}
    for kind, path in CHILD_PATHS.items():
        for item in cluster.list_json(
            path.format(namespace=NAMESPACE) + f"?labelSelector={quote(label_selector(MANAGED))}"
        ):
            for owner in item["metadata"].get("ownerReferences", []):
                owners.setdefault(owner["uid"], Counter())[kind] += 1
    return owners


def run_operator_kills(
    root: Path, services: int = 100, kills: int = 20, changes: int = 200, seed: int = 0, resync: float = 10
) -> dict[str, Any]:
    rng = random.Random(seed)
    base = example_spec()
    names = [f"svc-{index:03d}" for index in range(services)]
    operations: list[tuple[str, str]] = [("create", name) for name in names]
    for _ in range(changes):
        operations.append((rng.choices(["edit", "delete"], weights=[85, 15])[0], rng.choice(names)))
    kill_at = set(rng.sample(range(len(operations)), kills))

    with DrillCluster(root) as cluster:
        cluster.create_namespaces([NAMESPACE])
        operator = OperatorProcess(cluster, root / "operator.log", resync)
        operator.start()
        latest: dict[str, dict[str, Any] | None] = {}
        spec_changes: Counter[str] = Counter()
        custom = cluster.custom
        for index, (action, name) in enumerate(operations):
            if index in kill_at:
                operator.kill()
                time.sleep(rng.uniform(0.0, 1.0))  # a pod restart takes a moment; work goes on meanwhile
                operator.start()
            current = latest.get(name)
            if action == "create" or current is None:  # a deleted service is created again
                spec = base if action == "create" else edited(base, rng)
                custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, service(name, spec))
                latest[name] = spec
            elif action == "edit":
                spec = edited(current, rng)
                # A merge patch of the spec: the operator's status writes cannot make it conflict.
                patch = {"spec": {**spec, **({} if "autoscaling" in spec else {"autoscaling": None})}}
                custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name, patch)
                latest[name] = spec
            else:
                custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
                wait_until(partial(_gone, cluster, name), 30, f"{name} deleted")
                latest[name] = None
            spec_changes[name] += 1
            time.sleep(rng.uniform(0.0, 0.05))
        last_change = time.perf_counter()
        live = {name: spec for name, spec in latest.items() if spec is not None}
        watch_until(
            f"{len(live)} services to converge",
            180,
            len(live),
            converged,
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            NAMESPACE,
            PLURAL,
        )
        converge_seconds = time.perf_counter() - last_change

        items = {s["metadata"]["name"]: s for s in cluster.services(NAMESPACE)}
        live_uids = {items[name]["metadata"]["uid"] for name in live}
        # Children of deleted services go with the garbage collector; wait for it before counting orphans.
        wait_until(lambda: set(children_by_owner(cluster)) <= live_uids, 60, "the garbage collector to remove orphans")
        # A service deleted and created again under its name adopts the children the collector has not removed yet,
        # and the collector may still delete one it judged orphaned a moment before: the next resync restores it,
        # after the status has converged. Convergence also waits for every child, for up to two resyncs.
        uids = {name: items[name]["metadata"]["uid"] for name in live}
        lacking = sorted(name for name, kinds in _kinds(cluster, uids).items() if not kinds >= REQUIRED_CHILDREN)
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: all(kinds >= REQUIRED_CHILDREN for kinds in _kinds(cluster, uids).values()),
                2 * resync + 5,
                "every live service's children",
                interval=0.5,
            )
        children_seconds = time.perf_counter() - last_change
        owners = children_by_owner(cluster)
        stale_status, wrong_config, duplicates, missing = [], [], [], []
        for name, spec in live.items():
            item = items[name]
            uid = item["metadata"]["uid"]
            if (item.get("status") or {}).get("observedGeneration") != item["metadata"]["generation"]:
                stale_status.append(name)
            config_map = cluster.core.read_namespaced_config_map(f"{name}-config", NAMESPACE)
            if config_map.data["config.pbtxt"] != expected_config(name, uid, spec):
                wrong_config.append(name)
            kinds = owners.get(uid, Counter())
            if any(count > 1 for count in kinds.values()):
                duplicates.append(name)
            if not set(kinds) >= REQUIRED_CHILDREN:
                missing.append(name)
        orphans = sorted(set(owners) - live_uids)

        events = cluster.core.list_namespaced_event(NAMESPACE).items
        per_service: Counter[str] = Counter()
        for event in events:
            if event.involved_object.kind == "InferenceService":
                per_service[event.involved_object.name] += event.count or 1
        # Each change may post a Reconciled event and at most one Warning, and each operator start may post one
        # per service it resumes: the bound a service's Events must stay within.
        bounds = {name: 2 * spec_changes[name] + operator.starts for name in per_service}
        over = {name: per_service[name] for name in per_service if per_service[name] > bounds[name]}
        alive, tracebacks = operator.running(), operator.tracebacks()
        operator.stop()

    return {
        "services": services,
        "operations": len(operations),
        "kills": kills,
        "operator_starts": operator.starts,
        "live_services": len(live),
        "converge_after_last_change_s": round(converge_seconds, 2),
        "children_after_last_change_s": round(children_seconds, 2),
        "children_restored_after_status": lacking,
        "stale_status": stale_status,
        "wrong_config": wrong_config,
        "duplicate_children": duplicates,
        "missing_children": missing,
        "orphaned_owners": orphans,
        "events_max_per_service": max(per_service.values(), default=0),
        "events_mean_per_service": round(sum(per_service.values()) / max(len(per_service), 1), 1),
        "events_bound": "2 x the service's spec changes + operator starts",
        "events_over_bound": over,
        "operator_alive": alive,
        "operator_exits": operator.unexpected_exits,
        "tracebacks": tracebacks,
    }


def _kinds(cluster: DrillCluster, uids: dict[str, str]) -> dict[str, set[str]]:
    """The kinds of child each service (by name, from its uid) owns now."""
    owners = children_by_owner(cluster)
    return {name: set(owners.get(uid, ())) for name, uid in uids.items()}


def _gone(cluster: DrillCluster, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    except ApiException as error:
        return error.status == 404
    return False


def format_operator_kills(result: dict[str, Any]) -> str:
    def met(ok: bool) -> str:
        return "yes" if ok else "no"

    problems = {k: result[k] for k in ("stale_status", "wrong_config", "duplicate_children", "missing_children")}
    return "\n".join(
        [
            "### 2. Operator killed",
            "",
            f"{result['kills']} SIGKILLs at random moments during {result['operations']} operations (creates, edits, "
            f"deletes) on {result['services']} services; restarted each time ({result['operator_starts']} starts).",
            "",
            "| goal | measured | met |",
            "|---|---|---|",
            f"| every service converges to its latest spec | {result['live_services']} live services converged "
            f"{result['converge_after_last_change_s']} s after the last change; config differing from the latest spec: "
            f"{len(result['wrong_config'])} | {met(not result['wrong_config'])} |",
            f"| no duplicate or missing children | duplicates {len(result['duplicate_children'])}, missing "
            f"{len(result['missing_children'])} | "
            f"{met(not result['duplicate_children'] and not result['missing_children'])} |",
            f"| no orphaned children | {len(result['orphaned_owners'])} owners gone with children left | "
            f"{met(not result['orphaned_owners'])} |",
            f"| no stale status | {len(result['stale_status'])} | {met(not result['stale_status'])} |",
            f"| events per service bounded ({result['events_bound']}) | max {result['events_max_per_service']}, mean "
            f"{result['events_mean_per_service']}; over the bound: {len(result['events_over_bound'])} | "
            f"{met(not result['events_over_bound'])} |",
            f"| no traceback | {len(result['tracebacks'])} | {met(not result['tracebacks'])} |",
            *(f"- {key}: {value}" for key, value in problems.items() if value),
        ]
    )
