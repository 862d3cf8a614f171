"""The field drills' report: out/field/report.md and a plot per drill."""

from __future__ import annotations

import os
import time
from typing import Any

from inferop_core.quantity import format_bytes
from inferop_devtools.field.hang import ABLATION as HANG_ABLATION
from inferop_devtools.field.hang import RUNS as HANG_RUNS
from inferop_devtools.field.memory import LIMIT_OVER_PEAK_BOUND
from inferop_devtools.field.pods import OUT, MiB, verdict
from inferop_devtools.field.threads import LOADS, POLICIES


def plot_drill(name: str, drill: dict[str, Any]) -> str | None:
    """A PNG of what the drill's table says (overload's timelines are drawn per run); returns its file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    if name == "threads":
        networks = [network for network, _, _ in LOADS]
        bars = [
            (network, label, policy) for network in networks for label in ("naive", "inferop") for policy in POLICIES
        ]
        base = {n: drill[n]["rows"]["naive/normal"]["throughput"] for n in networks}
        axis.bar(
            [f"{n}\n{label}\n{'BATCH' if p == 'batch' else 'OTHER'}" for n, label, p in bars],
            [drill[n]["rows"][f"{label}/{p}"]["throughput"] / base[n] for n, label, p in bars],
            color=["grey", "darkgrey", "tab:blue", "tab:cyan"] * len(networks),
        )
        axis.tick_params(axis="x", labelsize="x-small")
        axis.set_ylabel("throughput, naive under SCHED_OTHER = 1")
        axis.set_title("4 copies with default threads against the plan, each under both policies, 1-CPU pod")
    elif name == "memory":
        for key, marker, label in (("fitted", "o", "fitted on"), ("held_out", "s", "held out")):
            rows = drill[key]
            axis.scatter(
                [row["measured_bytes"] / MiB for row in rows], [row["estimate_bytes"] / MiB for row in rows],
                marker=marker, label=label,
            )  # fmt: skip
        top = max(row["measured_bytes"] for row in (*drill["fitted"], *drill["held_out"])) / MiB * 1.1
        axis.plot([0, top], [0, top], color="black", linewidth=0.8, label="estimate = measured")
        low, high = 1 / drill["margin"], LIMIT_OVER_PEAK_BOUND / drill["margin"]
        axis.fill_between(
            [0, top], [0, low * top], [0, high * top], color="grey", alpha=0.2,
            label=f"limit (x {drill['margin']}) covers the peak, at most {LIMIT_OVER_PEAK_BOUND:g}x",
        )  # fmt: skip
        axis.set_xlabel("measured peak (MiB)")
        axis.set_ylabel("estimate (MiB)")
        axis.set_title("memory model against the cgroup's measured peak")
    elif name == "hang":
        for label in [label for label in HANG_RUNS if label in drill]:
            rows = [row for row in drill[label]["metrics"] if not row.get("down")]
            axis.plot(
                [r["t"] for r in rows],
                [r["nv_inference_pending_request_count"] for r in rows],
                label=f"{label}: pending",
            )
        healthy = drill["stall"]["healthy"]
        axis.axvline(healthy, color="red", linestyle=":", label="stall begins")
        for restart in drill["inferop"]["restarts"]:
            axis.axvline(healthy + restart["stopped_after_seconds"], color="black", linestyle="--", label="restarted")
        axis.set_xlabel("seconds")
        axis.set_ylabel("requests pending in Triton")
        axis.set_title("a stalled model: pending requests, and the liveness probe's restart")
    else:
        plt.close(figure)
        return None
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(OUT / f"{name}.png", dpi=110)
    plt.close(figure)
    return f"{name}.png"


def ms(values: dict[str, float], key: str) -> str:
    return f"{values[key]:.0f}" if key in values else "none"


def goal_lines(goals: list[dict[str, Any]]) -> list[str]:
    return ["", *[f"- {verdict(g['met'])}: {g['text']}" for g in goals]]


def threads_section(drill: dict[str, Any]) -> list[str]:
    lines = ["", "## a. threads (field report 000)", ""]
    lines.append(
        f"On {drill['where']}, each row a pod with a CPU limit of 1 held to the server's CPU, its callers in the "
        "node's network on the other: inferop under SCHED_BATCH is the operator's pod for the InferenceService, the "
        "others Deployments of the same image by hand."
    )
    lines += [
        "",
        "| network | deployment | policy | config | samples/s | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for network, _, _ in LOADS:
        row = drill[network]
        for key, r in row["rows"].items():
            label, policy = key.split("/")
            name = "SCHED_BATCH" if policy == "batch" else "SCHED_OTHER"
            lines.append(
                f"| {network} | {label} | {name} | {r['config']} | {r['throughput']:.1f} | {r['p99_ms']:.0f} | "
                f"{r['errors']} |"
            )
        threads, batch = row["threads_ratio"], row["sched_batch_ratio"]
        lines.append(
            f"| {network} | threads' share (plan / naive, same policy) | | SCHED_OTHER {threads['normal']:.2f}x, "
            f"SCHED_BATCH {threads['batch']:.2f}x | | | |"
        )
        lines.append(
            f"| {network} | SCHED_BATCH's share (same deployment) | | naive {batch['naive']:.2f}x, inferop "
            f"{batch['inferop']:.2f}x | | | |"
        )
    lines += ["", f"Operator on the naive spec (4 instances, 1 CPU): `{drill[LOADS[0][0]]['refusal']}`"]
    return lines + goal_lines(drill["goals"])


def share(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def overload_section(drill: dict[str, Any]) -> list[str]:
    lines = ["", "## b. overload (field report 001)", ""]
    lines.append(
        f"On {drill['where']}. Inception V3 at each CPU quota; the queue bound's served share "
        f"({drill['served_share_of_capacity']:g}) was fitted on earlier runs (inferop_core.capacity): this run is "
        "held out. "
        "Capacity in the run: the pod's own figures over its arrivals, the rate of its full batches (Triton's "
        "statistics per batch size) with the CPU share its model lost to the rest of the pod against a closed-loop "
        "window given back (procfs); answered: samples answered in time a second, first arrival to last answer. The "
        "goal is judged on these. Capacity around: closed-loop windows on the same server just before and after, "
        "shown for comparison and not judged (two such windows differ by up to 20% on a 2 GHz Xeon). Served share: "
        "goodput / export's capacity for the quota, what the bound was derived from."
    )
    for quota in drill["quotas"]:
        a = quota["admission"]
        probe = quota["liveness_probe"]
        lines += [
            "",
            f"### {quota['cpus']:g} CPU: {quota['limits']}",
            "",
            f"Export's capacity {quota['exported_capacity']:.2f} img/s, measured {quota['capacity']:.2f}; timeout "
            f"{quota['timeout_seconds']:g} s; derived queue bound {quota['queue_bound']}, the gateway admits "
            f"{quota['gateway_admits']}; liveness probe every "
            f"{probe['periodSeconds']} s, threshold {probe['failureThreshold']}. Admission: {a['callers']} "
            f"closed-loop callers, {a['rejected']} of {a['calls']} calls rejected, p99 {a['p99_ms']:.0f} ms, "
            f"{a['throughput']:.2f} img/s.",
            "",
            "| deployment | offered | capacity in the run | answered | full batches | model's CPU share | capacity "
            "around | goodput | served share | ok p99 ms | ok max ms | rejected | reject p99 ms | client timeouts | "
            "unfinished | peak memory | OOM kills | liveness failures | plot |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for run in quota["runs"]:
            r, u = run["result"], run["usage"]
            around, in_run, served = run["capacity_around"], run["capacity_in_run"], run["answered_rate"]
            work, reference = run["work"] or {}, run["work_at_capacity"] or {}
            ratio = "" if around is None else f" ({r['goodput'] / around:.2f})"
            answered = "" if served is None else f"{served:.2f}" + ("" if not in_run else f" ({served / in_run:.2f})")
            full = share(work.get("full_batch_share"))
            cpu_share = share(work.get("model_cpu_share"))
            if reference.get("model_cpu_share") is not None:
                cpu_share += f" ({share(reference['model_cpu_share'])} at capacity)"
            probe_runs = run["liveness"]
            failures = "" if probe_runs is None else f"{probe_runs['failures']} of {probe_runs['runs']}"
            lines.append(
                f"| {run['deployment']} | {run['factor']:g}x | {'' if in_run is None else f'{in_run:.2f}'} | "
                f"{answered} | {full} | {cpu_share} | {'' if around is None else f'{around:.2f}'} | "
                f"{r['goodput']:.2f}{ratio} | {run['served_share_of_export']:.2f} | {ms(r['latency_ms'], 'p99')} | "
                f"{ms(r['latency_ms'], 'max')} | {r['rejected'] + r['timed_out']} | {ms(r['reject_ms'], 'p99')} | "
                f"{r['client_timeout']} | {r['unfinished']} | {format_bytes(float(u['memory_peak_bytes']))} | "
                f"{u['oom_kills']} | {failures} | ![]({run['plot']}) |"
            )
        if quota["ablation_goals"]:
            lines += ["", f"The same goals for the ablation at {quota['cpus']:g} CPU (the pod called directly):"]
            lines += goal_lines([{"text": text, "met": met} for text, met in quota["ablation_goals"]])
    return lines + goal_lines(drill["goals"])


def memory_section(drill: dict[str, Any]) -> list[str]:
    lines = ["", "## c. memory (field reports 001, 003)", ""]
    lines.append(
        "Estimates from the constants in core/inferop_core/memory.py (LOCAL_RUNTIME), fitted on the first table's "
        "models; the second table is held out (shapes and batches the fit never saw). Each point served at the derived "
        f"queue bound, measured idle and saturated. `limit`: the estimate x {drill['margin']} (plan.MEMORY_MARGIN) in "
        "whole MiB, over the measured peak. `refit`: the constants fitted again on this run's fit set."
    )
    for key, title in (("fitted", "Fit set"), ("held_out", "Held out")):
        lines += [
            "",
            f"{title}:",
            "",
            "| model | inputs | instances | maxBatchSize | queue bound | state | measured | estimate | error | "
            "limit / peak | refit error |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in drill[key]:
            point = (
                f"| {row['network']} | {row['inputs']} | {row['instances']} | {row['max_batch_size']} | "
                f"{row['queue_bound']} | {row['state']} | "
            )
            lines.append(
                point
                + (
                    f"{format_bytes(row['measured_bytes'])} | {format_bytes(row['estimate_bytes'])} | "
                    f"{row['error']:+.1%} | {row['limit_over_peak']:.2f} | {row['refit_error']:+.1%} |"
                    if row.get("reached", True)
                    else f"queue never filled | {format_bytes(row['estimate_bytes'])} | not judged | | |"
                )
            )
    worst_fit, worst_held = drill["worst_error_fitted"], drill["worst_error_held_out"]
    low, high = drill["limit_over_peak_held_out"] or (float("nan"), float("nan"))
    lines += [
        "",
        f"Worst error: held out {worst_held:.1%} (refit {drill['worst_refit_error_held_out']:.1%}); on the fit set "
        f"{worst_fit:.1%}. The fit set needs a margin of {drill['margin_needed_fitted']} (plan.MEMORY_MARGIN: "
        f"{drill['margin']}); held out, the limit is {low:.2f}x .. {high:.2f}x the peak. Refit constants: "
        f"`{drill['refit']}`.",
    ]
    oom = drill["oom"]
    lines += [
        "",
        f"OOM: the old estimate {format_bytes(oom['old_estimate'])}; a limit of {format_bytes(oom['old_limit'])} "
        f"(twice it) under the operator now: `{oom['refusal']}`. One change per run, all under SCHED_BATCH:",
        "",
        "| limit | queue bound | memory pattern | survived saturation | peak | OOM kills |",
        "|---|---|---|---|---|---|",
    ]
    for run in oom["runs"]:
        usage = run.get("usage", {})
        peak = usage.get("memory_peak_bytes")
        lines.append(
            f"| {format_bytes(run['limit'])} ({run['limit_label']}) | {run['queue_bound']} | "
            f"{'on' if run['memory_pattern'] else 'off'} | {run['survived']} | "
            f"{format_bytes(float(peak)) if peak else run.get('error', '')[:60]} | {usage.get('oom_kills', '')} |"
        )
    return lines + goal_lines([drill["goal"]])


def hang_section(drill: dict[str, Any]) -> list[str]:
    probe, plain = drill["liveness_probe"], drill["naive_liveness_probe"]
    lines = ["", "## d. hang (field report 004)", ""]
    lines.append(
        f"On {drill['where']}, both pods on one CPU with the same limits: {drill['stall']['rate']:g} req/s from the "
        f"node's network with no client timeout, the same alert rules ({drill['rules']}), every execution blocked "
        f"from {drill['stall']['healthy']:g} s on. The naive Deployment is NVIDIA's example: its liveness probe a "
        f"GET of {plain['httpGet']['path']} every {plain['periodSeconds']} s. inferop's pod runs the rendered exec "
        f"probe (every {probe['periodSeconds']} s, threshold {probe['failureThreshold']}, timeout "
        f"{probe['timeoutSeconds']} s), grace {drill['grace_seconds']} s, tritonserver "
        f"{' '.join(drill['exit_timeout_args'])}. The kubelet runs both."
    )
    lines += [
        "",
        "| deployment | outcome | kubelet | alerts fired (s after the stall) | in the stalled execution |",
        "|---|---|---|---|---|",
    ]
    for label in [label for label in HANG_RUNS if label in drill]:
        run = drill[label]
        r = run["result"]
        batch = run["in_flight_at_stall"]["batch"]
        restarts = "; ".join(
            f"old container gone {x['stopped_after_seconds']} s after the stall ({x['exit_reason']}), Ready again at "
            f"{x['ready_after_seconds']} s"
            for x in run["restarts"]
        )
        kubelet = ", ".join(f"{reason} x{count}" for reason, count in run["kubelet_events"].items()) or "no event"
        lines.append(
            f"| {label} | ok {r['ok']}, 503 {r['rejected'] + r['timed_out']} (503 max "
            f"{ms(r['server_timeout_ms'], 'max')} ms), failed {r['failed']}, unfinished {r['unfinished']}; serving "
            f"again {run['serving_again_after_seconds']} s after the stall | restarts {run['restart_count']}"
            f"{': ' + restarts if restarts else ''}; {kubelet} | {run['alerts_fired_after_seconds'] or 'none'} | "
            f"{batch['count']} callers: {batch['kinds']}, ended {batch.get('ended_after_seconds')} s after the stall |"
        )
    if drill.get("ablation_goals"):
        lines += ["", f"inferop's goals on the ablation ({HANG_ABLATION}, the operator's Deployment without it):"]
        lines += goal_lines(drill["ablation_goals"])
    return lines + goal_lines(drill["goals"])


SECTIONS = {"threads": threads_section, "overload": overload_section, "memory": memory_section, "hang": hang_section}


def report(results: dict[str, Any], seconds: float) -> str:
    lines = [
        "# Field drills",
        "",
        f"`make field`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {seconds / 60:.0f} min. "
        "Every pod runs on the local cluster's node under the kubelet, held to the last CPU; the load generator "
        "runs on the others, in the node's network.",
        "",
        "| drill | goal | result |",
        "|---|---|---|",
    ]
    for name, drill in results.items():
        lines.append(f"| {name} | {drill['goal']['text']} | {verdict(drill['goal']['met'])} |")
    lines += ["", *[f"![{name}]({drill['plot']})" for name, drill in results.items() if drill.get("plot")]]
    for name, section in SECTIONS.items():
        if name in results:
            lines += section(results[name])
    return "\n".join(lines) + "\n"
