"""One-off measurement behind the README's int8 paragraphs ("Reduced precision"): Inception V3 in process with ONNX
Runtime, fp32 against int8, with and without the pools rewritten as depthwise convolutions; where an int8 batch
spends its time by operator (ONNX Runtime's profiler); and how much the fp32 model's own top-1 moves under 1% noise.

    python -m inferop_devtools.oneoff.int8 [--model model_repo/inception_v3/1/model.onnx] [--rounds 3]

The fp32 model is the exported one (`make demo` or `make field` writes it). The int8 models are quantized as
`inferop export --precision int8` quantizes (same seed), whether or not the gate passes. Not part of `make bench`
(it does not go through Triton); run it by hand and quote it as a one-off measurement with its date.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from inferop.paths import repo_root
from inferop_devtools.bench.serving import onnxruntime_images_per_second

BATCH = 8
THREADS = 2


def session(path: Path, profile_prefix: Path | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    if profile_prefix is not None:  # ONNX Runtime writes its profile there, not in the working directory
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def profile_by_operator(path: Path, batches: int = 5) -> dict[str, float]:
    """Mean milliseconds per batch of BATCH spent in each operator type (ONNX Runtime's profiler, node events)."""
    run = session(path, profile_prefix=path.with_suffix(".profile"))
    images = np.random.default_rng(0).standard_normal((BATCH, 3, 299, 299)).astype(np.float32)
    run.run(None, {"images": images})  # warm-up, not counted below
    for _ in range(batches):
        run.run(None, {"images": images})
    events = json.loads(Path(run.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    first_counted = sorted(e["ts"] for e in runs)[1]  # skip the warm-up run
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= first_counted:
            totals[event["args"]["op_name"]] += event["dur"] / 1e3 / batches
    totals["(whole batch)"] = sum(e["dur"] for e in runs if e["ts"] >= first_counted) / 1e3 / batches
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def noise_sensitivity(path: Path, samples: int, std: float = 0.01) -> float:
    """Share of inputs whose top-1 class changes when noise of `std` (pixels have std 1) is added."""
    run = session(path)
    rng = np.random.default_rng(5)
    changed = 0
    for start in range(0, samples, BATCH):
        images = rng.standard_normal((min(BATCH, samples - start), 3, 299, 299)).astype(np.float32)
        noisy = images + rng.normal(0, std, images.shape).astype(np.float32)
        clean_top1 = np.argmax(run.run(None, {"images": images})[0], axis=-1)
        noisy_top1 = np.argmax(run.run(None, {"images": noisy})[0], axis=-1)
        changed += int(np.sum(clean_top1 != noisy_top1))
    return changed / samples


def variants(fp32: Path, work: Path) -> dict[str, Path]:
    import onnx

    from inferop_export.networks.inception_v3 import inception_v3
    from inferop_export.precision import average_pools_as_depthwise_convs, precision_inputs, quantize_int8
    from inferop_export.signature import read_signature

    source = inception_v3()
    signature = read_signature(onnx.load(str(fp32)), source.overrides)
    calibration = precision_inputs(source, signature, None, seed=3)[0]  # as export makes it
    paths = {"fp32": fp32}
    paths["int8"] = work / "int8.onnx"
    quantize_int8(fp32, paths["int8"], calibration, signature)
    paths["int8, pools kept"] = work / "int8-pools.onnx"
    quantize_int8(fp32, paths["int8, pools kept"], calibration, signature, pools_as_convs=False)
    model = onnx.load(str(fp32))
    rewritten = average_pools_as_depthwise_convs(model)
    paths["fp32, pools as convolutions"] = work / "fp32-convs.onnx"
    onnx.save_model(model, str(paths["fp32, pools as convolutions"]))
    print(f"{rewritten} average pools rewritten as depthwise convolutions", flush=True)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, default=repo_root() / "model_repo" / "inception_v3" / "1" / "model.onnx")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per model and round")
    parser.add_argument("--noise-samples", type=int, default=200)
    args = parser.parse_args()
    if not args.model.is_file():
        parser.error(f"--model {args.model}: no such file (export it: inferop export inception_v3 --repo model_repo)")
    figures: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "batch": BATCH, "intra_op_threads": THREADS}
    with tempfile.TemporaryDirectory(prefix="inferop-oneoff-int8-") as work:
        paths = variants(args.model, Path(work))
        rounds: dict[str, list[float]] = {name: [] for name in paths}
        for index in range(args.rounds):  # alternating: the machine's speed drifts within minutes
            for name, path in paths.items():
                rounds[name].append(round(onnxruntime_images_per_second(path, THREADS, 1, BATCH, args.seconds), 1))
                print(f"round {index + 1}: {name} {rounds[name][-1]} images/s", flush=True)
        figures["in_process_images_per_second"] = rounds
        figures["profile_ms_per_batch"] = {
            name: {op: round(ms, 1) for op, ms in profile_by_operator(paths[name]).items()}
            for name in ("int8", "int8, pools kept")
        }
    figures["fp32_top1_changed_by_1pct_noise"] = round(noise_sensitivity(args.model, args.noise_samples), 3)
    figures["noise_samples"] = args.noise_samples
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
