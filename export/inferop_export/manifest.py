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

# Room for the Triton process, ONNX Runtime's arena slack and the python of a stub, above the estimate.
RUNTIME_HEADROOM_BYTES = 1 << 30


def build_manifest(
    serving: ServingConfig, profile: ModelProfile, storage_uri: str, name: str | None = None
) -> dict[str, Any]:
    cpus = serving.instances * (serving.intra_op_threads + serving.inter_op_threads - 1)
    estimate = (profile.weight_bytes + profile.activation_bytes_per_sample * serving.max_batch_size) * serving.instances
    memory = f"{math.ceil((estimate + RUNTIME_HEADROOM_BYTES) / 2**20)}Mi"
    spec = {
        "model": {
            "name": serving.name,
            "storageUri": storage_uri,
            "profile": profile.as_spec(),
            "inputs": [_tensor(t) for t in serving.inputs],
            "outputs": [_tensor(t) for t in serving.outputs],
        },
        "replicas": 1,
        "instances": serving.instances,
        "resources": {"requests": {"cpu": str(cpus), "memory": memory}, "limits": {"cpu": str(cpus), "memory": memory}},
        "threads": {"intraOp": serving.intra_op_threads, "interOp": serving.inter_op_threads},
        "batching": {
            "maxBatchSize": serving.max_batch_size,
            "maxQueueDelayMicroseconds": serving.max_queue_delay_microseconds,
            "maxQueueSize": serving.max_queue_size,
        },
        "timeouts": {"requestSeconds": serving.request_timeout_microseconds / 1e6},
    }
    plan_service(parse_spec(spec))  # raises if the operator would refuse it
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name or serving.name.replace("_", "-").lower()},
        "spec": spec,
    }


def write_manifest(serving: ServingConfig, profile: ModelProfile, storage_uri: str, path: Path) -> Path:
    manifest = build_manifest(serving, profile, storage_uri)
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
