"""`make bench`: the speed and memory targets, measured in one run and printed as ratios.

Serving (Inception V3): images/s through the local Triton against ONNX Runtime in-process with the same
threads, and against this machine's fp32 ceiling (MACs x 2 / a measured large-matmul FLOP rate); int8 (the
exporter's quantization) through Triton against fp32, with the served config and each tuned by `inferop tune`,
with its accuracy gate's agreement beside it.
GPU (only where one exists): both networks exported for the GPU, served on it, callers from 1 to 64, and the
device memory they take against the memory fit's estimate.
Tuning (the conv net under a 2-CPU quota and a p99 budget): `inferop tune`'s climb against the exhaustive sweep of
the same grid, in trials, time and best throughput, the two winners measured again side by side.
Operator: time from `kubectl apply` to the Deployment existing (p50 of 20), time for 100 services
applied at once to converge, and the operator's resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inferop.paths import repo_root
from inferop.threads import local_cpus
from inferop_devtools.drills.harness import watch_until

ROOT = repo_root()
REPO = ROOT / "model_repo"


def matmul_gflops(threads: int, seconds: float = 3.0, size: int = 2048) -> float:
    """Sustained fp32 GFLOP/s of a large matrix product with `threads` threads (PyTorch's BLAS)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        runs += 1
    return 2 * size**3 * runs / (time.perf_counter() - start) / 1e9


def onnxruntime_images_per_second(model: Path, intra: int, inter: int, batch: int, seconds: float) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = intra, inter
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).standard_normal((batch, 3, 299, 299)).astype(np.float32)
    session.run(None, {"images": images})
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, {"images": images})
        done += batch
    return done / (time.perf_counter() - start)


SERVING_ROUNDS = 3


def serving_bench(seconds: float) -> dict[str, Any]:
    """Triton, ONNX Runtime in-process and the fp32 ceiling, measured in alternating rounds and compared as
    medians: this machine's speed drifts by a fifth within minutes, more than separate measurements could tell."""
    from inferop import bench
    from inferop.cli import main as inferop
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop.tritonconfig import parse_model_config
    from inferop_export.profile import profile_onnx

    cpus = local_cpus()
    model_dir = REPO / "inception_v3"
    if not (model_dir / "1" / "model.onnx").exists():
        print("exporting inception_v3 (once)", flush=True)
        if inferop(["export", "inception_v3", "--repo", str(REPO)]) != 0:
            raise SystemExit(1)
    config = parse_model_config((model_dir / "config.pbtxt").read_text())
    intra = int(config.parameters["intra_op_thread_count"].string_value)
    inter = int(config.parameters["inter_op_thread_count"].string_value)
    batch = config.max_batch_size
    import onnx

    macs = profile_onnx(onnx.load(str(model_dir / "1" / "model.onnx"))).macs_per_sample

    print(
        f"{SERVING_ROUNDS} alternating rounds: fp32 matmul rate with {intra} thread(s), ONNX Runtime in-process and "
        f"the local tritonserver, 2 callers of batch {batch} ({intra} intra-op / {inter} inter-op threads) ...",
        flush=True,
    )
    rounds: dict[str, list[float]] = {"ceiling": [], "onnxruntime": [], "triton": []}
    errors = 0
    with TritonServer(REPO, http_port=free_port()) as server:
        for _ in range(SERVING_ROUNDS):
            gflops = max(matmul_gflops(intra, size=size) for size in (2048, 4096))  # the best sustained rate
            rounds["ceiling"].append(gflops * 1e9 / (2 * macs))
            model = model_dir / "1" / "model.onnx"
            rounds["onnxruntime"].append(onnxruntime_images_per_second(model, intra, inter, batch, seconds / 2))
            batched = bench.sweep(server.url, "inception_v3", [2], seconds / 2, batch=batch)[0]
            rounds["triton"].append(batched.throughput)
            errors += batched.errors
        print(f"local tritonserver, {2 * batch} callers of batch 1 ...", flush=True)
        single = bench.sweep(server.url, "inception_v3", [2 * batch], seconds, batch=1)[0]
    int8 = int8_bench(model_dir, batch, seconds)
    return {
        "cpus": cpus,
        "threads": {"intraOp": intra, "interOp": inter},
        "macs_per_image": macs,
        "ceiling_images_per_s": round(statistics.median(rounds["ceiling"]), 2),
        "onnxruntime_images_per_s": round(statistics.median(rounds["onnxruntime"]), 2),
        "triton_batch8_images_per_s": round(statistics.median(rounds["triton"]), 2),
        "rounds": {name: [round(rate, 2) for rate in rates] for name, rates in rounds.items()},
        "triton_batch1_images_per_s": round(single.throughput, 2),
        "triton_batch1_mean_batch": round(single.mean_batch, 2),
        "triton_batch1_p99_ms": round(single.p99_ms, 1),
        "errors": errors + single.errors + int8.pop("errors"),
        "int8": int8,
    }


INT8_ROUNDS = 3
TUNED_CONCURRENCY = 4


def int8_bench(model_dir: Path, batch: int, seconds: float) -> dict[str, Any]:
    """The served fp32 model quantized as `inferop export --precision int8` does (same seeds) and its accuracy gate
    run; then fp32 and int8 through Triton, twice: with the served config, and each with the config `inferop tune`'s
    climb finds for it under the same CPUs (the two precisions need different layouts). Each pair is served side by
    side and measured in alternation: this machine's speed drifts by a fifth over minutes, more than a ratio of two
    separate runs could tell. The figures are measured whether or not the gate passes: export would not write a
    failing model."""
    import shutil

    import onnx

    from inferop.serving.localrepo import write_model_repo
    from inferop.tritonconfig import parse_model_config, read_serving_config
    from inferop_export.networks.inception_v3 import inception_v3
    from inferop_export.precision import quantize_int8, run_gate
    from inferop_export.signature import read_signature
    from inferop_export.tune import Grid, Search, TritonTrials, require_best, thread_layouts

    source = inception_v3()
    assert source.gate is not None
    fp32 = model_dir / "1" / "model.onnx"
    signature = read_signature(onnx.load(str(fp32)), source.overrides)
    with tempfile.TemporaryDirectory(prefix="inferop-bench-int8-") as work:
        repos = {precision: Path(work) / precision for precision in ("fp32", "int8")}
        for repo in repos.values():
            shutil.copytree(model_dir, repo / model_dir.name)
        int8 = repos["int8"] / model_dir.name / "1" / "model.onnx"
        print("int8: quantizing, then its accuracy gate on 1,000 held-out inputs ...", flush=True)
        quantize_int8(fp32, int8, source, signature, seed=3)
        gate = run_gate("int8", fp32, int8, source, signature, source.gate, seed=4)
        print(f"int8 and fp32, served config: {INT8_ROUNDS} alternating rounds of 2 x batch {batch} ...", flush=True)
        served = alternate(repos, model_dir.name, 2, batch, seconds / 2)

        serving = read_serving_config(parse_model_config((model_dir / "config.pbtxt").read_text()))
        cpus = float(local_cpus())
        grid = Grid(cpus, thread_layouts(cpus), (batch, 2 * batch), (0, 4000))
        tuned_repos, winners = {}, {}
        for precision, repo in repos.items():
            print(
                f"{precision}: inferop tune's climb over {grid.size} configs, {TUNED_CONCURRENCY} x batch {batch} ..."
            )
            measure = TritonTrials(repo / model_dir.name, serving, cpus, TUNED_CONCURRENCY, batch, seconds / 3)
            search = Search(measure, None)
            search.climb(grid, grid.start(serving.max_batch_size, serving.max_queue_delay_microseconds))
            winner = require_best(search.trials, None).settings
            winners[precision] = winner.describe()
            tuned_repos[precision] = write_model_repo(
                winner.apply(serving), repo / model_dir.name, Path(work) / f"tuned-{precision}"
            )
        print(
            f"int8 and fp32, tuned: {INT8_ROUNDS} alternating rounds of {TUNED_CONCURRENCY} x batch {batch} ...",
            flush=True,
        )
        tuned = alternate(tuned_repos, model_dir.name, TUNED_CONCURRENCY, batch, seconds / 2)
    return {
        "fp32_triton_batch8_images_per_s": served["fp32"]["median"],
        "triton_batch8_images_per_s": served["int8"]["median"],
        "rounds": {precision: figures["rounds"] for precision, figures in served.items()},
        "tuned": {precision: {"config": winners[precision], **figures} for precision, figures in tuned.items()},
        "gate": gate.as_dict(),
        "errors": sum(figures["errors"] for figures in (*served.values(), *tuned.values())),
    }


def alternate(repos: dict[str, Path], model: str, concurrency: int, batch: int, seconds: float) -> dict[str, Any]:
    """Each repository served at once, measured in `INT8_ROUNDS` rounds of one level each, in turn."""
    from contextlib import ExitStack

    from inferop import bench
    from inferop.serving.tritonserver import TritonServer, free_port

    rates: dict[str, list[float]] = {name: [] for name in repos}
    errors = dict.fromkeys(repos, 0)
    with ExitStack() as stack:
        servers = {name: stack.enter_context(TritonServer(repo, http_port=free_port())) for name, repo in repos.items()}
        for _ in range(INT8_ROUNDS):
            for name, server in servers.items():
                level = bench.sweep(server.url, model, [concurrency], seconds, batch=batch)[0]
                rates[name].append(level.throughput)
                errors[name] += level.errors
    return {
        name: {
            "median": round(statistics.median(values), 2),
            "rounds": [round(rate, 2) for rate in values],
            "errors": errors[name],
        }
        for name, values in rates.items()
    }


GPU_LEVELS = [1, 2, 4, 8, 16, 32, 64]


def gpu_bench(seconds: float) -> dict[str, Any]:
    """Both networks on the GPU with its whole memory as gpu.memory: throughput and p99 from 1 to 64 callers, and the
    device memory of the server's processes after the sweep against the plans' estimates."""
    from inferop import bench
    from inferop.serving.gpu import process_group_device_memory
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_export.networks.inception_v3 import inception_v3
    from inferop_operator.plan import plan_service

    total = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits", "--id=0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    name, mib = (part.strip() for part in total.rsplit(",", 1))
    figures: dict[str, Any] = {"device": name, "device_memory_mib": int(mib), "models": {}}
    with tempfile.TemporaryDirectory(prefix="inferop-bench-gpu-") as work:
        repo = Path(work) / "repo"
        estimate = 0
        for network in (conv_net, inception_v3):
            print(f"gpu: exporting {network.__name__} for the GPU ...", flush=True)
            report = export_model(network(), repo, gpu_memory=f"{mib}Mi", quiet=True)
            estimate += plan_service(report.spec).memory.required_bytes
        figures["device_memory_estimate_mib"] = round(estimate / 2**20)
        with TritonServer(repo, http_port=free_port()) as server:
            for model in ("conv_net", "inception_v3"):
                print(f"gpu: {model}, callers {GPU_LEVELS} ...", flush=True)
                levels = bench.sweep(server.url, model, GPU_LEVELS, seconds, batch=1)
                figures["models"][model] = [
                    {
                        "concurrency": r.concurrency,
                        "samples_per_s": round(r.throughput, 1),
                        "p99_ms": round(r.p99_ms, 2),
                        "mean_batch": round(r.mean_batch, 2),
                        "errors": r.errors,
                    }
                    for r in levels
                ]
            assert server.process is not None
            used = process_group_device_memory(os.getpgid(server.process.pid))
            figures["device_memory_used_mib"] = round(used / 2**20)
    return figures


TUNE_CPUS = 2.0
TUNE_P99_MS = 40.0
TUNE_SECONDS = 3.0
TUNE_CONCURRENCY = 16
CONFIRM_ROUNDS = 3


def tune_bench() -> dict[str, Any]:
    """The climb and the exhaustive sweep of one grid, with one budget, on the default conv net; then both winners
    measured again in alternation, because the best of 72 noisy measurements is biased upwards against the best of
    a few (repeated trials of one config differ by up to 8% here)."""
    from inferop.tritonconfig import parse_model_config, read_serving_config
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_export.tune import Grid, Search, TritonTrials, TuneError, require_best, thread_layouts

    with tempfile.TemporaryDirectory(prefix="inferop-bench-tune-") as work:
        repo = Path(work) / "repo"
        print("tune: exporting conv_net ...", flush=True)
        export_model(conv_net(), repo, quiet=True)
        model_dir = repo / "conv_net"
        serving = read_serving_config(parse_model_config((model_dir / "config.pbtxt").read_text()))
        grid = Grid(TUNE_CPUS, thread_layouts(TUNE_CPUS), (1, 2, 4, 8, 16, 32), (0, 1000, 4000))
        measure = TritonTrials(model_dir, serving, TUNE_CPUS, TUNE_CONCURRENCY, 1, TUNE_SECONDS)
        found = {}
        for how in ("climb", "exhaustive"):
            print(f"tune: {how} over {grid.size} configs, p99 <= {TUNE_P99_MS:g} ms ...", flush=True)
            search = Search(measure, TUNE_P99_MS)
            began = time.monotonic()
            if how == "climb":
                search.climb(grid, grid.start(serving.max_batch_size, serving.max_queue_delay_microseconds))
            else:
                search.sweep(grid)
            found[how] = {"trials": len(search.trials), "seconds": round(time.monotonic() - began, 1)}
            try:
                best = require_best(search.trials, TUNE_P99_MS)
            except TuneError as error:  # a search that meets no budget is a result too: the other one is kept
                found[how]["error"] = str(error)
                continue
            found[how].update(
                best=best.settings.describe(),
                best_samples_per_s=round(best.throughput, 1),
                best_p99_ms=round(best.p99_ms, 1),
                settings=best.settings,
            )
        winners = [how for how, figures in found.items() if "settings" in figures]
        print(f"tune: {' and '.join(winners) or 'no'} winner(s) again, in alternation ...", flush=True)
        again: dict[str, list[float]] = {how: [] for how in winners}
        for _ in range(CONFIRM_ROUNDS):
            for how in again:
                again[how].append(measure(found[how]["settings"]).throughput)
    for how in winners:
        found[how].pop("settings")
        found[how]["again_samples_per_s"] = round(statistics.median(again[how]), 1)
    return {"cpus": TUNE_CPUS, "p99_budget_ms": TUNE_P99_MS, "grid": grid.size, **found}


def operator_bench(services: int, samples: int) -> dict[str, Any]:
    """Against a fresh local control plane with the operator as its own process (for its RSS)."""
    from inferop.serving.tritonserver import free_port, http_status
    from inferop_devtools.cluster.controlplane import ControlPlane

    tools = Path(
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "helm-kubectl.sh")], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )
    with tempfile.TemporaryDirectory() as state, ControlPlane(Path(state) / "cluster") as plane:
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}

        def kubectl(*args: str, stdin: str | None = None) -> None:
            subprocess.run(
                [str(tools / "kubectl"), *args], input=stdin, text=True, env=env, check=True, capture_output=True
            )

        kubectl("apply", *plane.release.kubectl_crd_flags, "-f", str(ROOT / "charts" / "inferop" / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/inferenceservices.inferop.dev")
        kubectl("create", "namespace", "latency")
        kubectl("create", "namespace", "fleet")
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        log = open(Path(state) / "operator.log", "wb")  # noqa: SIM115 - closed with the process below
        operator = subprocess.Popen(
            [sys.executable, "-m", "inferop.cli", "operator", f"--liveness={liveness}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            from kubernetes import client, config

            api = client.AppsV1Api(config.new_client_from_config(str(plane.kubeconfig)))
            example = (ROOT / "operator" / "examples" / "conv-net.yaml").read_text()
            _poll(lambda: http_status(liveness) == 200, 60, "the operator's liveness endpoint")
            latencies = []
            for index in range(samples):
                name = f"latency-{index}"
                start = time.perf_counter()
                kubectl("apply", "-n", "latency", "-f", "-", stdin=example.replace("name: conv-net", f"name: {name}"))
                watch_until(
                    f"Deployment {name}",
                    30,
                    1,
                    lambda deployment: True,
                    api.list_namespaced_deployment,
                    "latency",
                    field_selector=f"metadata.name={name}",
                )
                latencies.append(time.perf_counter() - start)

            many = "\n---\n".join(example.replace("name: conv-net", f"name: fleet-{i}") for i in range(services))
            start = time.perf_counter()
            kubectl("apply", "-n", "fleet", "-f", "-", stdin=many)
            custom = client.CustomObjectsApi(api.api_client)
            deadline = time.monotonic() + 300

            def observed(service: dict[str, Any]) -> bool:
                status = service.get("status") or {}
                return bool(status.get("observedGeneration") == service["metadata"]["generation"])

            # Converged: every Deployment exists and every service has reported on its spec; one condition after
            # the other, so the time taken is that of the later.
            watch_until(
                f"{services} Deployments",
                deadline - time.monotonic(),
                services,
                lambda deployment: True,
                api.list_namespaced_deployment,
                "fleet",
            )
            watch_until(
                f"{services} services to report status.observedGeneration",
                deadline - time.monotonic(),
                services,
                observed,
                custom.list_namespaced_custom_object,
                "inferop.dev",
                "v1alpha1",
                "fleet",
                "inferenceservices",
            )
            converge_seconds = time.perf_counter() - start
            rss = _rss_bytes(operator.pid)
        finally:
            operator.terminate()
            operator.wait(30)
            log.close()
    return {
        "apply_to_deployment_p50_s": round(statistics.median(latencies), 3),
        "apply_to_deployment_max_s": round(max(latencies), 3),
        "samples": samples,
        "services": services,
        "converge_s": round(converge_seconds, 2),
        "operator_rss_mb": round(rss / 2**20, 1),
    }


def _poll(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """For what no watch can follow (an HTTP endpoint), before anything is timed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def report_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    if "serving" in results:
        s = results["serving"]
        gflop = 2 * s["macs_per_image"] / 1e9
        triton, rounds = s["triton_batch8_images_per_s"], s["rounds"]

        def by_round(reference: str) -> str:
            return ", ".join(f"{t / r:.2f}" for t, r in zip(rounds["triton"], rounds[reference], strict=True))

        lines += [
            f"Inception V3, {s['threads']['intraOp']} intra-op thread(s), {s['cpus']} CPU(s), "
            f"medians of {len(rounds['triton'])} alternating rounds:",
            f"  fp32 ceiling          {s['ceiling_images_per_s']:>7.2f} images/s"
            f"  (a large matmul's FLOP rate / {gflop:.2f} GFLOP an image)",
            f"  ONNX Runtime          {s['onnxruntime_images_per_s']:>7.2f} images/s  in-process, batch 8",
            f"  Triton, batch 8 x 2   {triton:>7.2f} images/s",
            f"  Triton, batch 1 x 16  {s['triton_batch1_images_per_s']:>7.2f} images/s"
            f"  (dynamic batches of {s['triton_batch1_mean_batch']}, p99 {s['triton_batch1_p99_ms']} ms; one level)",
            f"  ratio Triton / ONNX Runtime in-process: {triton / s['onnxruntime_images_per_s']:.2f}  (target >= 0.85; "
            f"round by round: {by_round('onnxruntime')})",
            f"  ratio Triton / fp32 ceiling:            {triton / s['ceiling_images_per_s']:.2f}  (target >= 0.75; "
            f"round by round: {by_round('ceiling')})",
        ]
        int8 = s["int8"]
        verdict = (
            "passes its gate" if int8["gate"]["passed"] else f"FAILS its gate: {'; '.join(int8['gate']['failures'])}"
        )
        lines += [
            f"  int8, Triton, batch 8 x 2 {int8['triton_batch8_images_per_s']:>7.2f} images/s  (fp32 "
            f"{int8['fp32_triton_batch8_images_per_s']:.2f} in alternation: medians of {len(int8['rounds']['int8'])})",
            f"  ratio int8 / fp32 through Triton:       "
            f"{int8['triton_batch8_images_per_s'] / int8['fp32_triton_batch8_images_per_s']:.2f}  (target >= 2.2; "
            "round by round: "
            + ", ".join(f"{i / f:.2f}" for f, i in zip(int8["rounds"]["fp32"], int8["rounds"]["int8"], strict=True))
            + ")",
            f"  tuned for each by inferop tune, {TUNED_CONCURRENCY} x batch 8: fp32 {int8['tuned']['fp32']['config']} "
            f"{int8['tuned']['fp32']['median']:.2f}, int8 {int8['tuned']['int8']['config']} "
            f"{int8['tuned']['int8']['median']:.2f} images/s",
            f"  ratio int8 / fp32 through Triton, tuned: "
            f"{int8['tuned']['int8']['median'] / int8['tuned']['fp32']['median']:.2f}  (target >= 2.2; round by round: "
            + ", ".join(
                f"{i / f:.2f}"
                for f, i in zip(int8["tuned"]["fp32"]["rounds"], int8["tuned"]["int8"]["rounds"], strict=True)
            )
            + ")",
            f"  {int8['gate']['summary']}; {verdict}",
            f"  errors: {s['errors']}",
        ]
    if "gpu" in results:
        g = results["gpu"]
        if "not_measured" in g:
            lines += [f"GPU: not measured ({g['not_measured']})"]
        else:
            lines += [f"GPU: {g['device']} ({g['device_memory_mib']} MiB), batch-1 callers:"]
            for model, levels in g["models"].items():
                best = max(levels, key=lambda level: level["samples_per_s"])
                lines.append(
                    f"  {model:<13} "
                    + "  ".join(f"{lv['concurrency']}: {lv['samples_per_s']:.0f}/s" for lv in levels)
                    + f"  (best at {best['concurrency']}, p99 {best['p99_ms']} ms; errors "
                    f"{sum(lv['errors'] for lv in levels)})"
                )
            used, estimate = g["device_memory_used_mib"], g["device_memory_estimate_mib"]
            lines.append(
                f"  device memory of the server's processes: {used} MiB against the estimate {estimate} MiB "
                f"(ratio {used / estimate:.2f})"
            )
            if "serving" in results:
                gpu_best = max(lv["samples_per_s"] for lv in g["models"]["inception_v3"])
                cpu_best = results["serving"]["triton_batch1_images_per_s"]
                lines.append(f"  ratio Inception GPU / CPU through Triton (batch-1 callers): {gpu_best / cpu_best:.1f}")
    if "tune" in results:
        t = results["tune"]
        climb, sweep = t["climb"], t["exhaustive"]
        lines += [
            f"Tuning the conv net under {t['cpus']:g} CPUs, p99 <= {t['p99_budget_ms']:g} ms, grid of {t['grid']}:",
            *(
                f"  {how:<10} {f['trials']:>3} trials {f['seconds']:>5.0f} s, "
                + (
                    f"best {f['best']}: {f['best_samples_per_s']} samples/s (p99 {f['best_p99_ms']} ms); "
                    f"again {f['again_samples_per_s']}"
                    if "best" in f
                    else f["error"]
                )
                for how, f in (("climb", climb), ("exhaustive", sweep))
            ),
            f"  ratio climb / exhaustive time:          {climb['seconds'] / sweep['seconds']:.2f}  (target <= 0.33)",
        ]
        if "best" in climb and "best" in sweep:
            lines.append(
                f"  ratio climb / exhaustive best, again:   "
                f"{climb['again_samples_per_s'] / sweep['again_samples_per_s']:.2f}  (target >= 0.95; as found: "
                f"{climb['best_samples_per_s'] / sweep['best_samples_per_s']:.2f})"
            )
    if "operator" in results:
        o = results["operator"]
        lines += [
            "Operator (real kube-apiserver 1.20, operator as its own process):",
            f"  kubectl apply -> Deployment exists, p50 of {o['samples']}: {o['apply_to_deployment_p50_s']:.3f} s"
            f"  (target < 1 s; ratio {o['apply_to_deployment_p50_s'] / 1.0:.2f})",
            f"  {o['services']} services applied at once, converged in {o['converge_s']:.1f} s"
            f"  (target < 30 s; ratio {o['converge_s'] / 30:.2f})",
            f"  operator resident memory: {o['operator_rss_mb']:.0f} MB"
            f"  (target < 150 MB; ratio {o['operator_rss_mb'] / 150:.2f})",
        ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each throughput measurement")
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--skip-gpu", action="store_true")
    parser.add_argument("--skip-tune", action="store_true")
    parser.add_argument("--skip-operator", action="store_true")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "bench.json", help="write the figures here")
    args = parser.parse_args()

    from inferop.serving.gpu import local_gpu

    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "serving": lambda: serving_bench(args.seconds),
        "gpu": lambda: gpu_bench(args.seconds / 3) if local_gpu() else {"not_measured": "no NVIDIA GPU with CUDA here"},
        "tune": tune_bench,
        "operator": lambda: operator_bench(args.services, args.samples),
    }
    results: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name, measure in sections.items():
        if getattr(args, f"skip_{name}"):
            continue
        try:
            results[name] = measure()
        except Exception as error:  # one part failing must not lose what the others measured
            traceback.print_exc()
            failed[name] = f"{type(error).__name__}: {error}"

    print("\n=== results (measured in this run)")
    for line in report_lines(results):
        print(line)
    for name, reason in failed.items():
        print(f"{name}: FAILED, not measured: {reason}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**results, "failed": failed}, indent=2))
    print(f"figures: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
