"""Drill: the kubelet holds a pod to the CPUs the plan gave it.

The same InferenceService (Inception V3, the plan deriving its threads from the CPU limit) runs on the local
cluster's real node at 1 CPU and then at 2, one after the other; closed-loop callers in the node's network reach
the pod's address. The kubelet turns each CPU limit into the container's CFS quota, read back from inside the
container with its throttled time: on a 2-core node the 1-CPU pod should serve about half of what the 2-CPU pod
serves. Inception V3's calls cost the server about 100 times what they cost the callers, so the callers' own CPU
barely shares the node's two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from inferop_devtools.cluster.node import NodeSite
from inferop_devtools.drills.harness import DrillCluster, operator_running
from inferop_operator.plan import memory_limit, plan_service
from inferop_operator.spec import parse_spec

MODEL = "inception_v3"
CPUS = (1, 2)
CONCURRENCY = 4  # two instances' worth of batches waiting at 2 CPUs
CGROUP_FILES = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us",
                "/sys/fs/cgroup/cpu/cpu.stat", "/sys/fs/cgroup/cpuacct/cpuacct.usage")  # fmt: skip


def at_cpus(manifest: dict[str, Any], name: str, cpus: int) -> dict[str, Any]:
    """The exported manifest at `cpus` CPUs, its threads left to the plan and its memory limit the plan's."""
    spec = {key: value for key, value in manifest["spec"].items() if key != "threads"}
    spec["resources"] = {"requests": {"cpu": str(cpus)}, "limits": {"cpu": str(cpus)}}
    memory = memory_limit(plan_service(parse_spec(spec)).memory.required_bytes)
    spec["resources"]["requests"]["memory"] = spec["resources"]["limits"]["memory"] = memory
    return {**manifest, "metadata": {"name": name}, "spec": spec}


def cgroup_reading(cluster: DrillCluster, pod: str) -> dict[str, int]:
    """The container's CPU quota and period (microseconds), throttled time and CPU used (nanoseconds), as the
    kernel holds them for the cgroup the kubelet made."""
    said = cluster.kubectl("exec", pod, "-c", "triton", "--", "cat", *CGROUP_FILES).stdout.split("\n")
    stat = dict(line.split() for line in said[2:-2] if line)
    return {
        "quota_us": int(said[0]),
        "period_us": int(said[1]),
        "throttled_ns": int(stat["throttled_time"]),
        "used_ns": int(said[-2]),
    }


def busy_cpu_seconds() -> float:
    """CPU-seconds this machine has spent busy since boot (all of /proc/stat's first line but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run_cpu_share(root: Path, quick: bool) -> dict[str, Any]:
    from inferop_core.cli import main as inferop

    seconds = 15 if quick else 45
    repo, manifest_path = root / "model_repo", root / "inception-v3.yaml"
    if inferop(["export", MODEL, "--repo", str(repo), "--manifest", str(manifest_path)]):
        raise SystemExit(f"error: exporting {MODEL} for the node drill failed")
    exported = yaml.safe_load(manifest_path.read_text())
    exported["spec"]["model"]["storageUri"] = f"hostpath://{repo / MODEL}"
    runs = []
    with DrillCluster(root, node=True) as cluster, operator_running(cluster, root / "operator.log"):
        site = NodeSite.of(cluster.plane.layout.root)
        for cpus in CPUS:
            name = f"cpu-{cpus}"
            manifest = at_cpus(exported, name, cpus)
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
            cluster.kubectl("wait", "--for=condition=Ready", f"infsvc/{name}", "--timeout=300s")
            found = json.loads(cluster.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={name}", "-o",
                                               "json").stdout)["items"]  # fmt: skip
            pod, address = found[0]["metadata"]["name"], found[0]["status"]["podIP"]
            before, busy_before = cgroup_reading(cluster, pod), busy_cpu_seconds()
            bench = subprocess.run(
                site.in_network(sys.executable, "-m", "inferop_core.cli", "bench", "--url", f"{address}:8000",
                                "--model", MODEL, "--concurrency", str(CONCURRENCY), "--seconds", str(seconds),
                                "--json"),
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            after, busy = cgroup_reading(cluster, pod), busy_cpu_seconds() - busy_before
            seconds_of = {key: (after[key] - before[key]) / 1e9 for key in ("used_ns", "throttled_ns")}
            (level,) = json.loads(bench.stdout)["levels"]
            threads = plan_service(parse_spec(manifest["spec"])).threads
            runs.append(
                {
                    "cpus": cpus,
                    "intra_op_threads": threads.intra_op,
                    "instances": threads.instances,
                    "quota_cpus": before["quota_us"] / before["period_us"],
                    "samples_per_s": round(level["throughput"], 2),
                    "p50_ms": round(level["p50_ms"], 1),
                    "errors": level["errors"] + level["rejected"],
                    "cpu_used": round(seconds_of["used_ns"] / level["seconds"], 2),
                    # what the rest of the machine used meanwhile (the callers, the node's daemons, anything else)
                    "other_cpu": round((busy - seconds_of["used_ns"]) / level["seconds"], 2),
                    "throttled": round(seconds_of["throttled_ns"] / level["seconds"], 2),
                }
            )
            cluster.kubectl("delete", "infsvc", name, "--wait=true")
            cluster.kubectl("wait", "--for=delete", "pod", pod, "--timeout=120s", check=False)
    one, two = runs
    return {"model": MODEL, "seconds": seconds, "concurrency": CONCURRENCY, "runs": runs,
            "ratio_1_to_2": round(one["samples_per_s"] / two["samples_per_s"], 3)}  # fmt: skip


def format_cpu_share(result: dict[str, Any]) -> str:
    rows = [
        f"| {r['cpus']} | {r['quota_cpus']:g} | {r['instances']} x {r['intra_op_threads']} | {r['samples_per_s']} | "
        f"{r['p50_ms']} | {r['cpu_used']} | {r['samples_per_s'] / r['cpu_used']:.1f} | {r['throttled']} | "
        f"{r['other_cpu']} | {r['errors']} |"
        for r in result["runs"]
    ]
    return "\n".join(
        [
            "### CPU limits on a real node",
            "",
            f"{result['model']} on the local cluster's node, {result['concurrency']} closed-loop callers in the "
            f"node's network for {result['seconds']} s at each limit; the quota as the kubelet wrote it into the "
            "container's cgroup, CPU used and throttled time (CPU-seconds per second) from that cgroup.",
            "",
            "| CPU limit | CFS quota (CPUs) | instances x intra-op | samples/s | p50 ms | CPU used | samples per "
            "CPU-second | throttled | the rest of the machine | errors |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Throughput at 1 CPU against 2 CPUs: **{result['ratio_1_to_2']}**. It is 0.5 where the kubelet holds "
            "each pod to its limit, the 2-CPU pod gets both CPUs and the model's threads scale linearly; the CPU used "
            "says what the pods got (the rest of the machine: the callers, the node's daemons, anything else) and "
            "samples per CPU-second how the model scaled.",
        ]
    )
