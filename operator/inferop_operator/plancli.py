"""`inferop plan -f isvc.yaml`: what the operator decides for an InferenceService, without a cluster.

The same functions as the operator's reconcile (parse_spec, plan_service, and the status it writes), so the threads,
the queue bound, the memory fit, the warnings and a refusal with its fixes read as `kubectl get infsvc -o yaml` would
show them. What needs the cluster (the Gateway a rollout routes through, pods) is not checked. Exit codes for a CI
pipeline: 0 every object accepted, 1 one refused, 2 one invalid (or a file that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferop_core.errors import InferopError
from inferop_core.quantity import parse_quantity
from inferop_operator.agreement import design
from inferop_operator.identity import GROUP, KIND
from inferop_operator.plan import Plan, Refusal, check_routing, plan_service
from inferop_operator.settings import read_settings
from inferop_operator.spec import InferenceServiceSpec, SpecError, parse_spec
from inferop_operator.status import Status, invalid_status, plan_conditions, plan_figures, refused_status

# The outcomes, most severe last: the command exits with the most severe one's code.
EXIT_CODES = {"accepted": 0, "refused": 1, "invalid": 2}


class ManifestError(InferopError):
    """A file `inferop plan` cannot read as InferenceServices."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", action="append", required=True, type=Path, metavar="FILE",
        help="a manifest of one or more InferenceServices (YAML, documents split by ---); - reads stdin (repeatable)",
    )  # fmt: skip
    parser.add_argument("--cpus", help="plan with this CPU limit instead of resources.limits.cpu, e.g. 4 or 1500m")
    parser.add_argument("--memory", help="plan with this memory limit instead of resources.limits.memory, e.g. 2Gi")
    parser.add_argument("--json", action="store_true", help="one JSON object per InferenceService, in a list")


@dataclass(frozen=True)
class Verdict:
    """What the operator would decide for one object: its outcome and the status it would write."""

    source: str  # the file and, past the first, the document's index
    name: str
    outcome: str  # accepted, refused or invalid
    status: Status
    plan: Plan | None = None  # None unless accepted
    spec: InferenceServiceSpec | None = None

    def written(self) -> dict[str, Any]:
        return self.status.model_dump(by_alias=True, exclude_none=True, mode="json")


def run(args: argparse.Namespace) -> int:
    overrides = limit_overrides(args.cpus, args.memory)
    verdicts = [decide(source, document, overrides) for source, document in documents(args.filename)]
    if not verdicts:
        raise ManifestError(f"no InferenceService in {', '.join(map(str, args.filename))}")
    if args.json:
        print(json.dumps([as_json(v) for v in verdicts], indent=2))
    else:
        print("\n\n".join(as_text(v) for v in verdicts))
    return max(EXIT_CODES[v.outcome] for v in verdicts)


def limit_overrides(cpus: str | None, memory: str | None) -> dict[str, str]:
    """--cpus and --memory as resources.limits entries, each checked as a quantity (naming the option)."""
    overrides = {}
    for option, key, value in (("--cpus", "cpu", cpus), ("--memory", "memory", memory)):
        if value is not None:
            try:
                if parse_quantity(value, option) <= 0:
                    raise ValueError
            except (InferopError, ValueError):
                raise ManifestError(f"{option} {value!r}: not a positive Kubernetes quantity") from None
            overrides[key] = value
    return overrides


def documents(files: list[Path]) -> Iterator[tuple[str, Any]]:
    for path in files:
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text()
            loaded = [d for d in yaml.safe_load_all(text) if d is not None]
        except (OSError, yaml.YAMLError) as error:
            raise ManifestError(f"{path}: {error}") from None
        for index, document in enumerate(loaded):
            items = document.get("items") if isinstance(document, dict) and document.get("kind") == "List" else None
            for item in items if isinstance(items, list) else [document]:
                yield (f"{path}" if len(loaded) == 1 and items is None else f"{path}#{index + 1}"), item


def decide(source: str, document: Any, overrides: dict[str, str]) -> Verdict:
    """Validate and plan one object as the operator's reconcile does, with the limits overridden."""
    if not isinstance(document, dict) or document.get("kind") != KIND:
        kind = document.get("kind") if isinstance(document, dict) else type(document).__name__
        return invalid(source, "?", f"kind: {kind!r} is not an {KIND} ({GROUP})")
    name = str((document.get("metadata") or {}).get("name") or "?")
    raw = document.get("spec")
    if overrides and isinstance(raw, dict):
        raw = with_limits(raw, overrides)
    try:
        spec = parse_spec(raw)
    except SpecError as error:
        return invalid(source, name, str(error))
    settings = read_settings()
    try:
        plan = plan_service(spec, settings.runtime_costs())
        # Offline a named gateway is taken as served: only a rollout that names none is refused here.
        gateway = spec.gateway or settings.gateway()
        check_routing(spec, gateway, served=gateway is not None)
    except Refusal as refusal:
        status = refused_status(refusal.condition, refusal.reason, refusal.message, None, Status())
        return Verdict(source, name, "refused", strip_times(status), spec=spec)
    status = plan_figures(plan).model_copy(update={"conditions": plan_conditions(plan)})
    return Verdict(source, name, "accepted", strip_times(status), plan, spec)


def invalid(source: str, name: str, message: str) -> Verdict:
    return Verdict(source, name, "invalid", strip_times(invalid_status(message, None, Status())))


def with_limits(raw: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    """The spec with resources.limits replaced by the overrides; a request of the same resource follows it, as a
    request above its limit would be refused."""
    resources = dict(raw.get("resources") or {})
    limits = dict(resources.get("limits") or {}) | overrides
    requests = dict(resources.get("requests") or {})
    requests |= {key: value for key, value in overrides.items() if key in requests}
    resources |= {"limits": limits} | ({"requests": requests} if requests else {})
    return raw | {"resources": resources}


def strip_times(status: Status) -> Status:
    """Without lastTransitionTime: offline there is no transition to date."""
    return status.model_copy(
        update={"conditions": [c.model_copy(update={"last_transition_time": None}) for c in status.conditions]}
    )


def as_json(verdict: Verdict) -> dict[str, Any]:
    found: dict[str, Any] = {
        "source": verdict.source,
        "name": verdict.name,
        "outcome": verdict.outcome,
        "status": verdict.written(),
    }
    if verdict.plan is not None and verdict.spec is not None:
        found["arithmetic"] = arithmetic(verdict.plan, verdict.spec)
    if verdict.spec is not None and verdict.spec.rollout is not None:
        found["agreement"] = agreement_figures(verdict.spec)
    return found


def agreement_figures(spec: InferenceServiceSpec) -> dict[str, Any]:
    """What a rollout's agreement check will do: the judged outputs, the test's exact error rates, the inputs it
    needs and where they come from."""
    planned = design(spec)
    test = planned.test.test
    return {
        "top1": {name: {"nearTieEpsilon": planned.epsilon[name]} for name in planned.gate.top1},
        "withinTolerance": dict(planned.gate.max_abs_diff),
        "minAgreement": test.threshold,
        "tolerance": test.tolerance,
        "falseRefusal": round(planned.test.false_refusal, 5),
        "falseAcceptance": round(planned.test.false_acceptance, 5),
        "identicalModelSamples": test.fewest_samples,
        "maxSamples": test.max_samples,
        "inputs": planned.inputs,
        "explanation": planned.describe(),
    }


def arithmetic(plan: Plan, spec: InferenceServiceSpec) -> dict[str, Any]:
    """How each figure was derived: the sentences the conditions use, and the memory estimate's terms."""
    estimate = plan.memory.estimate
    return {
        "threads": plan.threads.explain(),
        **({"pipeline": pipeline_line(plan)} if plan.stages is not None else {}),
        "queue": plan.queue.explain(spec.timeouts.request_seconds),
        "memory": {
            "runtimeBytes": estimate.baseline,
            "instancesBytes": estimate.instances,
            "weightsBytes": estimate.weights,
            "activationsBytes": estimate.activations,
            "inFlightBytes": estimate.in_flight,
            "requiredBytes": estimate.total,
            "availableBytes": plan.memory.available_bytes,
            "against": plan.memory.against,
            "explanation": plan.memory.explain(),
        },
    }


def as_text(verdict: Verdict) -> str:
    lines = [f"{verdict.name} ({verdict.source}): {verdict.outcome}"]
    for found in verdict.status.conditions:
        if found.type == "Ready":
            continue
        lines.append(f"  {found.type:<13} {found.status:<7} {found.reason}: {found.message}")
    if verdict.plan is not None and verdict.spec is not None:
        plan = verdict.plan
        if plan.stages is not None:
            lines.append(f"  pipeline      {pipeline_line(plan)}")
        lines.append(f"  queue         {plan.queue.explain(verdict.spec.timeouts.request_seconds)}")
        lines.extend(f"  warning       {warning}" for warning in plan.warnings)
    if verdict.spec is not None and verdict.spec.rollout is not None:
        lines.append(f"  agreement     {design(verdict.spec).describe()}")
        lines.append("  not checked   the Gateway the rollout routes through (needs the cluster)")
    return "\n".join(lines)


def pipeline_line(plan: Plan) -> str:
    """The pipeline's members in the order callers' images go through them, with the stages' CPUs."""
    assert plan.pipeline is not None and plan.stages is not None
    members, pipeline = plan.pipeline.members, plan.pipeline
    chain = (
        f"{pipeline.name}: {members['pre']} x{pipeline.pre_instances} -> {members['model']} x{pipeline.model.instances}"
        f" -> {members['post']} x{pipeline.post_instances}"
    )
    return f"{chain}; {plan.stages.explain()}"
