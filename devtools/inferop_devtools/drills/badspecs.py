"""Drill: hundreds of malformed InferenceServices, applied while valid ones converge.

Every malformed spec must be refused where it is first seen: by the apiserver's schema (422, naming the field)
or by the operator (`Valid=False` with a message naming the field), and none may crash the operator, leave a
traceback in its log, or slow the valid services down.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferop_devtools.drills.harness import (
    DrillCluster,
    converged,
    example_spec,
    operator_running,
    service,
    watch_until,
)
from inferop_operator.identity import GROUP, PLURAL, VERSION

DELETED = object()  # a mutation's value that removes the field


@dataclass(frozen=True)
class BadSpec:
    """One malformed InferenceService: what is wrong with it, and the field a good message names."""

    category: str
    field: str  # dotted path; its last part must appear in the message that refuses it
    name: str  # metadata.name
    spec: dict[str, Any]

    @property
    def leaf(self) -> str:
        return self.field.rsplit(".", 1)[-1]


def _set(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `spec` with `path` (dots; list indices as numbers) set to `value`, or removed for DELETED."""
    changed = copy.deepcopy(spec)
    target: Any = changed
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    last = parts[-1]
    if value is DELETED:
        del target[int(last) if isinstance(target, list) else last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return changed


INTEGER_FIELDS = [
    "instances", "replicas", "batching.maxBatchSize", "batching.maxQueueDelayMicroseconds", "batching.maxQueueSize",
    "timeouts.startupSeconds", "threads.intraOp", "threads.interOp", "model.profile.parameters",
    "model.profile.macsPerSample", "model.profile.weightBytes", "model.profile.activationBytesPerSample",
]  # fmt: skip
WRONG_TYPES: list[Any] = ["eight", [1], {"n": 1}, True, 3.5, ""]
# Below each field's minimum, or above its maximum.
OUT_OF_RANGE: dict[str, list[Any]] = {
    "instances": [0, -1, 257, 10**12],
    "replicas": [-1, 1001],
    "batching.maxBatchSize": [-1, 4097],
    "batching.maxQueueDelayMicroseconds": [-5, 10_000_001],
    "batching.maxQueueSize": [0, -3, 1_000_001],
    "timeouts.requestSeconds": [0, -1.5, 3601],
    "timeouts.startupSeconds": [4, 7201],
    "threads.intraOp": [0, 257],
    "threads.interOp": [0, -2],
    "model.profile.weightBytes": [-1],
    "model.profile.samplesPerCpuSecond": [0, -10.0],
    "model.profile.ioBytesPerSample": [-1],
}
QUANTITY_FIELDS = [
    "resources.limits.cpu",
    "resources.limits.memory",
    "resources.requests.cpu",
    "runtime.memoryOverhead",
]
BAD_QUANTITIES = ["1.5.3", "-1", "1e400", "Gi", "", "2Gb", "lots", "0x10", "1 Gi", "-2Gi"]
BAD_URIS = [
    "s3://Bucket/model", "s3://ab/m", "s3://models/../m", "http://models.example/m", "gs://b/m", "ftp://x/y",
    "file:///models/m", "pvc://", "models/m",
    "pvc://my claim/path", "pvc://Claim_Name/x", "hostpath://relative/path", "pvc://claim\x00/x",
    "pvc://" + "a" * 5000, "", "oci://", "hostpath://",
]  # fmt: skip
TENSOR_CASES: list[tuple[str, str, Any]] = [
    ("no dims", "model.inputs.0.dims", []),
    ("dim of 0", "model.inputs.0.dims", [1, 0, 7]),
    ("dim of 0", "model.outputs.0.dims", [0]),
    ("negative dim", "model.inputs.0.dims", [1, -8, 7]),
    ("dynamic input dim", "model.inputs.0.dims", [1, -1, 7]),
    ("no inputs", "model.inputs", []),
    ("no outputs", "model.outputs", []),
    ("unknown datatype", "model.inputs.0.datatype", "FP8"),
    ("unknown datatype", "model.outputs.1.datatype", "STRING"),
    ("empty tensor name", "model.inputs.0.name", ""),
    ("tensor name with a space", "model.outputs.0.name", "move probabilities"),
    ("tensor name starting with a digit", "model.inputs.0.name", "0board"),
]
UNICODE = ["modèle", "模型", "🤖", "naïve_net", "Ωmega", "model\u200b", "\uff4d\uff4f\uff44\uff45\uff4c"]


def generate(count: int = 320, seed: int = 0) -> list[BadSpec]:
    """At least `count` malformed specs, the same for the same seed: every category, then seeded variations."""
    rng = random.Random(seed)
    base = example_spec()
    cases: list[tuple[str, str, Callable[[], dict[str, Any]], str | None]] = []  # category, field, spec, name

    def add(
        category: str,
        path: str,
        value: Any,
        spec: dict[str, Any] | None = None,
        name: str | None = None,
        field: str | None = None,
    ) -> None:
        """A case that sets `path` to `value` (in `spec`, else the example); `field` is what a message must name
        (default: `path`)."""
        start = spec if spec is not None else base
        cases.append((category, field or path, lambda: _set(start, path, value), name))

    for field in INTEGER_FIELDS:
        for value in WRONG_TYPES:
            add("wrong type", field, value)
    for field in ("timeouts.requestSeconds", "model.profile.samplesPerCpuSecond"):
        for value in ["ten", [2], True]:
            add("wrong type", field, value)
    for field, value in [
        ("threads.allowOversubscription", "yes"), ("threads.allowOversubscription", 1), ("model.name", 42),
        ("model.storageUri", 7), ("model.inputs", {"name": "board"}), ("model.inputs.0.dims", "1,8,7"),
        ("model.weights", ["random"]), ("runtime.cpuScheduling", "fifo"), ("runtime.cpuScheduling", 0),
        ("resources.limits", ["cpu", 2]), ("autoscaling", "on"), ("gpu.memory", True),
        ("model.processing.kind", "audio"),
    ]:  # fmt: skip
        add("wrong type", field, value)
    for field, values in OUT_OF_RANGE.items():
        for value in values:
            add("out of range", field, value)
    for field in QUANTITY_FIELDS:
        for value in BAD_QUANTITIES:
            add("bad quantity", field, value)
    for uri in BAD_URIS:
        add("bad storage URI", "model.storageUri", uri)
    for category, field, value in TENSOR_CASES:
        add(f"tensor: {category}", field, value)
    duplicate = _set(base, "model.inputs", [*base["model"]["inputs"], copy.deepcopy(base["model"]["inputs"][0])])
    cases.append(("tensor: duplicate names", "model", lambda: duplicate, None))
    clash = _set(base, "model.outputs.0.name", base["model"]["inputs"][0]["name"])
    cases.append(("tensor: duplicate names", "model", lambda: clash, None))
    for low, high in [(5, 2), (2, 1), (10, 9), (100, 3)]:
        scaling = {"minReplicas": low, "maxReplicas": high, "metric": "cpu", "target": 80}
        add("autoscaling min above max", "autoscaling", scaling, field="autoscaling.maxReplicas")
    for field, value in [
        ("metric", {"maxReplicas": 3, "metric": "gpu", "target": 50}),
        ("maxReplicas", {"maxReplicas": 0, "target": 50}),
        ("target", {"maxReplicas": 3, "target": 0}),
    ]:
        add("autoscaling", "autoscaling", value, field=f"autoscaling.{field}")
    add("long name", "model.name", "m" * 254)
    add("long name", "model.weights", "w" * 300)
    add("long name", "metadata.name", None, name="s" * 254)
    add("long name", "metadata.name", None, name="s" * 64 + "-" + "t" * 189)
    for text in UNICODE:
        add("unicode", "model.name", text)
        add("unicode", "model.inputs.0.name", text)
        add("unicode", "metadata.name", None, name=f"svc-{text}")
    for image in ["\x00", "Triton Server", "nvcr.io/nvidia/tritonserver:", "nvcr.io/NVIDIA/tritonserver", "ü/x"]:
        add("bad image", "runtime.image", image)
    # Sections that are required: empty or null. (A null optional section is pruned by the apiserver and means
    # "defaults", which is valid: it is not among these.)
    cases.append(("empty or null section", "spec.model", lambda: {}, None))
    for field, value in [("model", None), ("model", {}), ("model.profile", {}), ("model.profile", None),
                         ("model.inputs", None), ("model.outputs", None),
                         ("autoscaling", {}), ("gpu", {})]:  # fmt: skip
        add("empty or null section", field, value)
    add("empty or null section", "model.inputs.0", {}, field="model.inputs.0.name")
    for field in [
        "model.name", "model.storageUri", "model.profile", "model.inputs", "model.outputs", "model.profile.parameters",
        "model.profile.macsPerSample", "model.profile.weightBytes", "model.profile.activationBytesPerSample",
        "model.inputs.0.name", "model.inputs.0.dims", "model.outputs.0.dims", "model",
    ]:  # fmt: skip
        add("field deleted", field, DELETED)
    with_scaling = _set(base, "autoscaling", {"maxReplicas": 3, "metric": "cpu", "target": 50})
    for field in ["autoscaling.maxReplicas", "autoscaling.target"]:
        add("field deleted", field, DELETED, spec=with_scaling)
    add("field deleted", "gpu.memory", DELETED, spec=_set(base, "gpu", {"memory": "16Gi"}))

    # Seeded variations until `count`: a random integer field out of range or of a wrong type.
    while len(cases) < count:
        field = rng.choice(INTEGER_FIELDS)
        value = rng.choice([rng.randint(-(10**9), -1), rng.random() * 10 - 20, rng.choice(WRONG_TYPES)])
        add("seeded variation", field, value)

    specs = []
    for index, (category, field, build, name) in enumerate(cases):
        spec = build() if field != "metadata.name" else copy.deepcopy(base)
        specs.append(BadSpec(category, field, name or f"bad-{index:03d}", spec))
    return specs


@dataclass
class Outcome:
    case: BadSpec
    where: str  # "apiserver", "operator", or "accepted" (a failure of the drill)
    message: str

    @property
    def names_field(self) -> bool:
        return self.case.leaf in self.message or (self.case.field == "model" and "tensor names" in self.message)


def apply_bad(cluster: DrillCluster, namespace: str, case: BadSpec) -> Outcome | None:
    """Create it; the apiserver's refusal is the outcome, else None (the operator must refuse it)."""
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, service(case.name, case.spec))
    except ApiException as error:
        return Outcome(case, "apiserver", f"{error.status} {error.body}")
    except ValueError as error:  # the client refuses it before sending (a name no URL can carry)
        return Outcome(case, "client", str(error))
    return None


def invalid_condition(item: dict[str, Any]) -> dict[str, Any] | None:
    status = item.get("status") or {}
    if status.get("observedGeneration") != item["metadata"]["generation"]:
        return None
    return next((c for c in status.get("conditions", []) if c["type"] == "Valid" and c["status"] == "False"), None)


def converge_valid(cluster: DrillCluster, namespace: str, count: int, timeout: float = 120) -> float:
    """Create `count` valid services at once; seconds until every one has converged."""
    start = time.perf_counter()
    for index in range(count):
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, service(f"valid-{index}"))
    watch_until(
        f"{count} valid services",
        timeout,
        count,
        converged,
        cluster.custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
    )
    return time.perf_counter() - start


def run_bad_specs(
    root: Path, count: int = 320, valid: int = 20, seed: int = 0, cases: list[BadSpec] | None = None
) -> dict[str, Any]:
    """Apply `cases` (default: `generate(count, seed)`) while `valid` services converge, after `valid` others
    converged alone; what refused each case, whether its message names the field, and the operator's health."""
    cases = cases if cases is not None else generate(count, seed)
    with DrillCluster(root) as cluster, operator_running(cluster, root / "operator.log") as operator:
        cluster.create_namespaces(["quiet", "noisy", "valid"])
        quiet_seconds = converge_valid(cluster, "quiet", valid)

        outcomes: list[Outcome] = []
        pending: list[BadSpec] = []

        def noise() -> None:
            for case in cases:
                outcome = apply_bad(cluster, "noisy", case)
                if outcome is None:
                    pending.append(case)
                else:
                    outcomes.append(outcome)

        thread = threading.Thread(target=noise)
        thread.start()
        noisy_seconds = converge_valid(cluster, "valid", valid)
        thread.join()

        reported: dict[str, dict[str, Any]] = {}
        watch_until(
            f"{len(pending)} accepted malformed services to be reported invalid",
            120,
            len(pending),
            lambda item: invalid_condition(item) is not None,
            cluster.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "noisy",
            PLURAL,
            on_ready=lambda item: reported.__setitem__(item["metadata"]["name"], invalid_condition(item) or {}),
        ) if pending else None
        for case in pending:
            condition = reported.get(case.name)
            outcomes.append(
                Outcome(case, "operator" if condition else "accepted", (condition or {}).get("message", ""))
            )
        alive = operator.running()
        tracebacks = operator.tracebacks()

    by_category: dict[str, dict[str, int]] = {}
    for outcome in outcomes:
        row = by_category.setdefault(outcome.case.category, {"cases": 0, "apiserver": 0, "operator": 0, "named": 0})
        row["cases"] += 1
        row[outcome.where if outcome.where in ("apiserver", "operator") else "apiserver"] += outcome.where != "accepted"
        row["named"] += outcome.names_field
    refused = [o for o in outcomes if o.where != "accepted"]
    unnamed = [o for o in refused if not o.names_field]
    return {
        "cases": len(outcomes),
        "refused": len(refused),
        "refused_by_apiserver": sum(o.where in ("apiserver", "client") for o in outcomes),
        "refused_by_operator": sum(o.where == "operator" for o in outcomes),
        "named_field": len(refused) - len(unnamed),
        "accepted": [
            {"name": o.case.name, "category": o.case.category, "field": o.case.field}
            for o in outcomes
            if o.where == "accepted"
        ],
        "unnamed": [
            {"category": o.case.category, "field": o.case.field, "where": o.where, "message": o.message[:300]}
            for o in unnamed
        ],
        "by_category": by_category,
        "operator_alive": alive,
        "operator_exits": operator.unexpected_exits,
        "tracebacks": tracebacks,
        "valid_services": valid,
        "valid_converge_quiet_s": round(quiet_seconds, 2),
        "valid_converge_noisy_s": round(noisy_seconds, 2),
        "noise_slowdown": round(noisy_seconds / quiet_seconds, 2),
    }


def met(ok: bool) -> str:
    return "yes" if ok else "no"


def format_bad_specs(result: dict[str, Any]) -> str:
    share = result["refused"] / result["cases"]
    named = result["named_field"] / max(result["refused"], 1)
    lines = [
        "### 1. Bad specs",
        "",
        f"{result['cases']} malformed InferenceServices (seeded), applied while {result['valid_services']} valid ones "
        "converged.",
        "",
        "| goal | measured | met |",
        "|---|---|---|",
        f"| 100% refused (apiserver schema or `Valid=False`) | {share:.1%} ({result['refused_by_apiserver']} by the "
        f"apiserver, {result['refused_by_operator']} by the operator) | {'yes' if share == 1 else 'no'} |",
        f"| the message names the field | {named:.1%} | {'yes' if named == 1 else 'no'} |",
        f"| 0 operator crashes | {'running' if result['operator_alive'] else 'exited'}, exits "
        f"{result['operator_exits'] or 'none'} | {met(result['operator_alive'] and not result['operator_exits'])} |",
        f"| 0 tracebacks in its log | {len(result['tracebacks'])} | {'yes' if not result['tracebacks'] else 'no'} |",
        f"| valid services as fast as without the noise | {result['valid_converge_noisy_s']} s against "
        f"{result['valid_converge_quiet_s']} s: ratio {result['noise_slowdown']} | "
        f"{'yes' if result['noise_slowdown'] <= 1.5 else 'no'} (1.5 allowed for the CPUs the noise itself takes) |",
        "",
        "| category | cases | apiserver | operator | field named |",
        "|---|---|---|---|---|",
    ]
    for category, row in sorted(result["by_category"].items()):
        lines.append(f"| {category} | {row['cases']} | {row['apiserver']} | {row['operator']} | {row['named']} |")
    for item in result["accepted"]:
        lines.append(f"- accepted: {item}")
    for item in result["unnamed"][:10]:
        lines.append(f"- field not named: {item}")
    for item in result["tracebacks"][:10]:
        lines.append(f"- traceback: {item}")
    return "\n".join(lines)
