"""Drill d, field report 004: a model that stops answering."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferop.openloop import OpenLoopResult, run_open_loop
from inferop.scheduling import DEFAULT_CPU_SCHEDULING, CpuScheduling
from inferop.tritonconfig import ServingConfig
from inferop_devtools.field.pods import NAIVE_SCHEDULING, Machine, describe, naive, one_request, planned, pod, pod_spec
from inferop_devtools.prometheus import Prometheus, chart_alert_rules
from inferop_operator.spec import parse_spec

STALL_SERIES = ("nv_inference_pending_request_count", "nv_inference_request_success")


@dataclass(frozen=True)
class Stall:
    """One stalled run: traffic at `rate`, healthy for `healthy` seconds, then every execution blocks."""

    network: str = "conv_net"
    rate: float = 20.0
    healthy: float = 10.0
    stalled: float = 30.0


def stalled_run(
    serving: ServingConfig,
    policy: CpuScheduling,
    caller_timeout: float | None,
    rules: dict[str, Any] | None,
    stall: Stall,
    machine: Machine,
    drain: float,
) -> dict[str, Any]:
    """Load, then the stall, with Triton's metrics read every second and, given rules, a real Prometheus
    evaluating them; returns what the callers saw, the metrics and when the stall alert fired."""
    stall_file = Path(tempfile.mkdtemp(prefix="inferop-stall-")) / "stall"
    outcome: dict[str, OpenLoopResult] = {}
    with (
        pod(serving, machine.limits(cpus=1), {"INFEROP_FAULT_STALL_FILE": str(stall_file)}, policy) as server,
        contextlib.ExitStack() as stack,
    ):
        targets = [f"127.0.0.1:{server.metrics_port}"]
        prometheus = stack.enter_context(Prometheus(targets, rule_files=[rules])) if rules else None

        def load() -> None:
            outcome["result"] = run_open_loop(
                server.url,
                stall.network,
                one_request(serving),
                stall.rate,
                stall.healthy + stall.stalled,
                timeout=caller_timeout,
                client_cpus=machine.client_cpus,
                drain=drain,
            )

        loader = threading.Thread(target=load)
        started = time.monotonic()
        loader.start()
        series, fired_after, server_exit = [], None, None
        while loader.is_alive():
            now = time.monotonic() - started
            if now >= stall.healthy and not stall_file.exists():
                stall_file.touch()
            try:
                series.append({"t": round(now, 2), **server.metrics(stall.network, *STALL_SERIES)})
            except OSError:  # the server is gone: say how, rather than lose the drill
                if server.process is not None and server.process.poll() is not None:
                    server_exit = server.exit_reason()
            if prometheus is not None and fired_after is None and stall_file.exists():
                alerts = prometheus.alerts()
                if any(a.name == "InferopQueueStalled" and a.state == "firing" for a in alerts):
                    fired_after = round(now - stall.healthy, 2)
            time.sleep(1.0)
        loader.join()
        stall_file.unlink(missing_ok=True)
    after = [row for row in series if row["t"] >= stall.healthy + 2]
    return {
        "config": describe(serving, policy),
        "caller_timeout": caller_timeout,
        "result": outcome["result"].as_dict(),
        "metrics": series,
        "pending_rose": any(row["nv_inference_pending_request_count"] > 0 for row in after),
        "success_flat": len(after) > 1
        and after[-1]["nv_inference_request_success"] == after[0]["nv_inference_request_success"],
        "alert_fired_after_seconds": fired_after,
        "server_exit": server_exit,
    }


def drill_hang(machine: Machine) -> dict[str, Any]:
    """Field report 004: a model that stops answering. Naive callers wait for ever and nothing reports it;
    inferop's get 503 or their timeout, the metrics show the stall and a real Prometheus fires the alert."""
    stall = Stall()
    raw = pod_spec(stall.network, cpus=1)
    request_seconds = parse_spec(raw).timeouts.request_seconds  # the default: Triton checks it every ~0.5 s
    ours = planned(raw)
    scrape, window, hold = 1.0, 4.0, 5.0
    rule_values = {"monitoring.interval": f"{scrape:g}s", "monitoring.scrapeTimeout": f"{scrape:g}s"}
    rule_values |= {"monitoring.rules.rateWindow": f"{window:g}s", "monitoring.rules.stalledFor": f"{hold:g}s"}
    rules = chart_alert_rules(rule_values)
    drain = request_seconds * 1.5
    results: dict[str, Any] = {"request_seconds": request_seconds, "stall": asdict(stall), "rules": rule_values}
    results["naive"] = stalled_run(naive(ours), NAIVE_SCHEDULING, None, None, stall, machine, drain)
    results["inferop"] = stalled_run(ours, DEFAULT_CPU_SCHEDULING, request_seconds, rules, stall, machine, drain)
    for label in ("naive", "inferop"):
        r = results[label]["result"]
        print(
            f"  hang/{label}: unfinished {r['unfinished']}, 503 {r['rejected'] + r['timed_out']}, "
            f"client timeouts {r['client_timeout']}, alert after {results[label]['alert_fired_after_seconds']} s"
        )
    ours_result = results["inferop"]["result"]
    answer_ms = [ours_result[key].get("max", 0.0) for key in ("server_timeout_ms", "reject_ms")]
    failures_bounded = ours_result["unfinished"] == 0 and max(answer_ms) <= request_seconds * 1.1e3
    # The condition needs a whole rate window without a success, then holds for `for:`.
    deadline = window + hold + 2 * scrape
    fired = results["inferop"]["alert_fired_after_seconds"]
    goals = [
        ("naive callers still waiting when the drill stops", results["naive"]["result"]["unfinished"] > 0),
        ("inferop callers answered (503 or timeout) within requestSeconds + 10%", failures_bounded),
        (
            "metrics show the stall (pending above 0, success flat)",
            results["inferop"]["pending_rose"] and results["inferop"]["success_flat"],
        ),
        (
            f"InferopQueueStalled fires within rateWindow + for + 2 scrapes ({deadline:g} s)",
            fired is not None and fired <= deadline,
        ),
    ]
    results["goals"] = [{"text": text, "met": met} for text, met in goals]
    results["goal"] = {"text": "all hang goals", "met": all(met for _, met in goals)}
    return results
