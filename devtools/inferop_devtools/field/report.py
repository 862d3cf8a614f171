"""The field drills' report: out/field/report.md and a plot per drill."""

from __future__ import annotations

import os
import time
from typing import Any

from inferop.quantity import format_bytes
from inferop_devtools.field.pods import NETWORKS, OUT, MiB, verdict


def plot_drill(name: str, drill: dict[str, Any]) -> str | None:
    """A PNG of what the drill's table says (overload's timelines are drawn per run); returns its file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    if name == "threads":
        labels = [f"{network}\n{label}" for network in NETWORKS for label in ("naive", "inferop")]
        ratios = [
            drill[n][label]["throughput"] / drill[n]["naive"]["throughput"]
            for n in NETWORKS
            for label in ("naive", "inferop")
        ]
        axis.bar(labels, ratios, color=["grey", "tab:blue"] * len(NETWORKS))
        axis.set_ylabel("throughput, naive = 1")
        axis.set_title("4 copies with default threads against the operator's plan, 1-CPU pod")
    elif name == "memory":
        for state, marker in (("idle", "o"), ("saturated", "s")):
            rows = [row for row in drill["grid"] if row["state"] == state]
            axis.scatter(
                [row["measured_bytes"] / MiB for row in rows], [row["estimate_bytes"] / MiB for row in rows],
                marker=marker, label=state,
            )  # fmt: skip
        top = max(row["measured_bytes"] for row in drill["grid"]) / MiB * 1.1
        axis.plot([0, top], [0, top], color="black", linewidth=0.8, label="estimate = measured")
        axis.fill_between([0, top], [0, 0.75 * top], [0, 1.25 * top], color="grey", alpha=0.2, label="+-25%")
        axis.set_xlabel("measured peak (MiB)")
        axis.set_ylabel("estimate (MiB)")
        axis.set_title("memory model against the cgroup's measured peak")
    elif name == "hang":
        healthy = drill["stall"]["healthy"]
        for label in ("naive", "inferop"):
            rows = drill[label]["metrics"]
            axis.plot(
                [r["t"] for r in rows],
                [r["nv_inference_pending_request_count"] for r in rows],
                label=f"{label}: pending",
            )
        fired = drill["inferop"]["alert_fired_after_seconds"]
        axis.axvline(healthy, color="red", linestyle=":", label="stall begins")
        if fired is not None:
            axis.axvline(healthy + fired, color="black", linestyle="--", label="InferopQueueStalled fires")
        axis.set_xlabel("seconds")
        axis.set_ylabel("requests pending in Triton")
        axis.set_title("a stalled model: pending requests, and the alert")
    else:
        plt.close(figure)
        return None
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(OUT / f"{name}.png", dpi=110)
    plt.close(figure)
    return f"{name}.png"


def report(results: dict[str, Any], seconds: float) -> str:
    lines = [
        "# Field drills",
        "",
        f"`make field`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {seconds / 60:.0f} min. "
        "The server runs in a pod-sized cgroup on the last CPU, the load generator on the others.",
        "",
        "| drill | goal | result |",
        "|---|---|---|",
    ]
    for name, drill in results.items():
        lines.append(f"| {name} | {drill['goal']['text']} | {verdict(drill['goal']['met'])} |")
    lines += ["", *[f"![{name}]({drill['plot']})" for name, drill in results.items() if drill.get("plot")]]
    if "threads" in results:
        lines += ["", "## a. threads (field report 000)", "", "| network | deployment | config | samples/s | p99 ms |"]
        lines.append("|---|---|---|---|---|")
        for network in NETWORKS:
            row = results["threads"][network]
            for label in ("naive", "inferop"):
                r = row[label]
                lines.append(f"| {network} | {label} | {r['config']} | {r['throughput']:.1f} | {r['p99_ms']:.0f} |")
            lines.append(f"| {network} | ratio | | {row['throughput_ratio']:.2f}x | |")
        lines += ["", f"Operator on the naive spec (4 instances, 1 CPU): `{results['threads']['conv_net']['refusal']}`"]
    if "overload" in results:
        o = results["overload"]
        lines += [
            "",
            "## b. overload (field report 001)",
            "",
            f"Inception V3, {o['limits']}; capacity {o['capacity']:.2f} img/s ({o['capacity_callers']} closed-loop "
            "callers, so batches are full as under overload), which sets the offered rates; each inferop run "
            "measures it again on its own server for 20 s just before and just after its arrivals (capacity "
            "around: their mean); "
            f"timeout {o['timeout_seconds']:g} s; derived queue bound {o['queue_bound']}.",
            "",
            "| deployment | offered | capacity around | goodput | ok p99 ms | ok max ms | rejected | reject p99 ms | "
            "client timeouts | unfinished | peak memory | OOM kills | plot |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for run in o["runs"]:
            r, u = run["result"], run["usage"]
            around = run["capacity_around"]
            ratio = "" if around is None else f" ({r['goodput'] / around:.2f})"
            lines.append(
                f"| {run['deployment']} | {run['factor']:g}x | {'' if around is None else f'{around:.2f}'} | "
                f"{r['goodput']:.2f}{ratio} | "
                f"{r['latency_ms'].get('p99', float('nan')):.0f} | {r['latency_ms'].get('max', float('nan')):.0f} | "
                f"{r['rejected'] + r['timed_out']} | {r['reject_ms'].get('p99', float('nan')):.1f} | "
                f"{r['client_timeout']} | {r['unfinished']} | {format_bytes(float(u['memory_peak_bytes']))} | "
                f"{u['oom_kills']} | ![]({run['plot']}) |"
            )
        lines += ["", *[f"- {verdict(g['met'])}: {g['text']}" for g in o["goals"]]]
    if "memory" in results:
        m = results["memory"]
        lines += ["", "## c. memory (field reports 001, 003)", "", "| network | instances | maxBatchSize | state | "]
        lines[-1] += "measured | estimate | error |"
        lines.append("|---|---|---|---|---|---|---|")
        for row in m["grid"]:
            lines.append(
                f"| {row['network']} | {row['instances']} | {row['max_batch_size']} | {row['state']} | "
                f"{format_bytes(row['measured_bytes'])} | {format_bytes(row['estimate_bytes'])} | {row['error']:+.1%} |"
            )
        oom = m["oom"]
        lines += [
            "",
            f"Worst error {m['worst_error']:.1%}. Old estimate {format_bytes(oom['old_estimate'])}; a limit of "
            f"{format_bytes(oom['old_limit'])} (twice it) under the operator now: `{oom['refusal']}`",
            "",
        ]
        for label, run in oom["runs"].items():
            peak = run.get("usage", {}).get("memory_peak_bytes")
            lines.append(
                f"- {label}: limit {format_bytes(run['limit'])}, survived saturation: {run['survived']}"
                + (f", peak {format_bytes(float(peak))}, OOM kills {run['usage']['oom_kills']}" if peak else "")
            )
    if "hang" in results:
        h = results["hang"]
        lines += ["", "## d. hang (field report 004)", "", "| deployment | callers | outcome |", "|---|---|---|"]
        for label in ("naive", "inferop"):
            r = h[label]["result"]
            lines.append(
                f"| {label} | timeout {h[label]['caller_timeout']} | ok {r['ok']}, unfinished {r['unfinished']}, "
                f"503 {r['rejected'] + r['timed_out']}, client timeouts {r['client_timeout']}, alert after stall: "
                f"{h[label]['alert_fired_after_seconds']} s |"
            )
        lines += ["", *[f"- {verdict(g['met'])}: {g['text']}" for g in h["goals"]]]
    return "\n".join(lines) + "\n"
