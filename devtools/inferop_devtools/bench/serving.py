"""Serving Inception V3: Triton against ONNX Runtime in-process and against this machine's fp32 ceiling; int8
against fp32 through Triton, with the served config and each tuned by `inferop tune`."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from inferop.paths import repo_root
from inferop_core.cpu import cpu_int8_instructions
from inferop_core.threads import local_cpus
from inferop_devtools.bench.targets import Target

REPO = repo_root() / "model_repo"
TRITON_OVER_ONNXRUNTIME = 0.85
TRITON_OVER_CEILING = 0.75
INT8_OVER_FP32 = 2.2  # on a CPU with int8 dot-product instructions


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


def exported(network: str) -> Path:
    """The built-in network's model directory in the repository the benchmarks serve, exported once."""
    from inferop_core.cli import main as inferop

    model_dir = REPO / network
    if not (model_dir / "1" / "model.onnx").exists():
        print(f"exporting {network} (once)", flush=True)
        if inferop(["export", network, "--repo", str(REPO)]) != 0:
            raise SystemExit(1)
    return model_dir


def serving_bench(seconds: float) -> dict[str, Any]:
    """Triton, ONNX Runtime in-process and the fp32 ceiling, measured in alternating rounds and compared as
    medians: this machine's speed drifts by a fifth within minutes, more than separate measurements could tell."""
    from inferop import bench
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop_core.tritonconfig import parse_model_config
    from inferop_export.profile import profile_onnx

    cpus = local_cpus()
    model_dir = exported("inception_v3")
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
    trained = trained_int8_bench(seconds)
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
        "errors": errors + single.errors + int8.pop("errors") + trained.pop("errors"),
        "int8": int8,
        "trained_classifier_int8": trained,
        "cpu_int8_instructions": cpu_int8_instructions(),
    }


def serving_targets(figures: dict[str, Any]) -> list[Target]:
    """Triton against in-process and the ceiling; int8 against fp32, on a CPU built for int8 only."""
    triton, int8 = figures["triton_batch8_images_per_s"], figures["int8"]
    without = (
        None
        if figures["cpu_int8_instructions"]
        else "this CPU has neither AVX-512 VNNI, AVX-VNNI nor AMX, where int8 does not pay"
    )
    return [
        Target(
            "Triton / ONNX Runtime in-process", triton / figures["onnxruntime_images_per_s"], TRITON_OVER_ONNXRUNTIME
        ),
        Target("Triton / fp32 ceiling", triton / figures["ceiling_images_per_s"], TRITON_OVER_CEILING),
        Target(
            "int8 / fp32 through Triton, served config",
            int8["triton_batch8_images_per_s"] / int8["fp32_triton_batch8_images_per_s"],
            INT8_OVER_FP32,
            not_applicable=without,
        ),
        Target(
            "int8 / fp32 through Triton, each tuned",
            int8["tuned"]["int8"]["median"] / int8["tuned"]["fp32"]["median"],
            INT8_OVER_FP32,
            not_applicable=without,
        ),
    ]


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
    from inferop_core.tritonconfig import parse_model_config, read_serving_config
    from inferop_export.networks.inception_v3 import inception_v3
    from inferop_export.precision import GATE_BATCH, precision_inputs, quantize_int8, run_gate
    from inferop_export.signature import read_signature
    from inferop_export.tune import Grid, Search, TritonTrials, require_best, thread_layouts

    source = inception_v3()
    fp32 = model_dir / "1" / "model.onnx"
    signature = read_signature(onnx.load(str(fp32)), source.overrides)
    calibration, validation, stated = precision_inputs(source, signature, None, seed=3)  # as export makes them
    with tempfile.TemporaryDirectory(prefix="inferop-bench-int8-") as work:
        repos = {precision: Path(work) / precision for precision in ("fp32", "int8")}
        for repo in repos.values():
            shutil.copytree(model_dir, repo / model_dir.name)
        int8 = repos["int8"] / model_dir.name / "1" / "model.onnx"
        print("int8: quantizing, then its accuracy gate on 1,000 held-out inputs ...", flush=True)
        quantize_int8(fp32, int8, calibration, signature)
        gate = run_gate("int8", fp32, int8, validation, signature, stated, GATE_BATCH)
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


def trained_int8_bench(seconds: float) -> dict[str, Any]:
    """int8 of a classifier trained here (inferop_devtools.trained), as a user exports it on their own data: its
    accuracy against the labels beside fp32's, and both through Triton in alternation (batch 8 x 2 callers)."""
    from inferop_devtools.trained import FACTORY, INPUT_FLAG, write_task
    from inferop_export.exporter import export_model
    from inferop_export.precision import UserData
    from inferop_export.signature import parse_input_flag
    from inferop_export.sources import torch_module

    with tempfile.TemporaryDirectory(prefix="inferop-bench-trained-") as work:
        print("a classifier trained here: fp32 and int8 on its own data ...", flush=True)
        task = write_task(Path(work) / "task")
        source = torch_module(
            FACTORY, [parse_input_flag(INPUT_FLAG)], "classifier", output_names=["logits"], weights=task.weights
        )
        repos = {precision: Path(work) / precision for precision in ("fp32", "int8")}
        data = UserData(task.calibration, task.validation)
        export_model(source, repos["fp32"], quiet=True)
        report = export_model(source, repos["int8"], quiet=True, precision="int8", data=data)
        assert report.gate is not None
        batch = report.serving.max_batch_size
        print(f"int8 and fp32 of the classifier: {INT8_ROUNDS} alternating rounds of 2 x batch {batch} ...", flush=True)
        served = alternate(repos, "classifier", 2, batch, seconds / 2)
    return {
        "gate": report.gate.as_dict(),
        "parameters": report.profile.parameters,
        "fp32_triton_images_per_s": served["fp32"]["median"],
        "triton_images_per_s": served["int8"]["median"],
        "rounds": {precision: figures["rounds"] for precision, figures in served.items()},
        "errors": sum(figures["errors"] for figures in served.values()),
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
