"""`make demo`: export every registered network and a model of your own, serve them with a real tritonserver,
call them, benchmark briefly.

Nothing here knows a network by name: the registry says what to export, and each served config says how a
caller makes its inputs. Everything it writes goes to model_repo/ (the models) and out/demo/ (manifests,
plots, summary).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from inferop import bench
from inferop.paths import repo_root
from inferop.serving.tritonserver import TritonServer, free_port
from inferop_core.cli import main as inferop
from inferop_core.threads import local_cpus
from inferop_export.networks import registered_networks
from inferop_operator.plancli import decide

ROOT = repo_root()
REPO = ROOT / "model_repo"
OUT = ROOT / "out" / "demo"
# A model of your own: a PyTorch factory with an FP32 and an INT64 input (export/examples/ranker.py).
OWN_MODEL = [
    "torch", "ranker:build", "--app-dir", str(ROOT / "export" / "examples"),
    "--input", "features=16", "--input", "category=1:INT64", "--output", "score",
]  # fmt: skip
BENCH_LEVELS, BENCH_SECONDS = [1, 4, 16], 3.0


def queue_bound_arithmetic(manifest: Path, bound: int) -> str:
    """How export derived the served queue bound: the operator's plan of the manifest on this machine's CPUs (what
    export renders the config for), or the bare number where the two differ."""
    verdict = decide(str(manifest), yaml.safe_load(manifest.read_text()), {"cpu": str(local_cpus())})
    if verdict.plan is None or verdict.spec is None or verdict.plan.queue.size != bound:
        return f"queue bound {bound}"
    return verdict.plan.queue.explain(verdict.spec.timeouts.request_seconds)


def bench_levels(model: str, bound: int | None, manifest: Path) -> list[int]:
    """BENCH_LEVELS, capped at the callers the served config admits: its queue bound (the batch in execution is the
    margin for callers that send again before the next batch leaves the queue). Beyond it a full queue answers at
    once with 503, the designed outcome of overload, which a demo of throughput and latency does not need."""
    if bound is None or bound >= max(BENCH_LEVELS):
        return BENCH_LEVELS
    arithmetic = queue_bound_arithmetic(manifest, bound)
    print(
        f"{model}: at most {bound} closed-loop callers, what its config admits ({arithmetic}); "
        f"more would be rejected at once by the full queue, by design (`inferop bench --concurrency "
        f"{max(BENCH_LEVELS)}` shows them as rejected)"
    )
    return sorted({min(level, bound) for level in BENCH_LEVELS})


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def main() -> int:
    started = time.perf_counter()
    OUT.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict[str, Any]] = {}

    exports = {name: [name] for name in registered_networks()} | {"ranker": OWN_MODEL}
    manifests = {model: OUT / f"{model.replace('_', '-')}.yaml" for model in exports}
    for model, source in exports.items():
        step(f"export {' '.join(source[:2])}")
        if inferop(["export", *source, "--repo", str(REPO), "--manifest", str(manifests[model])]) != 0:
            return 1

    step("start tritonserver")
    with TritonServer(REPO, http_port=free_port()) as server:
        print(f"ready at http://{server.url}, metrics at {server.metrics_url}")
        for model in exports:
            step(f"infer {model} (inputs made as its config declares)")
            if inferop(["infer", "--url", server.url, "--model", model]) != 0:
                return 1

        # 16 callers keep the dynamic batcher's batches at maxBatchSize (8): one batch runs while the next waits, where
        # the queue bound admits them.
        for model in exports:
            step(f"bench {model}")
            levels = bench_levels(model, bench.served_queue_bound(server.url, model), manifests[model])
            results = bench.sweep(server.url, model, levels, BENCH_SECONDS, batch=1)
            print(bench.format_table(model, 1, results))
            plot = OUT / f"bench-{model}.png"
            bench.plot(model, results, plot)
            best = max(results, key=lambda r: r.throughput)
            summary[model] = {
                "best_throughput": round(best.throughput, 1),
                "at_concurrency": best.concurrency,
                "p99_ms": round(best.p99_ms, 1),
                "mean_batch": round(best.mean_batch, 1),
                "rejected": sum(r.rejected for r in results),
                "errors": sum(r.errors for r in results),
                "plot": str(plot.relative_to(ROOT)),
            }
    step("summary")
    elapsed = time.perf_counter() - started
    for model, figures in summary.items():
        print(
            f"{model:<13} {figures['best_throughput']:>8} samples/s at concurrency {figures['at_concurrency']} "
            f"(batches of {figures['mean_batch']}), p99 {figures['p99_ms']} ms, errors {figures['errors']}"
            + (f", rejected by the full queue as designed {figures['rejected']}" if figures["rejected"] else "")
            + ", "
            f"plot {figures['plot']}"
        )
    print(f"manifests: {', '.join(str(p.relative_to(ROOT)) for p in sorted(OUT.glob('*.yaml')))}")
    print(f"demo finished in {elapsed:.0f} s; tritonserver stopped")
    (OUT / "summary.json").write_text(json.dumps({**summary, "seconds": round(elapsed, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
