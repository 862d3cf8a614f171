"""`inferop export … --manifest FILE`: a ready-to-apply InferenceService with the profile filled in.

The manifest is parsed and planned by the operator's own code before it is written, so a manifest
written here is never refused by the operator's thread-budget or memory-fit checks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from inferop.quantity import format_bytes
from inferop.tritonconfig import ServingConfig, TensorSpec
from inferop_export.profile import ModelProfile
from inferop_operator.plan import plan_service
from inferop_operator.spec import GROUP, KIND, VERSION, parse_spec

# The memory limit written is the estimated peak plus this share: the estimate's stated accuracy.
MEMORY_MARGIN = 1.25


def build_manifest(
    serving: ServingConfig,
    profile: ModelProfile,
    storage_uri: str,
    name: str | None = None,
    queue_size: int | None = None,
) -> dict[str, Any]:
    """The InferenceService for an exported model: the CPUs its threads use, and a memory limit from the
    operator's own peak estimate (queue bound derived by the operator unless `queue_size` is given)."""
    cpus = serving.instances * ((serving.intra_op_threads or 1) + (serving.inter_op_threads or 1) - 1)
    batching: dict[str, Any] = {
        "maxBatchSize": serving.max_batch_size,
        "maxQueueDelayMicroseconds": serving.max_queue_delay_microseconds,
    }
    if queue_size is not None:
        batching["maxQueueSize"] = queue_size
    spec: dict[str, Any] = {
        "model": {
            "name": serving.name,
            "storageUri": storage_uri,
            "profile": profile.as_spec(),
            **({"weights": serving.weights} if serving.weights is not None else {}),
            "inputs": [_tensor(t) for t in serving.inputs],
            "outputs": [_tensor(t) for t in serving.outputs],
        },
        "replicas": 1,
        "instances": serving.instances,
        "resources": {"requests": {"cpu": str(cpus)}, "limits": {"cpu": str(cpus)}},
        "threads": {"intraOp": serving.intra_op_threads, "interOp": serving.inter_op_threads},
        "batching": batching,
        "timeouts": {"requestSeconds": (serving.request_timeout_microseconds or 0) / 1e6},
    }
    peak = plan_service(parse_spec(spec)).memory.required_bytes
    memory = f"{math.ceil(peak * MEMORY_MARGIN / 2**20)}Mi"
    spec["resources"]["requests"]["memory"] = spec["resources"]["limits"]["memory"] = memory
    plan_service(parse_spec(spec))  # raises if the operator would refuse it
    metadata = {"name": name or serving.name.replace("_", "-").lower()}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}


def write_manifest(
    serving: ServingConfig, profile: ModelProfile, storage_uri: str, path: Path, queue_size: int | None = None
) -> Path:
    manifest = build_manifest(serving, profile, storage_uri, queue_size=queue_size)
    estimate = format_bytes(manifest["spec"]["model"]["profile"]["weightBytes"])
    header = f"# Written by `inferop export` for {serving.name} ({estimate} of weights). Apply with kubectl apply -f.\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(manifest, sort_keys=False))
    return path


def _tensor(tensor: TensorSpec) -> dict[str, Any]:
    fields: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "dims": list(tensor.dims)}
    if tensor.label_filename:
        fields["labelFilename"] = tensor.label_filename
    return fields
