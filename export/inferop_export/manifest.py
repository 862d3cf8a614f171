"""`inferop export … --manifest FILE`: a ready-to-apply InferenceService with the profile filled in.

The manifest is the exported spec model itself, dumped by alias, with the pod's resources set from the
operator's own plan of it: the CPUs its threads use and a memory limit from the peak estimate. It is parsed
and planned again before it is written, so the operator never refuses a manifest written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inferop_core.quantity import format_bytes
from inferop_operator.identity import API_VERSION, KIND
from inferop_operator.plan import memory_limit, plan_service
from inferop_operator.spec import GPU_RESOURCE, InferenceServiceSpec, parse_spec

# The sections a manifest spells out in full; the others (runtime, autoscaling, gpu) only where set.
SPELLED_OUT = {"model", "replicas", "instances", "threads", "batching", "timeouts"}


def build_manifest(spec: InferenceServiceSpec, name: str | None = None, cpus: str | None = None) -> dict[str, Any]:
    """The InferenceService for an exported model: `spec` with its instances and threads pinned as planned for `cpus`
    (else for the CPUs it was exported with), `cpus` or else as many CPUs as those threads use, a memory limit from
    the operator's peak estimate, and the GPU the spec was exported for (its gpu.memory is then what the estimate is
    held against)."""
    if cpus is not None:  # instances and threads planned for the CPUs the manifest will ask for
        limits = {**spec.resources.limits, "cpu": cpus}
        spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"limits": limits})})
    threads = plan_service(spec).threads
    spelled_out = spec.model_dump(by_alias=True, exclude_none=True, include=SPELLED_OUT)
    spelled_out.pop("instances", None)  # as planned, derived or not: the manifest says what is served
    # Instances that take turns stay derived: set, they would all execute at once.
    instances = {} if threads.take_turns else {"instances": threads.instances}
    fields = {"model": spelled_out.pop("model"), **instances, **spelled_out}  # what is served first
    fields |= spec.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, exclude=SPELLED_OUT | {"resources"})
    fields["threads"] |= {"intraOp": threads.intra_op, "interOp": threads.inter_op}
    cpus = cpus or str(threads.threads)
    gpus = {GPU_RESOURCE: spec.resources.limits[GPU_RESOURCE]} if spec.uses_gpu else {}
    fields["resources"] = {"requests": {"cpu": cpus}, "limits": {"cpu": cpus, **gpus}}
    peak = plan_service(parse_spec(fields)).memory.required_bytes
    memory = memory_limit(peak)
    fields["resources"]["requests"]["memory"] = fields["resources"]["limits"]["memory"] = memory
    plan_service(parse_spec(fields))  # raises if the operator would refuse it
    metadata = {"name": name or spec.model.name.replace("_", "-").lower()}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": fields}


def write_manifest(spec: InferenceServiceSpec, path: Path, name: str | None = None) -> Path:
    manifest = build_manifest(spec, name)
    weights = format_bytes(spec.model.profile.weight_bytes)
    header = (
        f"# Written by `inferop export` for {spec.model.name} ({weights} of weights). Apply with kubectl apply -f.\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(manifest, sort_keys=False))
    return path
