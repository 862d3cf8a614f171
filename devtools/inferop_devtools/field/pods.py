"""What every field drill stands on: the machine split between server and load, the exported models, the
naive and the planned configs, the callers; and, for one-off studies, a tritonserver in a pod-sized cgroup of its
own (`inferop serve`'s limits)."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from inferop import bench
from inferop.limits import PodLimits
from inferop.openloop import OpenLoopResult, generator_process, run_open_loop
from inferop.paths import repo_root
from inferop.serving.localrepo import write_model_repo
from inferop.serving.tritonserver import TritonServer, free_port
from inferop_core.cli import main as inferop
from inferop_core.memory import LOCAL_RUNTIME
from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING, CpuScheduling
from inferop_core.tritonconfig import ServingConfig
from inferop_operator import builders
from inferop_operator.plan import plan_service
from inferop_operator.spec import parse_spec

ROOT = repo_root()
REPO = ROOT / "model_repo"
OUT = ROOT / "out" / "field"
NETWORKS = ("conv_net", "inception_v3")
MiB = 2**20
# What a user's own tritonserver runs under; inferop's pods run under DEFAULT_CPU_SCHEDULING (SCHED_BATCH).
NAIVE_SCHEDULING: CpuScheduling = "normal"


@dataclass(frozen=True)
class Machine:
    """The server's CPU and the load generator's: a client must not take the cycles it measures."""

    server_cpus: set[int]
    client_cpus: set[int]

    @classmethod
    def split(cls) -> Machine:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("error: the drills need 2 CPUs: one for the server, one for the load generator")
        return cls(server_cpus={cpus[-1]}, client_cpus=set(cpus[:-1]))

    def limits(self, cpus: float | None = 1.0, memory_bytes: int | None = None) -> PodLimits:
        cpuset = ",".join(map(str, sorted(self.server_cpus)))
        return PodLimits(cpus=cpus, memory_bytes=memory_bytes, cpuset=cpuset)


def export_args(network: str) -> list[str]:
    """`inferop export`'s arguments for a built-in network, or for a model a user brings that the memory drill
    holds out: the example ranker (two inputs, FP32 and INT64) and an ONNX file with large activations."""
    if network == "ranker":
        inputs = ["--input", "features=16", "--input", "category=1:INT64", "--output", "score"]
        return ["torch", "ranker:build", "--app-dir", str(ROOT / "export" / "examples"), *inputs]
    if network == "wide_activations":
        from inferop_devtools.field.models import wide_activations

        return ["onnx", str(wide_activations(OUT / "models" / "wide_activations.onnx")), "--name", network]
    return [network]


@functools.cache
def exported_spec(network: str) -> dict[str, Any]:
    """The InferenceService spec `inferop export` writes, with the profile it measured: exported once per
    run, so the capacity the queue bound is derived from was measured on this machine, in this run."""
    manifest = OUT / "manifests" / f"{network}.yaml"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    if inferop(["export", *export_args(network), "--repo", str(REPO), "--manifest", str(manifest)]) != 0:
        raise SystemExit(f"error: exporting {network} failed")
    spec: dict[str, Any] = yaml.safe_load(manifest.read_text())["spec"]
    return spec


def pod_spec(
    network: str, cpus: float, memory: int | None = None, changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The exported spec with a pod's limits, its instances and threads derived for them, and the given top-level or
    `section.field` changes."""
    spec = json.loads(json.dumps(exported_spec(network)))
    limits: dict[str, Any] = {"cpu": f"{cpus:g}"}
    if memory is not None:
        limits["memory"] = f"{math.ceil(memory / MiB)}Mi"
    spec["resources"] = {"limits": limits}
    spec["threads"] = {}
    spec.pop("instances", None)  # derived for these limits, as threads are
    spec.pop("replicas", None)
    for key, value in (changes or {}).items():
        section, _, field = key.partition(".")
        if field:
            spec.setdefault(section, {})[field] = value
        else:
            spec[key] = value
    return spec


def planned(raw: dict[str, Any]) -> ServingConfig:
    """What the operator renders for `raw`, with the local runtime's memory constants."""
    return plan_service(parse_spec(raw), LOCAL_RUNTIME).serving


def naive(serving: ServingConfig, instances: int | None = None) -> ServingConfig:
    """The same model as a user configures it by hand: Triton's defaults (an unbounded queue whose requests
    wait for ever) and ONNX Runtime's (a thread per core for each instance, a memory pattern per shape)."""
    return serving.model_copy(
        update={
            "instances": instances or serving.instances,
            "intra_op_threads": None,
            "inter_op_threads": None,
            "max_queue_size": None,
            "request_timeout_microseconds": None,
            "memory_pattern": True,
        }
    )


@dataclass(frozen=True)
class Rendered:
    """What the operator's Deployment gives the Triton container of `raw`: its liveness probe, the grace a
    kubelet gives it on a restart, tritonserver's own shutdown wait, and its environment."""

    liveness_probe: dict[str, Any]
    grace_seconds: int
    exit_timeout_args: list[str]
    env: dict[str, str]  # the thread counts of OpenMP and the maths libraries


def rendered(raw: dict[str, Any]) -> Rendered:
    spec = parse_spec(raw)
    service = builders.Service(
        name=spec.model.name.replace("_", "-"),
        namespace="field",
        uid="00000000-0000-4000-8000-000000000000",
        spec=spec,
        plan=plan_service(spec, LOCAL_RUNTIME),
        image="tritonserver",
    )
    pod_spec_ = builders.build_deployment(service)["spec"]["template"]["spec"]
    container = next(c for c in pod_spec_["containers"] if c["name"] == "triton")
    return Rendered(
        liveness_probe=container["livenessProbe"],
        grace_seconds=int(pod_spec_["terminationGracePeriodSeconds"]),
        exit_timeout_args=[arg for arg in container["args"] if arg.startswith("--exit-timeout-secs=")],
        env={variable["name"]: variable["value"] for variable in container.get("env", [])},
    )


@contextlib.contextmanager
def local_server(
    serving: ServingConfig,
    limits: PodLimits,
    env: dict[str, str] | None = None,
    cpu_scheduling: CpuScheduling = DEFAULT_CPU_SCHEDULING,
    extra_args: list[str] | None = None,
) -> Iterator[TritonServer]:
    """A tritonserver serving `serving` (the exported model.onnx, this config) under `limits`, as `inferop serve
    --cpus --memory` runs one on this machine (a cgroup of its own, no kubelet): for a study of Triton itself, where a
    pod's image and node would only add what the drills on the node already measure."""
    work = Path(tempfile.mkdtemp(prefix="inferop-field-"))
    write_model_repo(serving, REPO / serving.name, work / "repo")
    server = TritonServer(
        work / "repo",
        http_port=free_port(),
        limits=limits,
        env=env or {},
        cpu_scheduling=cpu_scheduling,
        extra_args=extra_args or [],
    )
    try:
        server.start(timeout=300)
        yield server
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def one_request(serving: ServingConfig) -> dict[str, np.ndarray]:
    """One sample of every input: floats drawn at random, integers 0 (inside any embedding table)."""
    from tritonclient.utils import triton_to_np_dtype

    rng = np.random.default_rng(0)
    request = {}
    for spec in serving.inputs:
        dtype = np.dtype(triton_to_np_dtype(spec.datatype))
        shape = (1, *spec.dims)
        floating = np.issubdtype(dtype, np.floating)
        request[spec.name] = rng.standard_normal(shape).astype(dtype) if floating else np.zeros(shape, dtype)
    return request


def closed_loop(url: str, model: str, concurrency: int, seconds: float, machine: Machine) -> bench.LevelResult:
    """`concurrency` callers of `model` at `url` for `seconds`, from the callers' CPU."""
    with generator_process(machine.client_cpus):
        return bench.sweep(url, model, [concurrency], seconds, batch=1, timeout=120)[0]


def open_loop(
    url: str,
    serving: ServingConfig,
    rate: float,
    seconds: float,
    timeout: float | None,
    machine: Machine,
    memory_probe: Callable[[], int],
) -> OpenLoopResult:
    """Open-loop arrivals at `url` from the callers' CPU, with the pod's memory sampled by `memory_probe`."""
    return run_open_loop(
        url,
        serving.name,
        one_request(serving),
        rate,
        seconds,
        timeout=timeout,
        memory_probe=memory_probe,
        client_cpus=machine.client_cpus,
        drain=5.0,
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def at_most(value: float | None, bound: float) -> bool:
    """A goal on a measured figure: None (nothing was measured: the max of no requests) fails it, never passes."""
    return value is not None and value <= bound


def describe(serving: ServingConfig, policy: CpuScheduling) -> str:
    threads = "ORT default" if serving.intra_op_threads is None else f"{serving.intra_op_threads}"
    queue = "unbounded" if serving.max_queue_size is None else str(serving.max_queue_size)
    timeout = (
        "none" if serving.request_timeout_microseconds is None else f"{serving.request_timeout_microseconds / 1e6:g}s"
    )
    return (
        f"{serving.instances} instance(s), intra-op {threads}, maxBatchSize {serving.max_batch_size}, "
        f"queue {queue}, timeout {timeout}, {'SCHED_BATCH' if policy == 'batch' else 'SCHED_OTHER'}"
    )
