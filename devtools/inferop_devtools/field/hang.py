"""Drill d, field report 004: a model that stops answering.

Both deployments get the same callers (no client timeout: whatever ends a wait is the server's doing), the same
alert rules in a real Prometheus, and the same fault: from `healthy` seconds on, every execution blocks. inferop's
pod also gets the liveness probe the operator renders, run as a kubelet runs it: its restart ends the hang (the
fault lived in the process), as a restart ends a real deadlock.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferop.openloop import OpenLoopResult, Outcome, run_open_loop
from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING, CpuScheduling
from inferop_core.tritonconfig import ServingConfig
from inferop_devtools.field.kubelet import LivenessProber
from inferop_devtools.field.pods import (
    NAIVE_SCHEDULING,
    Machine,
    Rendered,
    at_most,
    describe,
    naive,
    one_request,
    planned,
    pod,
    pod_spec,
    rendered,
)
from inferop_devtools.prometheus import Prometheus, chart_alert_rules
from inferop_operator.spec import parse_spec

STALL_SERIES = ("nv_inference_pending_request_count", "nv_inference_request_success")
STALL_ALERT = "InferopQueueStalled"


@dataclass(frozen=True)
class Stall:
    """One stalled run: arrivals at `rate` for `healthy + stalled` seconds; from `healthy` on every execution
    blocks (until a restart, for a pod that gets one)."""

    network: str = "conv_net"
    rate: float = 20.0
    healthy: float = 10.0
    stalled: float = 50.0


def callers_in_flight(result: OpenLoopResult, moment: float | None, since: float) -> dict[str, Any]:
    """What the callers waiting at `moment` (the stalled execution began) got, and when, in seconds after
    `since`; the batch inside the execution is the ones that Triton's queue timeout did not answer."""
    if moment is None:
        return {"count": 0, "kinds": {}, "batch": {"count": 0, "kinds": {}}}

    def summary(outcomes: list[Outcome]) -> dict[str, Any]:
        ends = [result.started_at + o.finished_at - since for o in outcomes]
        return {
            "count": len(outcomes),
            "kinds": dict(Counter(o.kind for o in outcomes)),
            "ended_after_seconds": [round(min(ends), 2), round(max(ends), 2)] if ends else None,
        }

    waiting = result.in_flight_at(moment)
    return {**summary(waiting), "batch": summary([o for o in waiting if o.kind != "timed_out"])}


def stalled_run(
    serving: ServingConfig,
    policy: CpuScheduling,
    kubelet: Rendered | None,
    rules: dict[str, Any],
    stall: Stall,
    machine: Machine,
    drain: float,
) -> dict[str, Any]:
    """Load, then the stall, with Triton's metrics read every second and a real Prometheus evaluating `rules`;
    with `kubelet`, its liveness probe run against the server, restarting it as a kubelet would."""
    work = Path(tempfile.mkdtemp(prefix="inferop-stall-"))
    stall_file = work / "stall"
    held_file = Path(f"{stall_file}.held")
    events: dict[str, float] = {}
    outcome: dict[str, OpenLoopResult] = {}
    prober: LivenessProber | None = None
    with (
        pod(
            serving,
            machine.limits(cpus=1),
            {"INFEROP_FAULT_STALL_FILE": str(stall_file)},
            policy,
            extra_args=kubelet.exit_timeout_args if kubelet else None,
        ) as server,
        contextlib.ExitStack() as stack,
    ):
        prometheus = stack.enter_context(Prometheus([f"127.0.0.1:{server.metrics_port}"], rule_files=[rules]))
        if kubelet is not None:

            def clear_fault() -> None:  # the hang lived in the process that was just stopped
                stall_file.unlink(missing_ok=True)
                held_file.unlink(missing_ok=True)

            prober = LivenessProber(server, kubelet.liveness_probe, work, kubelet.grace_seconds, on_restart=clear_fault)
            stack.enter_context(prober)

        def load() -> None:
            outcome["result"] = run_open_loop(
                server.url,
                stall.network,
                one_request(serving),
                stall.rate,
                stall.healthy + stall.stalled,
                timeout=None,  # both sides alike: only the server can end a wait
                client_cpus=machine.client_cpus,
                drain=drain,
            )

        def watch_held() -> None:  # when the stalled execution began, to 50 ms: its callers are those waiting then
            while "held" not in events and loader.is_alive():
                if held_file.exists():
                    events["held"] = time.monotonic()
                time.sleep(0.05)

        loader = threading.Thread(target=load)
        started = time.monotonic()
        loader.start()
        threading.Thread(target=watch_held, daemon=True).start()
        series: list[dict[str, Any]] = []
        fired: dict[str, float] = {}
        while loader.is_alive():
            now = time.monotonic()
            if now - started >= stall.healthy and "stall" not in events:
                stall_file.touch()
                events["stall"] = now
            try:
                series.append({"t": round(now - started, 2), **server.metrics(stall.network, *STALL_SERIES)})
            except OSError:  # restarting, or gone
                series.append({"t": round(now - started, 2), "down": True})
            if "stall" in events:
                for alert in prometheus.alerts():
                    if alert.state == "firing" and alert.name not in fired:
                        fired[alert.name] = round(now - events["stall"], 2)
            time.sleep(1.0)
        loader.join()
    stall_file.unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    result = outcome["result"]
    stalled_at = events["stall"]
    restarts = []
    if prober is not None:
        for restart in prober.restarts:
            restarts.append(
                {
                    "after_stall_seconds": round(prober.started + restart.at - stalled_at, 2),
                    "stopped_after_seconds": round(prober.started + restart.stopped_at - stalled_at, 2),
                    "ready_after_seconds": None
                    if restart.ready_at is None
                    else round(prober.started + restart.ready_at - stalled_at, 2),
                    "exit_reason": restart.exit_reason,
                }
            )
    first_restart = prober.started + prober.restarts[0].at if prober and prober.restarts else None
    served_again = [
        result.started_at + o.finished_at - stalled_at
        for o in result.outcomes
        if o.kind == "ok" and first_restart is not None and result.started_at + o.finished_at > first_restart
    ]
    # The stall as the metrics show it: from 2 s after it began until a restart (or the end).
    end = (first_restart or time.monotonic()) - started
    during = [row for row in series if not row.get("down") and stalled_at - started + 2 <= row["t"] < end]
    return {
        "config": describe(serving, policy),
        "caller_timeout": None,
        "result": result.as_dict(),
        "metrics": series,
        "pending_rose": any(row["nv_inference_pending_request_count"] > 0 for row in during),
        "success_flat": len(during) > 1
        and during[-1]["nv_inference_request_success"] == during[0]["nv_inference_request_success"],
        "alerts_fired_after_seconds": fired,
        "held_after_seconds": round(events["held"] - stalled_at, 2) if "held" in events else None,
        "in_flight_at_stall": callers_in_flight(result, events.get("held"), stalled_at),
        "liveness": prober.summary() if prober is not None else None,
        "restarts": restarts,
        "serving_again_after_seconds": round(min(served_again), 2) if served_again else None,
    }


def drill_hang(machine: Machine) -> dict[str, Any]:
    """Field report 004: a model that stops answering. The same callers (no client timeout), rules and fault on
    both sides: naive callers wait for ever; inferop's get Triton's 503 from the queue, and its liveness probe
    restarts the stalled server, which serves again."""
    stall = Stall()
    raw = pod_spec(stall.network, cpus=1)
    request_seconds = parse_spec(raw).timeouts.request_seconds  # the default: Triton checks it every ~0.5 s
    ours = planned(raw)
    kubelet = rendered(raw)
    scrape, window, hold = 1.0, 4.0, 5.0
    rule_values = {"monitoring.interval": f"{scrape:g}s", "monitoring.scrapeTimeout": f"{scrape:g}s"}
    rule_values |= {"monitoring.rules.rateWindow": f"{window:g}s", "monitoring.rules.stalledFor": f"{hold:g}s"}
    rules = chart_alert_rules(rule_values)
    # After the last arrival: long enough for the queue's timeout and a restart (grace, start) to end every wait.
    drain = request_seconds + kubelet.grace_seconds + 10
    probe = kubelet.liveness_probe
    results: dict[str, Any] = {
        "request_seconds": request_seconds,
        "stall": asdict(stall),
        "rules": rule_values,
        "liveness_probe": {k: v for k, v in probe.items() if k != "exec"},
        "grace_seconds": kubelet.grace_seconds,
        "exit_timeout_args": kubelet.exit_timeout_args,
    }
    results["naive"] = stalled_run(naive(ours), NAIVE_SCHEDULING, None, rules, stall, machine, drain)
    results["inferop"] = stalled_run(ours, DEFAULT_CPU_SCHEDULING, kubelet, rules, stall, machine, drain)
    for label in ("naive", "inferop"):
        run = results[label]
        r = run["result"]
        print(
            f"  hang/{label}: unfinished {r['unfinished']}, 503 {r['rejected'] + r['timed_out']}, failed "
            f"{r['failed']}, alerts {run['alerts_fired_after_seconds']}, restarts {run['restarts']}, serving again "
            f"after {run['serving_again_after_seconds']} s"
        )
    ours_run, naive_run = results["inferop"], results["naive"]
    ours_result = ours_run["result"]
    period, threshold = probe["periodSeconds"], probe["failureThreshold"]
    # The first failing run may see part of a period's executions; then `threshold` failures a period apart.
    restart_bound = (threshold + 1) * period + probe["timeoutSeconds"]
    restarts = ours_run["restarts"]
    in_batch = ours_run["in_flight_at_stall"]["batch"]
    deadline = window + hold + 2 * scrape  # a whole rate window without a success, then `for:`
    goals = [
        ("naive callers still waiting when the drill stops", naive_run["result"]["unfinished"] > 0),
        (
            "inferop: no caller left waiting, though no caller has a timeout",
            ours_result["unfinished"] == 0 and ours_result["client_timeout"] == 0,
        ),
        (
            "inferop: Triton's queue timeout answered queued callers 503 within requestSeconds + 10%",
            ours_result["timed_out"] > 0
            and at_most(ours_result["server_timeout_ms"].get("max"), request_seconds * 1.1e3),
        ),
        (
            "inferop: metrics show the stall before the restart (pending above 0, success flat)",
            ours_run["pending_rose"] and ours_run["success_flat"],
        ),
        (
            f"inferop: the liveness probe restarted the stalled server once, within {restart_bound:g} s "
            f"((failureThreshold + 1) x periodSeconds + timeoutSeconds)",
            len(restarts) == 1 and at_most(restarts[0]["after_stall_seconds"], restart_bound),
        ),
        (
            "inferop: the callers inside the stalled execution got an answer (the restart's)",
            in_batch["count"] > 0 and "unfinished" not in in_batch["kinds"],
        ),
        (
            "inferop: serving again after the restart",
            ours_run["serving_again_after_seconds"] is not None,
        ),
        (
            f"naive: the same rules fire {STALL_ALERT} within rateWindow + for + 2 scrapes ({deadline:g} s); "
            "nothing acts on it",
            at_most(naive_run["alerts_fired_after_seconds"].get(STALL_ALERT), deadline),
        ),
    ]
    results["goals"] = [{"text": text, "met": met} for text, met in goals]
    results["goal"] = {"text": "all hang goals", "met": all(met for _, met in goals)}
    return results
