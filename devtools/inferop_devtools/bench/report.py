"""What `make bench` prints: the figures of each part, then every target with its outcome."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferop_devtools.bench.capacity import capacity_lines, capacity_targets
from inferop_devtools.bench.clients import clients_lines, clients_targets
from inferop_devtools.bench.operator import operator_targets
from inferop_devtools.bench.pipeline import pipeline_lines, pipeline_targets
from inferop_devtools.bench.serving import TUNED_CONCURRENCY, serving_targets
from inferop_devtools.bench.stall import stall_lines, stall_targets
from inferop_devtools.bench.targets import Target
from inferop_devtools.bench.tune import tune_targets

# Each part's targets, computed from its figures.
TARGETS: dict[str, Callable[[dict[str, Any]], list[Target]]] = {
    "serving": serving_targets,
    "tune": tune_targets,
    "operator": operator_targets,
    "clients": clients_targets,
    "stall": stall_targets,
    "capacity": capacity_targets,
    "pipeline": pipeline_targets,
}


def targets(results: dict[str, Any]) -> list[Target]:
    """Every target of the parts measured."""
    return [target for name, figures in results.items() if name in TARGETS for target in TARGETS[name](figures)]


def report_lines(results: dict[str, Any]) -> list[str]:
    """The figures of each part measured, as the report prints them; the targets follow (`targets`)."""
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
            f"  Triton / ONNX Runtime in-process, round by round: {by_round('onnxruntime')}",
            f"  Triton / fp32 ceiling, round by round: {by_round('ceiling')}",
        ]
        int8 = s["int8"]
        verdict = (
            "passes its gate" if int8["gate"]["passed"] else f"FAILS its gate: {'; '.join(int8['gate']['failures'])}"
        )
        lines += [
            f"  int8, Triton, batch 8 x 2 {int8['triton_batch8_images_per_s']:>7.2f} images/s  (fp32 "
            f"{int8['fp32_triton_batch8_images_per_s']:.2f} in alternation: medians of {len(int8['rounds']['int8'])})",
            "  int8 / fp32 through Triton, round by round: "
            + ", ".join(f"{i / f:.2f}" for f, i in zip(int8["rounds"]["fp32"], int8["rounds"]["int8"], strict=True)),
            f"  tuned for each by inferop tune, {TUNED_CONCURRENCY} x batch 8: fp32 {int8['tuned']['fp32']['config']} "
            f"{int8['tuned']['fp32']['median']:.2f}, int8 {int8['tuned']['int8']['config']} "
            f"{int8['tuned']['int8']['median']:.2f} images/s",
            "  int8 / fp32 through Triton, tuned, round by round: "
            + ", ".join(
                f"{i / f:.2f}"
                for f, i in zip(int8["tuned"]["fp32"]["rounds"], int8["tuned"]["int8"]["rounds"], strict=True)
            ),
            "  CPU int8 instructions: " + (", ".join(s["cpu_int8_instructions"]) or "none (no VNNI, no AMX)"),
            f"  {int8['gate']['summary']}; {verdict}",
            *trained_lines(s["trained_classifier_int8"]),
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
        ]
        if "best" in climb and "best" in sweep:
            lines.append(
                f"  climb / exhaustive best, as found: {climb['best_samples_per_s'] / sweep['best_samples_per_s']:.2f}"
            )
    if "operator" in results:
        o = results["operator"]
        lines += [
            "Operator (real kube-apiserver 1.20, operator as its own process):",
            f"  kubectl apply -> Deployment exists, p50 of {o['samples']}: {o['apply_to_deployment_p50_s']:.3f} s"
            f" (max {o['apply_to_deployment_max_s']:.3f} s)",
            f"  {o['services']} services applied at once, converged in {o['converge_s']:.1f} s",
            f"  operator peak resident memory (VmHWM): {o['operator_peak_rss_mb']:.0f} MiB",
        ]
    if "clients" in results:
        lines += clients_lines(results["clients"])
    if "stall" in results:
        lines += stall_lines(results["stall"])
    if "capacity" in results:
        lines += capacity_lines(results["capacity"])
    if "pipeline" in results:
        lines += pipeline_lines(results["pipeline"])
    return lines


def trained_lines(trained: dict[str, Any]) -> list[str]:
    """The classifier trained here, int8 on its own data: accuracy and speed beside fp32's."""
    accuracy = trained["gate"]["accuracy"] or {}
    return [
        f"  a classifier trained here ({trained['parameters']:,} parameters), int8 on its own data: accuracy "
        + ", ".join(f"{name} {share:.2%}" for name, share in accuracy.items())
        + f"; gate {'passed' if trained['gate']['passed'] else 'FAILED: ' + '; '.join(trained['gate']['failures'])}",
        f"    through Triton, batch 8 x 2: int8 {trained['triton_images_per_s']:.0f}, fp32 "
        f"{trained['fp32_triton_images_per_s']:.0f} images/s (medians of {len(trained['rounds']['int8'])} alternating "
        "rounds)",
    ]
