"""Drill d, field report 004: a model that stops answering, on the local cluster's real node.

Both deployments run on the node as pods under the kubelet, on the same CPU with the same limits, get the same
callers in the node's network (no client timeout: whatever ends a wait is the server's doing), the same alert rules
in a real Prometheus, and the same fault: from `healthy` seconds on, every execution blocks. The naive one is the
Deployment NVIDIA's Kubernetes example writes (Triton's and ONNX Runtime's defaults, the HTTP liveness probe of
/v2/health/live); inferop's is what the operator renders for the InferenceService. The kubelet runs each pod's
probes: a restart ends the hang (the fault lives in the process), as a restart ends a real deadlock. The ablation is
inferop's pod without its liveness probe: the ConfigMap and Deployment the operator renders for the same
InferenceService, the probe removed and nothing else, applied by hand; inferop's goals must fail on it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from inferop.openloop import OpenLoopResult, Outcome, run_open_loop
from inferop.serving.tritonserver import model_metrics
from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING, CpuScheduling
from inferop_core.tritonconfig import ServingConfig
from inferop_devtools.field.node import (
    NAMESPACE,
    NVIDIA_PROBES,
    FieldNode,
    PodWatch,
    inference_service,
    triton_deployment,
)
from inferop_devtools.field.pods import (
    NAIVE_SCHEDULING,
    Machine,
    Rendered,
    at_most,
    describe,
    naive,
    one_request,
    pod_spec,
    rendered,
)
from inferop_devtools.prometheus import Prometheus, chart_alert_rules
from inferop_operator.builders import Service, build_config_map, build_deployment
from inferop_operator.identity import TRITON_CONTAINER
from inferop_operator.plan import memory_limit, plan_service
from inferop_operator.spec import parse_spec

STALL_SERIES = ("nv_inference_pending_request_count", "nv_inference_request_success")
STALL_ALERT = "InferopQueueStalled"
STALL_FILE = "/tmp/inferop-stall"  # in the pod's /tmp: the model blocks every execution while it exists
ABLATION = "inferop without its liveness probe"
RUNS = ("naive", "inferop", ABLATION)


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
    watch: PodWatch,
    serving: ServingConfig,
    policy: CpuScheduling,
    rules: dict[str, Any],
    stall: Stall,
    machine: Machine,
    drain: float,
) -> dict[str, Any]:
    """Load on the pod's address, then the stall (the fault's file made in the container), with Triton's metrics
    read every second and a real Prometheus evaluating `rules`; the kubelet does what the pod's probes tell it."""
    address = watch.address
    stall_file, held_file = watch.path(STALL_FILE), watch.path(f"{STALL_FILE}.held")
    metrics_url = f"http://{address}:8002/metrics"
    events: dict[str, float] = {}
    outcome: dict[str, OpenLoopResult] = {}
    with Prometheus([f"{address}:8002"], rule_files=[rules]) as prometheus:

        def load() -> None:
            outcome["result"] = run_open_loop(
                f"{address}:8000",
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
                with contextlib.suppress(OSError):  # the server process gone: a restart
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
                stall_file.touch()  # as the container's root: the model only checks that it exists
                events["stall"] = now
            try:
                series.append(
                    {"t": round(now - started, 2), **model_metrics(metrics_url, stall.network, *STALL_SERIES)}
                )
            except OSError:  # restarting
                series.append({"t": round(now - started, 2), "down": True})
            if "stall" in events:
                for alert in prometheus.alerts():
                    if alert.state == "firing" and alert.name not in fired:
                        fired[alert.name] = round(now - events["stall"], 2)
            time.sleep(1.0)
        loader.join()
    container = watch.stop()
    result = outcome["result"]
    stalled_at = events["stall"]

    def after_stall(moment: float | None) -> float | None:
        return None if moment is None else round(moment - stalled_at, 2)

    restarts = []
    if container["restartCount"] > 0:
        last = container.get("lastState", {}).get("terminated", {})
        restarts.append(
            {
                "stopped_after_seconds": after_stall(watch.gone_at),
                "ready_after_seconds": after_stall(watch.ready_again_at),
                "exit_reason": f"{last.get('reason')}, exit code {last.get('exitCode')}",
            }
        )
    served_again = [
        result.started_at + o.finished_at - stalled_at
        for o in result.outcomes
        if o.kind == "ok" and watch.gone_at is not None and result.started_at + o.finished_at > watch.gone_at
    ]
    # The stall as the metrics show it: from 2 s after it began until the stalled process went (or the end).
    end = (watch.gone_at or time.monotonic()) - started
    during = [row for row in series if not row.get("down") and stalled_at - started + 2 <= row["t"] < end]
    probes: Counter[str] = Counter()
    for event in watch.events():  # "Liveness probe failed", "Readiness probe failed", "Killing"
        if event["reason"] in ("Unhealthy", "Killing"):
            probes[event["message"].split(":")[0] if event["reason"] == "Unhealthy" else "Killing"] += event["count"]
    return {
        "config": describe(serving, policy),
        "caller_timeout": None,
        "result": result.as_dict(),
        "metrics": series,
        "pending_rose": any(row["nv_inference_pending_request_count"] > 0 for row in during),
        "success_flat": len(during) > 1
        and during[-1]["nv_inference_request_success"] == during[0]["nv_inference_request_success"],
        "alerts_fired_after_seconds": fired,
        "held_after_seconds": after_stall(events.get("held")),
        "in_flight_at_stall": callers_in_flight(result, events.get("held"), stalled_at),
        "restart_count": container["restartCount"],
        "kubelet_events": dict(probes),  # probe failures and the kills they caused, by reason
        "restarts": restarts,
        "serving_again_after_seconds": round(min(served_again), 2) if served_again else None,
    }


def drill_hang(machine: Machine) -> dict[str, Any]:
    """Field report 004: a model that stops answering. The same callers (no client timeout), rules, limits and
    fault on both sides: naive callers wait for ever, its HTTP liveness probe passing throughout; inferop's get
    Triton's 503 from the queue, and the kubelet, running the operator's exec probe, restarts the stalled
    container, which serves again."""
    stall = Stall()
    raw = pod_spec(stall.network, cpus=1)
    raw["resources"]["limits"]["memory"] = memory_limit(plan_service(parse_spec(raw)).memory.required_bytes)
    request_seconds = parse_spec(raw).timeouts.request_seconds  # the default: Triton checks it every ~0.5 s
    ours = plan_service(parse_spec(raw)).serving  # as the operator plans it
    kubelet: Rendered = rendered(raw)
    scrape, window, hold = 1.0, 4.0, 5.0
    rule_values = {"monitoring.interval": f"{scrape:g}s", "monitoring.scrapeTimeout": f"{scrape:g}s"}
    rule_values |= {"monitoring.rules.rateWindow": f"{window:g}s", "monitoring.rules.stalledFor": f"{hold:g}s"}
    rules = chart_alert_rules(rule_values)
    # After the last arrival: long enough for the queue's timeout and a restart (grace, start) to end every wait.
    drain = request_seconds + kubelet.grace_seconds + 10
    probe = kubelet.liveness_probe
    results: dict[str, Any] = {
        "where": "the local cluster's node: containerd, runc and the kubelet",
        "request_seconds": request_seconds,
        "stall": asdict(stall),
        "rules": rule_values,
        "liveness_probe": {k: v for k, v in probe.items() if k != "exec"},
        "naive_liveness_probe": NVIDIA_PROBES["livenessProbe"],
        "grace_seconds": kubelet.grace_seconds,
        "exit_timeout_args": kubelet.exit_timeout_args,
    }
    fault = {"INFEROP_FAULT_STALL_FILE": STALL_FILE}
    with FieldNode.up(machine, "hang") as node:
        limits = {key: str(value) for key, value in raw["resources"]["limits"].items()}
        repo = node.repo("naive", naive(ours))
        by_hand = triton_deployment("naive", node.triton_image, repo, limits, NAIVE_SCHEDULING, fault)
        with node.serving(by_hand) as watch:
            results["naive"] = stalled_run(watch, naive(ours), NAIVE_SCHEDULING, rules, stall, machine, drain)
        with node.serving(inference_service("ours", raw, fault)) as watch:
            results["inferop"] = stalled_run(watch, ours, DEFAULT_CPU_SCHEDULING, rules, stall, machine, drain)
        with node.serving(without_liveness("ablation", raw, node.triton_image, fault)) as watch:
            results[ABLATION] = stalled_run(watch, ours, DEFAULT_CPU_SCHEDULING, rules, stall, machine, drain)
    for label in RUNS:
        run = results[label]
        r = run["result"]
        print(
            f"  hang/{label}: unfinished {r['unfinished']}, 503 {r['rejected'] + r['timed_out']}, failed "
            f"{r['failed']}, alerts {run['alerts_fired_after_seconds']}, restarts {run['restart_count']}, serving "
            f"again after {run['serving_again_after_seconds']} s"
        )
    naive_run = results["naive"]
    period, threshold = probe["periodSeconds"], probe["failureThreshold"]
    # The first failing run may see part of a period's executions; then `threshold` failures a period apart; then
    # the container's stop, which the kubelet ends with SIGKILL after the grace period.
    restart_bound = (threshold + 1) * period + probe["timeoutSeconds"] + kubelet.grace_seconds
    deadline = window + hold + 2 * scrape  # a whole rate window without a success, then `for:`
    ablation_goals = inferop_goals(results[ABLATION], request_seconds, restart_bound)
    goals = [
        ("naive callers still waiting when the drill stops", naive_run["result"]["unfinished"] > 0),
        ("naive: its HTTP liveness probe passed throughout: the kubelet never restarted it",
         naive_run["restart_count"] == 0),
        *inferop_goals(results["inferop"], request_seconds, restart_bound),
        (
            f"naive: the same rules fire {STALL_ALERT} within rateWindow + for + 2 scrapes ({deadline:g} s); "
            "nothing acts on it",
            at_most(naive_run["alerts_fired_after_seconds"].get(STALL_ALERT), deadline),
        ),
        (f"{ABLATION}: at least one of inferop's goals fails", not all(met for _, met in ablation_goals)),
    ]  # fmt: skip
    results["goals"] = [{"text": text, "met": met} for text, met in goals]
    results["ablation_goals"] = [{"text": text, "met": met} for text, met in ablation_goals]
    results["goal"] = {"text": "all hang goals", "met": all(met for _, met in goals)}
    return results


def inferop_goals(run: dict[str, Any], request_seconds: float, restart_bound: float) -> list[tuple[str, bool]]:
    """What inferop's pod must do with the stall: judged on its run, and on the ablation's, where some must fail."""
    result, restarts, in_batch = run["result"], run["restarts"], run["in_flight_at_stall"]["batch"]
    return [
        (
            "inferop: no caller left waiting, though no caller has a timeout",
            result["unfinished"] == 0 and result["client_timeout"] == 0,
        ),
        (
            "inferop: Triton's queue timeout answered queued callers 503 within requestSeconds + 10%",
            result["timed_out"] > 0 and at_most(result["server_timeout_ms"].get("max"), request_seconds * 1.1e3),
        ),
        (
            "inferop: metrics show the stall before the restart (pending above 0, success flat)",
            run["pending_rose"] and run["success_flat"],
        ),
        (
            f"inferop: the kubelet restarted the stalled container once, its process gone within {restart_bound:g} s "
            "((failureThreshold + 1) x periodSeconds + timeoutSeconds + terminationGracePeriodSeconds)",
            run["restart_count"] == 1 and len(restarts) == 1
            and at_most(restarts[0]["stopped_after_seconds"], restart_bound),
        ),
        (
            "inferop: the callers inside the stalled execution got an answer (the restart's)",
            in_batch["count"] > 0 and "unfinished" not in in_batch["kinds"],
        ),
        ("inferop: serving again after the restart", run["serving_again_after_seconds"] is not None),
    ]  # fmt: skip


def without_liveness(name: str, raw: dict[str, Any], image: str, env: dict[str, str]) -> dict[str, Any]:
    """The ablation: what the operator renders for the InferenceService `raw` (its ConfigMap and Deployment, with
    `env`, running `image`), the liveness probe removed and nothing else, as a List to apply by hand (nothing owns
    it: the operator leaves it alone)."""
    spec = parse_spec(inference_service(name, raw, env)["spec"])
    service = Service(name=name, namespace=NAMESPACE, uid="", spec=spec, plan=plan_service(spec), image=image)
    config_map, deployment = build_config_map(service), build_deployment(service)
    for item in (config_map, deployment):
        item["metadata"].pop("ownerReferences", None)
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        if container["name"] == TRITON_CONTAINER:
            del container["livenessProbe"]
    return {"apiVersion": "v1", "kind": "List", "items": [config_map, deployment]}
