"""Rollouts through a real gateway (`make drills`, part rollout): the operator changes what serves while live
traffic flows through Envoy, and the drill measures what callers got at every moment.

    python -m inferop_devtools.drills.rollout [--quick] [--scenarios good,failing,...] [--json PATH]

It runs on the local cluster's real node (gateway.plane, root): Envoy Gateway, its Envoy and the operator's Triton
pods are pods of the node, and the drill itself, the operator, Prometheus and the load run in the node's network.
Each track's pods are pinned to a CPU of their own, as pods on nodes of their own. Candidates, each a change of a
service serving a small policy/value net:

    good      the same model file with a better serving config (no queue delay): promoted; the chart's dashboard
              (its Triton and gateway panels) read mid-rollout at the step where both tracks serve
    slow      a build whose executions take SLOWDOWN times as long (INFEROP_FAULT_SLOWDOWN in spec.runtime.env,
              which the image's model reads), same answers: rolled back. A request's time is more than its
              execution: three times the execution read 1.59-1.68x the stable revision's time a request, at the
              default gate of 1.5x, and was rolled back at one step or the next by chance; six reads well beyond it
    p99       a build whose executions stall now and then (a tenth of them 150 ms longer), the mean gate removed:
              rolled back by the p99 gate alone
    failing   a build that errors on boards holding 0.5 (INFEROP_FAULT_FAIL_VALUE), which the held-out boards
              never hold and a tenth of live requests do: rolled back within its first step's error budget
    crash     the candidate's servers killed at a step with live requests: no metrics from them, Envoy's
              connections refused; rolled back on the restart the API shows, within an interval
    gateway_503  the candidate's pods reset the gateway's connections at a step with live requests: Envoy answers
              503, Triton sees nothing, the pods stay Ready; rolled back on the gateway's figures, within an interval
    oom       a build that leaks at a step with live requests until its memory limit kills its model's process:
              rolled back within an interval
    late      the failing build's fault from 80% of a step 50 intervals long: caught within an interval of its start
    starting  a build whose pods take 20 s more to load: every weight waits for its Ready pods, no request fails
    capacity  three stable pods following a good candidate's weight down: 2 at 34%, 1 at 67% and at 100%
    capacity_slow  the slow build with the stable pods scaled to its share: its weight stays until they are back
    steer     `inferop rollout` promote (a step held by a pause), abort, retry and promote --full, each timed
    wrong     other weights (another seed): fast, no errors, different answers: never gets a live request
    near      the same model with one move's policy bias raised, so that its top-1 move differs on 3% of the check's
              inputs (0.97 agreement, below minAgreement - tolerance): refused with the bound, no live request
    shadow    20% of live requests mirrored while its weight is 0: what reaches it, what callers get from it
    header    `x-inferop-candidate: 1` callers: where they go, and where the others go
    second    a second rollout right after a promotion: no route left from the first, on the HTTPRoute and on
              the traffic Envoy sends afterwards
    kill      the operator SIGKILLed at a random moment of a random step after the first: it resumes there
    blind     Prometheus stopped mid-rollout: the rollout pauses, and resumes when it is back
    pipeline  Inception V3 behind its image pipeline, callers sending JPEGs and a tester sending the candidate (by
              the header) bytes that are no image: the agreement check compares the revisions' top labels on
              photographs, the analysis counts the pipeline's failures and not the 400s those bytes get: promoted;
              its NetworkPolicy opens the pods to the gateway alone: a pod beside them is refused

and NAME_ablated for each scenario of ABLATIONS: the same with what makes its goal removed (a safeguard of the
operator, INFEROP_ROLLOUT_ABLATE, or a gate of its analysis), where its goal must fail. good, steer and the
scenarios of routing (wrong, near, shadow, header, second, kill, blind) have none: what they check is the mechanism
itself (a promotion, an action taken, a route), with no switch to remove short of the feature.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from kubernetes.dynamic.exceptions import NotFoundError

from inferop_devtools.choices import add_subset_option
from inferop_devtools.cluster.controlplane import ClusterError
from inferop_devtools.dashboard import PANELS, evaluate, plausible
from inferop_devtools.drills.traffic import Mix, Request, Sent, Traffic, board_request, image_request
from inferop_devtools.gateway.plane import (
    GATEWAY,
    LISTENER_PORT,
    MODELS,
    SCRAPE_SECONDS,
    GatewayPlane,
    conditions,
    wait_for,
)
from inferop_operator.analysis import series_label
from inferop_operator.builders import ENVOY_GATEWAY_GROUP, HTTP_PORT
from inferop_operator.identity import CANDIDATE_SUFFIX, COMPONENT, COMPONENTS, INSTANCE, TRITON_CONTAINER
from inferop_operator.rollout import DRAIN_SECONDS, SAFEGUARDS, canary_replicas, stable_share

log = logging.getLogger("rollout-drill")
MODEL = "conv_net"
NETWORK: dict[str, Any] = {"rows": 8, "cols": 7, "depth": 10, "hidden": 128, "moves": 7}  # export's default
NEAR_AGREEMENT = 0.97  # the near candidate's top-1 agreement with the stable model on the check's inputs
FAIL_VALUE = 0.5  # a cell value the failing build breaks on; held-out boards hold -1, 0 and 1 only
FAILING_SHARE = 0.1  # of live requests carry it
HEADER = {"name": "x-inferop-candidate", "value": "1"}
TICK_SECONDS = 1.0  # the operator's rollout tick in the drill
# The rate window of the dashboard's Triton panels when the drill reads it (their $__rate_interval): inside one step.
# The gateway's panel takes a longer one, as Grafana gives it (its min interval).
DASHBOARD_WINDOW_SECONDS = 5
SHARE_TOLERANCE = 0.1  # how far the traffic-share panel may read from the step's weight, at least
SLOWDOWN = 6  # the slow build's executions: beyond the default latency gate by far (see the module's docstring)
# Envoy's requests routed to a cluster it does not have: its listener's HTTP connection manager counts them
# (http.<stat prefix>.no_cluster); Envoy Gateway serves a privileged listener port at port + 10000, named http-<port>.
ENVOY_NO_CLUSTER = f"http.http-{LISTENER_PORT + 10_000}.no_cluster"
# A route naming a cluster that Envoy adds in the same update fails what it sends there until the cluster has its
# endpoints (no_cluster): a rollout's steps should add none.
ENVOY_CHURN = ("cluster_manager.cluster_added", ENVOY_NO_CLUSTER)
ENDED = ("Succeeded", "RolledBack")  # a rollout's final phases
P99 = 0.99
ARM_FILE = "/tmp/inferop-fault"  # in a candidate's Triton container (an emptyDir): its armed faults act once made
LEAK_MIB = 16  # the leaking build keeps this much more after each execution: past 1Gi within seconds at its weight
# The late regression's step, in analysis intervals: long enough that its first interval failing, read over the step
# so far (the ablation), stays under the failure gate. A tenth failing over a 40th of the step is 0.25%, but a batch
# holding a marked board fails whole and increase() extrapolates: at 25 intervals (a 20th) 5% of 60/s read 1.33%.
LATE_STEPS = 50
LATE_SHARE = 0.8  # of that step, after which it starts failing (right after the next analysis)
TAIL_SHARE = 0.1  # of the stalling build's executions take TAIL_MS more: its p99 from Envoy's first buckets to past 100
TAIL_MS = 150
P99_INTERVAL = 10  # the p99 scenario's analysis interval: two of Envoy's histogram updates and 100 requests a track
CAPACITY_REPLICAS = 3  # the capacity scenarios' stable pods
CAPACITY_DELAY = 5  # seconds a step's weight holds before the stable pods scale to it, in the capacity scenario
KILL_STEPS = [25, 50, 100]  # the kill scenario's steps where the drill's have fewer than three
STEERED_SECONDS = 5.0  # an action of `inferop rollout` is taken up within one reconcile: the operator's tick and more
STARTING_SECONDS = 20  # the slow-starting build's extra load time: several of the operator's ticks at each step
# The pipeline scenario: Inception V3 answers about 9 images a CPU-second here, each track has one CPU; a fifth of its
# callers send the candidate bytes that are no image, by the header.
PIPELINE_RATE = 6.0
NOT_AN_IMAGE_SHARE = 0.2
NOT_AN_IMAGE = b"%PDF-1.7 a document"


@dataclass(frozen=True)
class Settings:
    """The drill's pace: full, or --quick (what `make test` runs)."""

    steps: list[int]
    step_seconds: int
    interval_seconds: int
    min_requests: int
    rate: float
    replicas: int = 2
    cpu_request: str = "250m"  # each Triton pod's: both tracks' pods and the gateway's fit the node's CPUs
    removed: dict[str, dict[str, Any]] = field(default_factory=dict)  # an ablation's rollout changes, by section

    @classmethod
    def of(cls, quick: bool) -> Settings:
        if quick:
            # Steps of 15 s: the dashboard's reading (Drill.dashboard_mid_rollout) needs Envoy's switch (seconds on a
            # busy machine) and a 5 s window inside the first.
            return cls(steps=[50, 100], step_seconds=15, interval_seconds=5, min_requests=10, rate=30.0)
        return cls(steps=[5, 25, 50, 100], step_seconds=30, interval_seconds=10, min_requests=20, rate=60.0)

    def rollout(self, **changes: Any) -> dict[str, Any]:
        """The drill's rollout section with `changes`, and an ablation's (`removed`) over both."""
        analysis = {"intervalSeconds": self.interval_seconds, "minRequests": self.min_requests}
        spec = {"steps": self.steps, "stepSeconds": self.step_seconds, "analysis": analysis, **changes}
        for section, removed in self.removed.items():
            spec[section] = {**spec.get(section, {}), **removed}
        return spec


def track_cpu(component: str) -> int | None:
    """Each track on a CPU of its own, as a candidate's pods on nodes beside the stable ones: the last CPU for the
    stable pods, the first for the candidate's (the control plane floats over both, and so do Envoy and the load but
    in the shadow scenario: Drill.gateway_beside_stable)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return cpus[-1] if component == COMPONENTS["stable"] else cpus[0]


def fault(**env: object) -> dict[str, Any]:
    """The serving container's environment with faults the image's model reads (inferop.serving.model)."""
    return {"runtime": {"env": [{"name": name, "value": str(value)} for name, value in env.items()]}}


@dataclass
class Models:
    """The network exported twice (two seeds), a copy of the first nudged to NEAR_AGREEMENT (`near`, the agreement
    measured), and the spec export wrote for it; Inception V3 behind its image pipeline, exported on first use
    (`pipeline_spec`)."""

    stable: Path
    other: Path
    near: Path
    near_agreement: float
    spec: dict[str, Any]
    workdir: Path
    _pipeline: dict[str, Any] | None = None

    def pipeline_spec(self) -> dict[str, Any]:
        """The spec `inferop export inception_v3 --pipeline image` writes."""
        if self._pipeline is None:
            from inferop_export.exporter import export_model
            from inferop_export.networks.inception_v3 import inception_v3
            from inferop_operator.spec import Pipeline, parse_serving

            pipeline = Pipeline.model_validate({"input": "image"})
            repo = self.workdir / "models-pipeline"
            report = export_model(inception_v3(), repo, serving=parse_serving({}), quiet=True, pipeline=pipeline)
            self._pipeline = report.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        return json.loads(json.dumps(self._pipeline))


def export_models(workdir: Path) -> Models:
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_operator.spec import parse_serving

    serving = parse_serving({"batching": {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 2000}})
    report = export_model(conv_net(**NETWORK), workdir / "models", serving=serving, quiet=True)
    export_model(conv_net(**NETWORK, seed=7), workdir / "models-other", serving=serving, quiet=True)
    spec = report.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    stable, near = workdir / "models" / MODEL, workdir / "models-near" / MODEL
    measured = nudged_copy(stable, near, spec, NEAR_AGREEMENT)
    return Models(stable, workdir / "models-other" / MODEL, near, measured, spec, workdir)


def nudged_copy(stable: Path, out: Path, spec: dict[str, Any], agreement: float) -> float:
    """A copy of the model directory `stable` whose policy's top-1 move differs from the stable model's on
    1 - `agreement` of the agreement check's own inputs: the bias of the move that is least often the top one is
    raised past that share of the inputs' gaps to their top move. Returns the agreement ONNX Runtime measures for
    the copy on those inputs."""
    import shutil

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from inferop_operator.agreement import agreement_inputs
    from inferop_operator.spec import parse_spec

    model = onnx.load(stable / "1" / "model.onnx")
    producers = {output: node for node in model.graph.node for output in node.output}
    logits = producers["policy"]
    if logits.op_type == "Softmax":
        logits = producers[logits.input[0]]
    (bias,) = [i for i in model.graph.initializer if i.name == logits.input[2]]
    name = spec["model"]["inputs"][0]["name"]
    boards = np.concatenate([feeds[name] for _, _, feeds in agreement_inputs(parse_spec(spec), 64, 4000)])

    def policy(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return np.asarray(session.run(["policy"], {name: boards})[0])

    before = np.log(policy(stable / "1" / "model.onnx"))
    top = before.argmax(axis=1)
    move = int(np.bincount(top, minlength=before.shape[1]).argmin())
    gaps = np.sort(before.max(axis=1)[top != move] - before[top != move, move])
    raise_by = float(gaps[int((1 - agreement) * len(before))])  # past that many inputs' gaps, short of the next
    values = numpy_helper.to_array(bias).copy()
    values[move] += raise_by
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    shutil.copytree(stable, out)
    onnx.save(model, out / "1" / "model.onnx")
    return float((policy(out / "1" / "model.onnx").argmax(axis=1) == top).mean())


def manifest(name: str, models: Models, settings: Settings, rollout: dict[str, Any]) -> dict[str, Any]:
    spec = json.loads(json.dumps(models.spec))
    spec["model"]["storageUri"] = f"hostpath://{models.stable}"
    spec["model"]["weights"] = "random (seed 0)"
    spec.update(
        replicas=settings.replicas,
        # Both tracks' pods and the gateway's fit the node's CPUs by their requests; each may use a whole CPU.
        resources={"requests": {"cpu": settings.cpu_request, "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        threads={"intraOp": 1},
        gateway={"name": GATEWAY, "hostnames": [host(name)]},
        rollout=rollout,
    )
    return {"metadata": {"name": name, "namespace": MODELS}, "spec": spec}


def host(name: str) -> str:
    return f"{name}.inferop.test"


@dataclass(frozen=True)
class Served:
    """What a scenario's service serves in place of the drill's conv net: the model callers ask for, its spec (the
    rollout aside), a request it answers (the probe) and what live callers send, at what rate."""

    model: str
    spec: dict[str, Any]
    probe: Request
    live: Mix
    rate: float


# ------------------------------------------------------------------------------------------------ observing


@dataclass
class Observer:
    """The service's rollout state and its pods' request counts, sampled on a thread: transitions with their
    times, and every pod's last counts (a candidate's pods and their counters go when it ends). Each pod's processes
    are pinned to its track's CPU when first seen (track_cpu)."""

    plane: GatewayPlane
    name: str
    model: str = MODEL  # what callers ask for, whose counts it reads
    transitions: list[dict[str, Any]] = field(default_factory=list)
    analyses: list[dict[str, Any]] = field(default_factory=list)  # each analysis the status showed, in turn
    counts: dict[str, dict[str, float]] = field(default_factory=dict)
    components: dict[str, str] = field(default_factory=dict)
    pinned: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def state(self) -> dict[str, Any]:
        return dict((self.plane.service(self.name).get("status") or {}).get("rollout") or {})

    def sample(self) -> None:
        rollout = self.state()
        seen = {key: rollout.get(key) for key in ("phase", "reason", "step", "weight", "mirrorPercent", "header")}
        seen["stepStartedAt"] = rollout.get("stepStartedAt")
        if not self.transitions or {k: v for k, v in self.transitions[-1].items() if k != "at"} != seen:
            self.transitions.append({"at": time.monotonic(), **seen})
        analysis = rollout.get("analysis")
        if analysis and (not self.analyses or self.analyses[-1]["at"] != analysis.get("at")):
            keys = ("at", "step", "weight", "verdict", "check", "message")
            self.analyses.append({key: analysis.get(key) for key in keys})
        pods = self.plane.triton_pods(self.name)
        for pod in pods:
            name, component = pod["metadata"]["name"], pod["metadata"]["labels"][COMPONENT]
            self.components[name] = component
            if name not in self.pinned and conditions(pod).get("Ready") == "True":
                self.pin(pod, component)
        self.counts.update(self.plane.counts(self.model, pods))

    def pin(self, pod: dict[str, Any], component: str) -> None:
        """The pod on its track's CPU: every process it runs, the kubelet's exec probes too."""
        cpu, node = track_cpu(component), self.plane.drill.node
        if cpu is not None and node is not None and node.site.pin_pod(pod["metadata"]["uid"], str(cpu)):
            self.pinned.add(pod["metadata"]["name"])

    def run(self) -> Observer:
        def loop() -> None:
            while not self._stop.wait(0.25):
                try:
                    self.sample()
                except Exception as error:  # an apiserver blip: the next sample tries again
                    log.debug("observer: %s", error)

        threading.Thread(target=loop, name="observer", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        time.sleep(0.5)

    def received(self, component: str) -> float:
        """Requests the pods of one track answered or failed, over their lives."""
        return sum(
            counts["nv_inference_request_success"] + counts["nv_inference_request_failure"]
            for pod, counts in self.counts.items()
            if self.components.get(pod) == component
        )

    def server_time(self, component: str) -> tuple[float, float]:
        """(requests, microseconds in Triton) of one track's pods over their lives: queue and compute, what the
        server itself spends on a request, without the gateway's and the caller's share of the latency."""
        pods = [counts for pod, counts in self.counts.items() if self.components.get(pod) == component]
        answered = sum(c["nv_inference_request_success"] + c["nv_inference_request_failure"] for c in pods)
        return answered, sum(c["nv_inference_request_duration_us"] for c in pods)

    def when(self, check: Callable[[dict[str, Any]], bool]) -> float | None:
        return next((t["at"] for t in self.transitions if check(t)), None)

    def weight_changes(self) -> list[float]:
        times, last = [], None
        for t in self.transitions:
            if t["weight"] != last and last is not None:
                times.append(t["at"])
            last = t["weight"]
        return times

    def final(self, timeout: float) -> dict[str, Any]:
        try:
            return wait_for(
                lambda: (s := self.state()).get("phase") in ENDED and s,
                f"the rollout of {self.name} to end",
                timeout,
                lambda: json.dumps(self.state(), indent=1)[:3000],
            )
        except ClusterError as held:
            raise NeverEnded(str(held)) from None


class NeverEnded(ClusterError):
    """A rollout held past its drill's timeout: an outcome to judge, unlike a cluster that failed the drill."""


def share_tolerance(weight: float, requests: float) -> float:
    """How far a share of `requests` may read from `weight`: Envoy draws each request's backend at random, so the
    count is binomial; four standard deviations (1 run in 16,000 beyond), and never less than SHARE_TOLERANCE."""
    spread = math.sqrt(weight * (1 - weight) / requests) if requests > 0 else 1.0
    return max(SHARE_TOLERANCE, 4 * spread)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))] if ordered else float("nan")


def callers(outcomes: list[Sent]) -> dict[str, Any]:
    ok = [s.latency_s for s in outcomes if s.kind == "ok"]
    failed = [s for s in outcomes if s.kind != "ok"]
    return {
        "sent": len(outcomes),
        "failed": len(failed),
        "failed_ratio": round(len(failed) / len(outcomes), 5) if outcomes else None,
        "p99_ms": round(percentile(ok, P99) * 1e3, 1) if ok else None,
        "first_failure": failed[0].message if failed else None,
    }


# ------------------------------------------------------------------------------------------------ scenarios


@dataclass
class Drill:
    plane: GatewayPlane
    models: Models
    settings: Settings
    boards: dict[str, Request] = field(default_factory=dict)
    callers_cpus: frozenset[int] | None = None  # where the callers run (gateway_beside_stable); None: anywhere

    def __post_init__(self) -> None:
        rng = np.random.default_rng(1)
        outputs = ["policy", "value"]
        shape = (1, 1, NETWORK["rows"], NETWORK["cols"])
        plain = rng.integers(-1, 2, size=shape).astype(np.float32)
        marked = plain.copy()
        marked[0, 0, 0, 0] = FAIL_VALUE
        self.boards = {
            "plain": board_request("plain", plain, outputs),
            "marked": board_request("marked", marked, outputs),
            "header": board_request("header", plain, outputs, {HEADER["name"]: HEADER["value"]}),
        }

    def live(self) -> Mix:
        """A tenth of the boards carry the value the failing build breaks on."""
        return [(self.boards["marked"], FAILING_SHARE), (self.boards["plain"], 1 - FAILING_SHARE)]

    @contextmanager
    def service(self, name: str, rollout: dict[str, Any], served: Served | None = None) -> Iterator[Observer]:
        """The service serving the stable revision (the conv net, or `served`), Ready and reachable through the
        gateway; deleted after."""
        if served is None:
            self.plane.apply_service(manifest(name, self.models, self.settings, rollout))
            model, probe_request = MODEL, self.boards["plain"]
        else:
            spec = {**served.spec, "gateway": {"name": GATEWAY, "hostnames": [host(name)]}, "rollout": rollout}
            self.plane.apply_service({"metadata": {"name": name, "namespace": MODELS}, "spec": spec})
            model, probe_request = served.model, served.probe
        observer = None
        try:
            wait_for(
                lambda: (self.plane.service(name).get("status") or {}).get("readyReplicas") == self.settings.replicas,
                f"{name} Ready",
                180,
                self.plane.cluster.pods_and_warnings,
            )
            probe = Traffic(self.plane.envoy_address, host(name), model, 1.0, [(probe_request, 1.0)])
            wait_for(lambda: self._answers(probe), f"{name} answering through the gateway", 60)
            observer = Observer(self.plane, name, model).run()
            yield observer
        finally:
            if observer is not None:
                observer.stop()
            self.plane.delete_service(name)
            wait_for(lambda: not self.pods_of(name), f"{name}'s pods gone", 60)

    @contextmanager
    def without(self, ablation: Ablation) -> Iterator[Drill]:
        """This drill with `ablation`'s rollout changes, its operator started again without its safeguards; after,
        the operator as it was."""
        operator = self.plane.operator if ablation.safeguards else None
        if operator:
            operator.stop()
            operator.extra_env["INFEROP_ROLLOUT_ABLATE"] = ",".join(ablation.safeguards)
            operator.start()
        try:
            yield Drill(self.plane, self.models, replace(self.settings, removed=ablation.rollout))
        finally:
            if operator:
                operator.stop()
                del operator.extra_env["INFEROP_ROLLOUT_ABLATE"]
                operator.start()

    def pods_of(self, name: str) -> list[str]:
        return [pod["metadata"]["name"] for pod in self.plane.triton_pods(name)]

    def _answers(self, probe: Traffic) -> bool:
        probe.start()
        time.sleep(1.5)
        return any(s.kind == "ok" for s in probe.stop())

    def traffic(self, name: str, mix: Mix | None = None, served: Served | None = None) -> Traffic:
        model, rate, mix = (
            (MODEL, self.settings.rate, mix or self.live())
            if served is None
            else (served.model, served.rate, served.live)
        )
        return Traffic(self.plane.envoy_address, host(name), model, rate, mix, cpus=self.callers_cpus).start()

    def change(self, name: str, spec: dict[str, Any]) -> float:
        self.plane.patch_service(name, spec)
        return time.monotonic()

    def timeout(self, rollout: dict[str, Any] | None = None) -> float:
        """How long a rollout (by default the drill's) may take to end: each step, three intervals more, two minutes."""
        spec = rollout or self.settings.rollout()
        step = spec["stepSeconds"] + 3 * spec["analysis"]["intervalSeconds"]
        return 120 + len(spec["steps"]) * step

    # -- one per candidate

    def roll(
        self,
        name: str,
        change: dict[str, Any],
        rollout: dict[str, Any] | None = None,
        admission: bool = False,
        during: Callable[[str, Observer], dict[str, Any]] | None = None,
        served: Served | None = None,
    ) -> Run:
        """The service (the conv net, or `served`) up, live traffic, then `change` of its spec, until the rollout
        ends; with `admission`, what the gateway admits (`self.admission`) before the change; `during` runs beside
        the rollout, from the change on, and its answer is the run's `seen`."""
        rollout = rollout or self.settings.rollout()
        with self.service(name, rollout, served) as observer, ThreadPoolExecutor(1) as beside:
            admitted = self.admission(name) if admission else None
            traffic = self.traffic(name, served=served)
            try:
                time.sleep(3)
                before = self.plane.envoy_stats(*ENVOY_CHURN)
                changed = self.change(name, change)
                seen = beside.submit(during, name, observer) if during else None
                final = observer.final(self.timeout(rollout))
            finally:
                outcomes = traffic.stop()
            after = self.plane.envoy_stats(*ENVOY_CHURN)
            found = seen.result(timeout=60) if seen else None
        churn = {stat: after[stat] - before[stat] for stat in ENVOY_CHURN}
        return Run(observer, [s for s in outcomes if s.at >= changed], changed, final, admitted, found, churn)

    def dashboard_mid_rollout(self, name: str, observer: Observer) -> dict[str, Any]:
        """The chart's dashboard, its Triton and gateway panels, as Prometheus answers them at the first step where
        both tracks serve, with rates over a window inside that step and after Envoy applied it (the candidate's
        pods, which had no traffic before, answer a request: seconds after the status on a busy machine) and while
        Prometheus scraped every pod, read once every query has data, or as the step ends."""
        weight = next(w for w in self.settings.steps if 0 < w < 100)

        def at_the_step_or_ended() -> dict[str, Any] | None:
            last = observer.transitions[-1] if observer.transitions else None
            return last if last and (last["weight"] == weight or last["phase"] in ENDED) else None

        last = wait_for(at_the_step_or_ended, f"the step to {weight}%", self.timeout())
        if last["weight"] != weight:
            return {"weight": weight, "every_query_answered": False, "in_unit": False, "still_at_the_step": False,
                    "canary_share": math.nan, "ended_before_the_step": last["phase"]}  # fmt: skip
        entered = time.monotonic()
        window = f"{DASHBOARD_WINDOW_SECONDS}s"
        candidate = COMPONENTS["candidate"]
        before = observer.received(candidate)
        wait_for(lambda: observer.received(candidate) > before, "the candidate's first request", self.timeout())
        switched = time.monotonic()
        time.sleep(DASHBOARD_WINDOW_SECONDS + 1)
        # And every pod of the service scraped throughout the window: Prometheus takes up a new target (the
        # candidate's pods) on a 5 s tick, and a series begun mid-window reads low.
        scraped = f'min(count_over_time(up{{namespace="{MODELS}",{series_label(INSTANCE)}="{name}"}}[{window}]))'
        step_ends = entered + self.settings.step_seconds - 1
        while not (covered := self.plane.prometheus.query(scraped)) or covered[0].value < DASHBOARD_WINDOW_SECONDS:
            if time.monotonic() > step_ends:
                break
            time.sleep(0.5)
        values = {"$namespace": MODELS, "$service": name}
        interval = DASHBOARD_WINDOW_SECONDS - SCRAPE_SECONDS  # the $__interval that gives the Triton panels' window
        panels = [panel for panel in PANELS if panel.source in ("triton", "gateway")]
        while True:
            read = {
                panel.title: evaluate(self.plane.prometheus, panel, values, interval, SCRAPE_SECONDS)
                for panel in panels
            }
            complete = all(series for answers in read.values() for series in answers.values())
            if complete or time.monotonic() > step_ends:
                break
            time.sleep(0.5)
        in_unit = all(
            plausible(panel.unit, value)
            for panel in panels
            for series in read[panel.title].values()
            for value in series.values()
        )
        share = next(iter(read["Traffic share by track"].values()))
        rates = read["Requests per second by outcome"].values()
        requests = sum(value for series in rates for value in series.values()) * interval
        return {
            "weight": weight,
            "envoy_switched_seconds_into_step": round(switched - entered, 1),
            "scrapes_of_each_pod_in_the_window": covered[0].value if covered else 0,
            "read_at_seconds_into_step": round(time.monotonic() - entered, 1),
            "still_at_the_step": observer.transitions[-1]["weight"] == weight,
            "every_query_answered": complete,
            "in_unit": in_unit,
            "canary_share": round(share.get(COMPONENTS["candidate"], 0.0), 3),
            "share_tolerance": round(share_tolerance(weight / 100, requests), 3),
            "gateway_p99_ms": next(iter(read["Latency at the gateway"]["p99"].values()), None),
            "panels": read,
        }

    def admission(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """The bound on parallel requests the operator's BackendTrafficPolicy sets for `name`, whether Envoy Gateway
        accepted the policy, and the bound Envoy enforces on each of the route's backends (its admin API), read
        until they agree or `timeout` passes (Envoy's configuration follows the objects by a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            policy = self.plane.cluster.get(f"{ENVOY_GATEWAY_GROUP}/v1alpha1", "BackendTrafficPolicy", name, MODELS)
            seen = {
                "admits": policy["spec"]["circuitBreaker"]["maxParallelRequests"],
                "accepted": conditions(policy, parent=True).get("Accepted") == "True",
                "envoy_max_requests": self.plane.envoy_max_requests(name),
            }
            enforced = seen["envoy_max_requests"] and set(seen["envoy_max_requests"].values()) == {seen["admits"]}
            if (seen["accepted"] and enforced) or time.monotonic() > deadline:
                return {**seen, "enforced": bool(seen["accepted"] and enforced)}
            time.sleep(0.5)

    def model_with(self, **changes: Any) -> dict[str, Any]:
        model = {**self.models.spec["model"], "storageUri": f"hostpath://{self.models.stable}"}
        return {"model": {**model, "weights": "random (seed 0)", **changes}}

    def good(self) -> dict[str, Any]:
        change = {"batching": {"maxQueueDelayMicroseconds": 0}}
        run = self.roll("good", change, admission=True, during=self.dashboard_mid_rollout)
        at_changes = run.failed_near(run.observer.weight_changes())
        assert run.admission is not None and run.seen is not None
        dashboard = run.seen
        return run.report(
            failed_at_weight_changes=len(at_changes),
            envoy=run.envoy,
            admission=run.admission,
            dashboard=dashboard,
            goals=goals(
                ("promoted to 100% automatically", run.final["phase"] == "Succeeded"),
                ("at most 0.1% of requests fail over the whole rollout", (run.callers["failed_ratio"] or 0) <= 0.001),
                ("none fails at a weight change", not at_changes),
                (
                    "Envoy adds no cluster while the rollout moves traffic, and routes no request to one it lacks",
                    run.envoy["cluster_manager.cluster_added"] == run.envoy[ENVOY_NO_CLUSTER] == 0,
                ),
                (
                    "the gateway admits what the pods hold: Envoy enforces the operator's bound on the route",
                    run.admission["enforced"],
                ),
                (
                    "mid-rollout, every query of the dashboard's Triton and gateway panels answers in its unit",
                    dashboard["every_query_answered"] and dashboard["in_unit"] and dashboard["still_at_the_step"],
                ),
                (
                    f"the dashboard's traffic share reads the step's weight within {dashboard['share_tolerance']:g}",
                    abs(dashboard["canary_share"] - dashboard["weight"] / 100) <= dashboard["share_tolerance"],
                ),
            ),
        )

    def slow(self) -> dict[str, Any]:
        slow = {**self.model_with(weights="random (seed 0), slow build"), **fault(INFEROP_FAULT_SLOWDOWN=SLOWDOWN)}
        run = self.roll("slow", slow)
        took = run.exposed_to_rollback()
        limit = self.settings.interval_seconds + 2 * TICK_SECONDS
        return run.report(
            seconds_from_exposing_step_to_rollback=took,
            goals=goals(
                ("rolled back by its analysis", run.rolled_back_by("AnalysisFailed")),
                (
                    f"within one analysis interval of the step exposing it (+2 ticks: {limit:g} s)",
                    took is not None and took <= limit,
                ),
            ),
        )

    def p99(self) -> dict[str, Any]:
        """A build whose executions stall now and then (TAIL_SHARE of them TAIL_MS longer), same answers: the mean gate
        removed (maxLatencyRatio 100), the p99 gate alone rolls it back, at the first step where both tracks have the
        requests it needs (P99_INTERVAL)."""
        stalling = {
            **self.model_with(weights="random (seed 0), stalls now and then"),
            **fault(INFEROP_FAULT_TAIL_SHARE=TAIL_SHARE, INFEROP_FAULT_TAIL_MS=TAIL_MS),
        }
        analysis = {"intervalSeconds": P99_INTERVAL, "minRequests": self.settings.min_requests, "maxLatencyRatio": 100}
        rollout = self.settings.rollout(
            stepSeconds=max(self.settings.step_seconds, 3 * P99_INTERVAL), analysis=analysis
        )
        run = self.roll("p99", stalling, rollout)
        took = run.exposed_to_rollback()
        limit = 2 * P99_INTERVAL + 2 * TICK_SECONDS
        failed = next((a for a in run.observer.analyses if a["verdict"] == "Failed"), {})
        return run.report(
            seconds_from_exposing_step_to_rollback=took,
            goals=goals(
                ("rolled back by its analysis's p99 gate",
                 run.rolled_back_by("AnalysisFailed") and failed.get("check") == "p99"),
                (f"within two analysis intervals of the step exposing it (+2 ticks: {limit:g} s)",
                 took is not None and took <= limit),
            ),
        )  # fmt: skip

    def failing(self) -> dict[str, Any]:
        """Rolled back within one interval of its first step with live requests: its failed requests stay within a
        budget fixed by that step (`failure_budget`), whatever weight the rollout would have reached (without the
        gate, it goes on through every step and the same budget fails: ABLATIONS)."""
        failing = self.model_with(weights="random (seed 0), fails on 0.5")
        run = self.roll("failing", {**failing, **fault(INFEROP_FAULT_FAIL_VALUE=FAIL_VALUE)})
        bound = self.failure_budget(FAILING_SHARE)
        return run.report(
            failed_bound=round(bound, 1),
            goals=goals(
                ("rolled back by its analysis", run.rolled_back_by("AnalysisFailed")),
                (f"failed requests within the first step's budget ({bound:.0f})", run.callers["failed"] <= bound),
            ),
        )

    def failure_budget(self, share: float) -> float:
        """The failed requests a candidate failing `share` of its requests may cost: its first step with live
        requests for one analysis interval and two ticks, at the drill's rate, with four standard deviations of a
        Poisson count and one more."""
        weight = next(w for w in self.settings.steps if w > 0)
        mean = share * weight / 100 * (self.settings.interval_seconds + 2 * TICK_SECONDS) * self.settings.rate
        return mean + 4 * math.sqrt(mean) + 1

    def candidate_processes(self, name: str) -> list[list[int]]:
        """The processes of the Triton container of each of `name`'s candidate pods, from its cgroup."""
        node = self.plane.drill.node
        assert node is not None, "the drill runs on the node"
        found = []
        for pod in self.plane.triton_pods(name):
            if pod["metadata"]["labels"][COMPONENT] != COMPONENTS["candidate"]:
                continue
            statuses = pod["status"].get("containerStatuses") or []
            container = next((c for c in statuses if c["name"] == TRITON_CONTAINER and c.get("containerID")), None)
            if container is not None:
                found.append(node.site.container_pids(pod["metadata"]["uid"], container["containerID"]))
        return [pids for pids in found if pids]

    def arm(self, name: str) -> int:
        """ARM_FILE made in the Triton container of each of `name`'s candidate pods (through a process of it, whose
        root is the container's file system): their armed faults act from now. Returns the containers armed."""
        containers = self.candidate_processes(name)
        for pids in containers:
            Path(f"/proc/{pids[0]}/root{ARM_FILE}").touch()
        return len(containers)

    def kill_servers(self, name: str) -> int:
        """Each of `name`'s candidate tritonservers ended by SIGKILL, as a crash or the kernel ends it: the
        container's first process, which a signal from inside its PID namespace (a model's stub) cannot end."""
        containers = self.candidate_processes(name)
        for pids in containers:
            for pid in pids:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver":
                    os.kill(pid, signal.SIGKILL)
        return len(containers)

    def refuse_gateway(self, name: str) -> int:
        """Each of `name`'s candidate pods resets every packet from the gateway's Envoy to its HTTP port (a rule in
        the pod's network namespace), as a pod whose server no longer accepts, or a network that drops it: Envoy
        answers callers 503; the pod stays Ready (the kubelet's probes come from the node) and Triton sees nothing."""
        envoy = self.plane.envoy_pod()["status"]["podIP"]
        containers = self.candidate_processes(name)
        for pids in containers:
            rule = ["-p", "tcp", "-s", envoy, "--dport", str(HTTP_PORT), "-j", "REJECT", "--reject-with", "tcp-reset"]
            subprocess.run(["nsenter", "-t", str(pids[0]), "-n", "iptables", "-I", "INPUT", *rule], check=True)
        return len(containers)

    def broken(
        self,
        name: str,
        build: str,
        env: dict[str, object],
        into_step: float = 0.0,
        rollout: dict[str, Any] | None = None,
        start: Callable[[str], int] | None = None,
    ) -> dict[str, Any]:
        """A candidate that passes its agreement check and serves well, until its fault starts (`start`, by default
        `arm`: the faults of `env` act) `into_step` of the way through the first step that sends it live requests
        (later than that, right after the next analysis: a fault from then on is a whole interval of the next
        window): rolled back within one analysis interval of the fault's start, with at most the requests its weight
        takes in that interval failed, and 1% of all the callers' requests."""
        rollout = rollout or self.settings.rollout()
        begin = start or self.arm
        interval = rollout["analysis"]["intervalSeconds"]
        change = {
            **self.model_with(weights=f"random (seed 0), {build}"),
            **fault(**env, INFEROP_FAULT_ARM_FILE=ARM_FILE),
        }

        def arm_in_step(service: str, observer: Observer) -> dict[str, Any]:
            state = wait_for(
                lambda: (s := observer.state()).get("stepStartedAt") and (s.get("weight") or 0) > 0 and s,
                "a step that sends the candidate live requests", self.timeout(),
            )  # fmt: skip
            started = observer.when(lambda t: bool(t["stepStartedAt"]) and (t["weight"] or 0) > 0) or time.monotonic()
            time.sleep(max(0.0, started + into_step * rollout["stepSeconds"] - time.monotonic()))
            if into_step:
                analysed = len(observer.analyses)
                wait_for(lambda: len(observer.analyses) > analysed, "the next analysis", 3 * interval)
            armed = begin(service)
            return {"at": time.monotonic(), "step": state["step"], "weight": state["weight"], "containers": armed}

        run = self.roll(name, change, rollout, during=arm_in_step)
        assert run.seen is not None
        armed_at, weight = run.seen["at"], run.seen["weight"]
        back = run.observer.when(lambda t: t["at"] >= armed_at and t["weight"] == 0)
        took = round(back - armed_at, 1) if back is not None else None
        limit = interval + 2 * TICK_SECONDS
        after = [s for s in run.outcomes if s.at >= armed_at]
        failed = sum(1 for s in after if s.kind != "ok")
        bound = weight / 100 * interval * self.settings.rate + 0.01 * len(run.outcomes)
        return run.report(
            fault={"step": run.seen["step"], "weight": weight, "containers": run.seen["containers"],
                   "seconds_into_step": round(into_step * rollout["stepSeconds"], 1)},
            seconds_from_fault_to_weight_0=took,
            failed_after_fault=failed,
            failed_bound=round(bound, 1),
            goals=goals(
                ("the fault made in a candidate container at least", run.seen["containers"] > 0),
                ("rolled back", run.final.get("phase") == "RolledBack"),
                (f"back at weight 0 within one analysis interval of the fault (+2 ticks: {limit:g} s)",
                 took is not None and took <= limit),
                (f"failed requests at most weight x interval x rate + 1% of all ({bound:.0f})", failed <= bound),
            ),
        )  # fmt: skip

    def crash(self) -> dict[str, Any]:
        """The candidate's servers end (SIGKILL) at a step with live requests: no Triton metrics from them, Envoy's
        connections refused while the kubelet restarts them; the API shows the restart."""
        return self.broken("crash", "crashes", {}, start=self.kill_servers)

    def gateway_503(self) -> dict[str, Any]:
        """The candidate's pods reset the gateway's connections at a step with live requests (`refuse_gateway`):
        Envoy answers 503, no Triton metric moves and the API shows every pod Ready; the gateway's figures roll it
        back."""
        return self.broken("gateway-503", "refuses the gateway", {}, start=self.refuse_gateway)

    def oom(self) -> dict[str, Any]:
        """Every execution keeps LEAK_MIB more once armed, until the pod's memory limit kills the model's process
        (in this image the python backend's stub, which Triton starts again: the container is not restarted, so
        callers and the analysis see it, not the API)."""
        return self.broken("oom", "leaks", {"INFEROP_FAULT_LEAK_MIB": LEAK_MIB})

    def late(self) -> dict[str, Any]:
        """The failing build's fault (a tenth of live requests), from LATE_SHARE of a step LATE_STEPS intervals long:
        the analysis reads the last interval, so the minutes the candidate did well do not dilute it."""
        rollout = self.settings.rollout(stepSeconds=LATE_STEPS * self.settings.interval_seconds)
        return self.broken(
            "late", "fails on 0.5 late", {"INFEROP_FAULT_FAIL_VALUE": FAIL_VALUE}, into_step=LATE_SHARE, rollout=rollout
        )

    def starting(self) -> dict[str, Any]:
        """A candidate whose pods take STARTING_SECONDS more to load: each step's weight waits for the Ready pods it
        needs (as the candidate's Deployment says them, read beside the rollout), so no weight change fails a
        request. Without the wait (the ablation) a weight outruns its pods; Envoy sends requests to Ready pods only,
        so at the drill's load the pods that are Ready hold it, and only the first goal shows it."""
        change = {
            **self.model_with(weights="random (seed 0), loads slowly"),
            **fault(INFEROP_FAULT_LOAD_SECONDS=STARTING_SECONDS),
        }
        run = self.roll("starting", change, during=self.pods_beside("candidate"))
        assert run.seen is not None
        at_changes = run.failed_near(run.observer.weight_changes())
        waited = [t for t in run.observer.transitions if t["reason"] == "CandidateScaling"]
        needs = {w: canary_replicas(self.settings.replicas, w, 0, False) for w in self.settings.steps}
        short = [  # a weight in effect with fewer Ready pods than it needs
            s for s in run.seen["candidate"]
            if s["phase"] in ("Progressing", "Paused") and (s["ready"] or 0) < needs.get(s["weight"], 0)
        ]  # fmt: skip
        return run.report(
            failed_at_weight_changes=len(at_changes),
            steps_that_waited_for_pods=len({t["step"] for t in waited}),
            candidate_pods=run.seen["candidate"],
            goals=goals(
                ("promoted", run.final.get("phase") == "Succeeded"),
                ("every weight had the candidate's Ready pods that it needs, as its Deployment says", not short),
                ("no request fails over the whole rollout", run.callers["failed"] == 0),
            ),
        )

    def steered(self, name: str, action: str, *args: str) -> dict[str, Any]:
        """`inferop rollout ACTION NAME` as a user runs it: its exit code and the seconds it says the operator
        took to show the action in the status."""
        inferop = Path(sys.executable).with_name("inferop")
        argv = [str(inferop), "rollout", action, name, "-n", MODELS, *args]
        done = subprocess.run(argv, env=self.plane.drill.env, capture_output=True, text=True, timeout=60, check=False)
        took = re.search(r", ([0-9.]+) s after the patch\)", done.stdout)
        log.info("inferop rollout %s: %s%s", action, done.stdout.strip(), done.stderr.strip())
        return {"exit": done.returncode, "seconds": float(took.group(1)) if took else None}

    def steer(self) -> dict[str, Any]:
        """A user steering a rollout with `inferop rollout`: the first step holds until promoted (a pause without
        seconds); promote ends it; at 100% abort; retry starts the candidate again; held again at the first step,
        promote --full skips the rest. Each taken up within one reconcile (STEERED_SECONDS), no caller failing."""
        name = "steer"
        weight = self.settings.steps[0]
        rollout = self.settings.rollout(pauses=[{"atWeight": weight}])
        seen: dict[str, Any] = {}
        with self.service(name, rollout) as observer:
            traffic = self.traffic(name)
            time.sleep(3)
            changed = self.change(name, {"batching": {"maxQueueDelayMicroseconds": 0}})

            def held() -> dict[str, Any]:
                return wait_for(
                    lambda: (s := observer.state()).get("reason") == "PausedAtStep" and s,
                    "the first step held by its pause", self.timeout(),
                )  # fmt: skip

            first = held()
            time.sleep(self.settings.interval_seconds)  # held past its time: it does not move on by itself
            seen["held_past_its_step"] = observer.state().get("reason") == "PausedAtStep"
            seen["promote"] = self.steered(name, "promote")
            wait_for(lambda: observer.state().get("weight") == 100, "the last step", self.timeout())
            seen["abort"] = self.steered(name, "abort")
            observer.final(self.timeout())
            seen["retry"] = self.steered(name, "retry")
            held()
            seen["promote_full"] = self.steered(name, "promote", "--full")
            final = observer.final(self.timeout())
            outcomes = traffic.stop()
        actions = ("promote", "abort", "retry", "promote_full")
        taken = {a: seen[a]["exit"] == 0 and (seen[a]["seconds"] or math.inf) < STEERED_SECONDS for a in actions}
        return {
            "held_at": {"step": first.get("step"), "weight": first.get("weight")}, "final": final.get("phase"),
            "steered": {a: seen[a] for a in actions}, "callers": callers([s for s in outcomes if s.at >= changed]),
            "transitions": relative(observer.transitions, changed),
            "goals": goals(
                ("the first step holds past its time until promoted", seen["held_past_its_step"]),
                *((f"{a.replace('_', ' --')} taken up within {STEERED_SECONDS:g} s", taken[a]) for a in actions),
                ("then promoted", final.get("phase") == "Succeeded"),
                ("no caller fails", callers([s for s in outcomes if s.at >= changed])["failed"] == 0),
            ),
        }  # fmt: skip

    def scaled(self) -> Drill:
        """This drill with CAPACITY_REPLICAS stable pods, each requesting less CPU, so that both fleets fit the node."""
        return Drill(self.plane, self.models, replace(self.settings, replicas=CAPACITY_REPLICAS, cpu_request="100m"))

    def pods_beside(self, track: str) -> Callable[[str, Observer], dict[str, Any]]:
        """Beside a rollout: the `track`'s Deployment's wanted and Ready pods (as its status says them) at each change
        of them or of the weight, until the candidate is promoted or rolled back."""

        def watch(service: str, observer: Observer) -> dict[str, Any]:
            seen: list[dict[str, Any]] = []
            deployment = service + (CANDIDATE_SUFFIX if track == "candidate" else "")
            while True:
                state = observer.state()
                try:
                    found = self.plane.cluster.get("apps/v1", "Deployment", deployment, MODELS)
                except NotFoundError:  # the candidate's, before it is made
                    found = {}
                now = {
                    "phase": state.get("phase"), "weight": state.get("weight"),
                    "wanted": (found.get("spec") or {}).get("replicas"),
                    "ready": (found.get("status") or {}).get("readyReplicas", 0),
                }  # fmt: skip
                if not seen or {k: v for k, v in seen[-1].items() if k != "at"} != now:
                    seen.append({"at": round(time.monotonic(), 1), **now})
                if state.get("phase") in ("Finishing", *ENDED):
                    return {track: seen}
                time.sleep(0.25)

        return watch

    def capacity(self) -> dict[str, Any]:
        """The stable pods follow the weight: CAPACITY_REPLICAS of them, a good candidate at 34, 67 and 100%, no
        headroom, each step's share taken CAPACITY_DELAY seconds after it: 2, 1 and 1 pods (one stays at 100%)."""
        drill, name = self.scaled(), "capacity"
        steps = [34, 67, 100]
        rollout = drill.settings.rollout(
            steps=steps, scaleDown={"delaySeconds": CAPACITY_DELAY, "headroomPercent": 0}
        )  # fmt: skip
        run = drill.roll(
            name, {"batching": {"maxQueueDelayMicroseconds": 0}}, rollout, during=self.pods_beside("stable")
        )
        assert run.seen is not None
        seen = run.seen["stable"]
        wanted = {w: stable_share(CAPACITY_REPLICAS, w, 0) for w in steps}
        reached = {w: any(s["weight"] == w and s["wanted"] == wanted[w] for s in seen) for w in steps}
        progressing = [s for s in seen if s["phase"] in ("Progressing", "Paused")]
        never_below = all(s["wanted"] >= wanted.get(s["weight"], CAPACITY_REPLICAS) for s in progressing)
        return run.report(
            stable_pods=seen,
            wanted=wanted,
            goals=goals(
                ("promoted", run.final.get("phase") == "Succeeded"),
                (f"the stable pods follow the weight: {wanted}", all(reached.values())),
                ("never fewer than the weight's share", never_below),
                ("no caller fails", run.callers["failed"] == 0),
            ),
        )

    def capacity_slow(self) -> dict[str, Any]:
        """The slow build with the stable pods scaled down to its weight's share at once (no delay, no headroom): its
        rollback keeps its weight until the stable pods are back at full size and Ready, so no caller fails."""
        drill, name = self.scaled(), "capacity-slow"
        rollout = drill.settings.rollout(steps=[67, 100], scaleDown={"delaySeconds": 0, "headroomPercent": 0})
        slow = {**self.model_with(weights="random (seed 0), slow build"), **fault(INFEROP_FAULT_SLOWDOWN=SLOWDOWN)}
        run = drill.roll(name, slow, rollout, during=self.pods_beside("stable"))
        assert run.seen is not None
        seen = run.seen["stable"]
        scaled_down = any(s["wanted"] == 1 and s["weight"] == 67 for s in seen)
        first_off = next((s for s in seen if s["phase"] == "RollingBack" and s["weight"] == 0), None)
        return run.report(
            stable_pods=seen,
            goals=goals(
                ("rolled back by its analysis", run.rolled_back_by("AnalysisFailed")),
                ("the stable pods were down to one at 67%", scaled_down),
                (
                    f"its weight went to 0 only with {CAPACITY_REPLICAS} stable pods Ready",
                    first_off is not None and first_off["ready"] >= CAPACITY_REPLICAS,
                ),
                ("no caller fails", run.callers["failed"] == 0),
            ),
        )

    def wrong(self) -> dict[str, Any]:
        other = {
            **self.models.spec["model"],
            "storageUri": f"hostpath://{self.models.other}",
            "weights": "random (seed 7)",
        }
        return self.refused("wrong", other)

    def near(self) -> dict[str, Any]:
        nudged = {
            **self.models.spec["model"],
            "storageUri": f"hostpath://{self.models.near}",
            "weights": f"random (seed 0), policy nudged to {NEAR_AGREEMENT} agreement",
        }
        return self.refused("near", nudged, measured_agreement=round(self.models.near_agreement, 4))

    def refused(self, name: str, model: dict[str, Any], **figures: Any) -> dict[str, Any]:
        """A candidate the agreement check must refuse: rolled back with the policy's bound in its reason, no live
        request reaching it, no caller failing."""
        run = self.roll(name, {"model": model})
        checked = run.final.get("agreement") or {}
        # The check's requests: its inputs, batch by batch, as many as its sequential test needed.
        requests = math.ceil(checked.get("samples", 0) / self.models.spec["batching"]["maxBatchSize"])
        live = run.observer.received("canary") - requests
        policy: dict[str, Any] = next((o for o in checked.get("outputs", []) if o["name"] == "policy"), {})
        return run.report(
            **figures,
            agreement_inputs=checked.get("samples"),
            policy=policy,
            candidate_live_requests=live,
            goals=goals(
                ("refused by the agreement check", run.rolled_back_by("Disagrees")),
                (
                    "the refusal states the bound",
                    "bound" in policy and f"bound {policy['bound']:.4f}" in (run.final.get("message") or ""),
                ),
                ("never receives a live request", live == 0),
                ("no caller fails", run.callers["failed"] == 0),
            ),
        )

    @contextmanager
    def held(
        self,
        name: str,
        rollout: dict[str, Any],
        change: dict[str, Any],
        before: Callable[[Observer], None] = lambda observer: None,
        after: Callable[[Observer], None] = lambda observer: None,
    ) -> Iterator[Observer]:
        """The service (`before` runs once it serves), then changed, its candidate held at its first step
        (spec.rollout.paused) with that step's traffic in effect; aborted afterwards, then `after` runs."""
        with self.service(name, {**rollout, "paused": True}) as observer:
            before(observer)
            self.change(name, change)
            wait_for(
                lambda: (s := observer.state()).get("stepStartedAt") and s.get("step") == 0,
                f"{name}'s first step in effect",
                120,
                lambda: json.dumps(observer.state())[:2000],
            )
            yield observer
            self.plane.patch_service(name, {"rollout": {"abort": observer.state()["candidate"]}})
            observer.final(60)
            after(observer)

    @contextmanager
    def gateway_beside_stable(self) -> Iterator[None]:
        """Envoy and the callers on the stable track's CPU, away from the candidate's: on a cluster the candidate's
        pods run on nodes of their own, and the gateway in front of every caller runs beside neither (otherwise here
        the gateway and the callers share a CPU with the candidate's work on the mirrored copies)."""
        stable, node = track_cpu(COMPONENTS["stable"]), self.plane.drill.node
        if stable is None or node is None:
            raise RuntimeError(f"no CPU of the stable track's ({stable}) or no node")
        envoy = self.plane.envoy_pod()["metadata"]["uid"]
        node.site.pin_pod(envoy, str(stable))
        self.callers_cpus = frozenset({stable})
        try:
            yield
        finally:
            self.callers_cpus = None
            node.site.pin_pod(envoy, ",".join(map(str, sorted(os.sched_getaffinity(0)))))

    def burst(self, name: str, mix: Mix, seconds: float) -> list[Sent]:
        """Traffic for `seconds`, then until every answer is in."""
        traffic = self.traffic(name, mix)
        time.sleep(seconds)
        outcomes = traffic.stop()
        time.sleep(2)  # the last mirrored copies reach the candidate, the last scrape needs none: counts are read
        return outcomes

    def shadow(self) -> dict[str, Any]:
        """Two services, each with a candidate held at 0%: one mirrors 20% of its live requests to its candidate,
        the other routes to its candidate only header-matched requests, which no caller here sends. Windows alternate
        between them, so what a rollout in flight costs this machine (the candidate's pods, their scrapes, the
        analysis, the operator's ticks) falls on both alike, and what differs is the mirror."""
        seconds, pairs = 15.0, 6
        plain = [(self.boards["plain"], 1.0)]
        change = {"batching": {"maxQueueDelayMicroseconds": 0}}
        mirroring = self.settings.rollout(steps=[0, 100], shadow={"percent": 20})
        not_mirroring = self.settings.rollout(steps=[0, 100], header=HEADER)
        no_rollout: list[list[Sent]] = []  # the mirroring service before its change and after its abort

        def without_rollout(observer: Observer) -> None:
            no_rollout.append(self.burst("shadow", plain, seconds))

        sent: dict[str, list[Sent]] = {"mirrored": [], "unmirrored": []}
        counted = {side: {"stable": 0.0, "candidate": 0.0, "stable_us": 0.0} for side in sent}
        with (
            self.gateway_beside_stable(),
            self.held("shadow", mirroring, change, without_rollout, without_rollout) as mirrored,
            self.held("unmirrored", not_mirroring, change) as unmirrored,
        ):
            for _ in range(pairs):
                for side, name, observer in (
                    ("mirrored", "shadow", mirrored),
                    ("unmirrored", "unmirrored", unmirrored),
                ):
                    observer.sample()
                    first = (observer.received("predictor"), observer.received("canary"))
                    first_time = observer.server_time(COMPONENTS["stable"])[1]
                    sent[side] += self.burst(name, plain, seconds)
                    observer.sample()
                    counted[side]["stable"] += observer.received("predictor") - first[0]
                    counted[side]["candidate"] += observer.received("canary") - first[1]
                    counted[side]["stable_us"] += observer.server_time(COMPONENTS["stable"])[1] - first_time
        shadowed, unshadowed = callers(sent["mirrored"]), callers(sent["unmirrored"])
        mirrored_sent = len(sent["mirrored"])
        share = counted["mirrored"]["candidate"] / mirrored_sent if mirrored_sent else 0.0
        p99_ratio = shadowed["p99_ms"] / unshadowed["p99_ms"] if shadowed["p99_ms"] and unshadowed["p99_ms"] else None
        idle = [callers(window)["p99_ms"] for window in no_rollout]
        return {
            "sent": mirrored_sent, "mirrored_to_candidate": counted["mirrored"]["candidate"], "share": round(share, 4),
            "answered_by_stable": counted["mirrored"]["stable"], "callers": shadowed,
            "callers_without_the_mirror": unshadowed,
            "candidate_received_without_the_mirror": counted["unmirrored"]["candidate"],
            "stable_p99_ratio": None if p99_ratio is None else round(p99_ratio, 3),
            # Reported, not goals: the stable pods' own time a request on each side, and the callers' p99 with no
            # rollout in flight (before the change and after the abort), where the machine also runs no candidate.
            "stable_server_ms_a_request": {
                side: round(c["stable_us"] / c["stable"] / 1e3, 3) if c["stable"] else None
                for side, c in counted.items()
            },
            "p99_ms_without_a_rollout_before_and_after": idle,
            "goals": goals(
                ("the candidate receives 20% +- 3% of live requests", 0.17 <= share <= 0.23),
                (
                    "callers get no answer from it (every request answered by the stable pods)",
                    counted["mirrored"]["stable"] == mirrored_sent,
                ),
                ("no caller fails", shadowed["failed"] == unshadowed["failed"] == 0),
                (
                    "stable p99 within 10% of no shadow (the same rollout without the mirror, windows alternating)",
                    p99_ratio is not None and p99_ratio <= 1.10,
                ),
            ),
        }  # fmt: skip

    def header(self) -> dict[str, Any]:
        name = "header"
        rollout = self.settings.rollout(steps=[0, 100], header=HEADER)
        with self.held(name, rollout, {"batching": {"maxQueueDelayMicroseconds": 0}}) as observer:
            observer.sample()
            before = (observer.received("predictor"), observer.received("canary"))
            outcomes = self.burst(name, [(self.boards["header"], 0.5), (self.boards["plain"], 0.5)], 15.0)
            observer.sample()
            stable = observer.received("predictor") - before[0]
            candidate = observer.received("canary") - before[1]
        with_header = sum(1 for s in outcomes if s.request == "header")
        without = len(outcomes) - with_header
        return {
            "with_header": with_header, "without_header": without, "candidate_received": candidate,
            "stable_received": stable, "callers": callers(outcomes),
            "goals": goals(
                ("100% of requests with the header reach the candidate", candidate == with_header),
                ("0% of requests without it do", stable == without),
            ),
        }  # fmt: skip

    def pipeline(self) -> dict[str, Any]:
        """Inception V3 behind its image pipeline, a change of its serving config: the agreement check compares the
        revisions' top labels on photographs, live callers send a JPEG, and a fifth of the requests are bytes that
        are no image sent with the header, so the candidate answers them all (400). Its ensemble counts each as a
        failure, twice; the analysis counts the members' failures, so the candidate is promoted (without that, the
        ablation, the 400s are its failures and roll it back). Its NetworkPolicy lets only the gateway's Envoy call
        the pods (the operator and Prometheus run on the node, which policies let through): a pod beside them, in
        the services' namespace, is refused at their http port while the rollout runs."""
        from inferop_core.tritonconfig import pipeline_members
        from inferop_export.pipeline import encodings, photographs

        spec = self.models.pipeline_spec()
        ensemble = spec["model"]["name"]
        photo = image_request("photo", encodings(photographs()["chelsea"])["jpeg75x1"])
        refused = image_request("not-an-image", NOT_AN_IMAGE, {HEADER["name"]: HEADER["value"]})
        spec.update(
            replicas=self.settings.replicas,
            # each track's pods on a CPU of their own (track_cpu), both tracks' and the gateway's fitting the node's
            resources={"requests": {"cpu": self.settings.cpu_request}, "limits": {"cpu": "1"}},
            # images reach the pods through the gateway's admission only: a caller beside it is refused
            networkPolicy={"enabled": True, "inferenceFrom": "gateway"},
        )
        live = [(photo, 1 - NOT_AN_IMAGE_SHARE), (refused, NOT_AN_IMAGE_SHARE)]
        served = Served(ensemble, spec, photo, live, PIPELINE_RATE)
        # steps where each track answers minRequests photographs in an interval at this rate
        interval = max(self.settings.interval_seconds, 10)
        analysis = {"intervalSeconds": interval, "minRequests": self.settings.min_requests}
        # An agreement test of 24 photographs for an identical model: the default's (0.99 within 0.01) took 591 and
        # 186 s here, beyond the drill's time for a rollout; what this checks is that it compares the top labels.
        agreement_test = {"minAgreement": 0.9, "tolerance": 0.2}
        rollout = self.settings.rollout(
            steps=[50, 100], stepSeconds=2 * interval, analysis=analysis, header=HEADER, agreement=agreement_test
        )

        def beside(name: str, observer: Observer) -> dict[str, str]:
            addresses = [p["status"]["podIP"] for p in self.plane.triton_pods(name) if p["status"].get("podIP")]
            return self.plane.caller_beside(addresses, HTTP_PORT)

        change = {"batching": {"maxQueueDelayMicroseconds": 0}}
        run = self.roll("pipeline", change, rollout, during=beside, served=served)
        photos = [s for s in run.outcomes if s.request == "photo"]
        bad = [s for s in run.outcomes if s.request == "not-an-image"]
        said = [s for s in bad if s.message.startswith("400") and "not a JPEG or PNG image" in s.message]
        agreement = run.final.get("agreement") or {}
        failed = [a for a in run.observer.analyses if a["verdict"] == "Failed"]
        met = run.seen or {}
        return run.report(
            members=list(pipeline_members(ensemble).values()),
            photographs=callers(photos),
            not_an_image={"sent": len(bad), "answered_400_naming_it": len(said)},
            agreement={key: agreement.get(key) for key in ("passed", "samples", "inputs", "seconds", "message")},
            caller_beside_the_gateway=met,
            goals=goals(
                ("promoted to 100% automatically", run.final["phase"] == "Succeeded"),
                ("the agreement check passed on the pipeline's answers to photographs",
                 bool(agreement.get("passed")) and (agreement.get("samples") or 0) > 0),
                ("every photograph answered", bool(photos) and callers(photos)["failed"] == 0),
                ("every byte string that is no image answered 400, saying so", bool(bad) and len(said) == len(bad)),
                ("every analysis passed, the refused requests beside the photographs", not failed),
                ("a pod beside the service, not the gateway, refused at every pod's http port",
                 bool(met) and set(met.values()) == {"refused"}),
            ),
        )  # fmt: skip

    def second(self) -> dict[str, Any]:
        """Two rollouts back to back; the second starts from nothing, and neither leaves a route behind."""
        name = "second"
        with self.service(name, self.settings.rollout()) as observer:
            traffic = self.traffic(name)
            time.sleep(3)
            self.change(name, {"batching": {"maxQueueDelayMicroseconds": 0}})
            first = observer.final(self.timeout())
            # A change that leaves the time per request as it is: the second candidate is neither better nor worse.
            changed = self.change(name, {"timeouts": {"requestSeconds": 5}})
            wait_for(lambda: observer.state().get("phase") not in ("Succeeded",), "the second rollout to start", 30)
            second = observer.final(self.timeout())
            outcomes = traffic.stop()
            route = self.plane.route(name) or {}
            time.sleep(DRAIN_SECONDS)  # Envoy has applied the route the rollout ended with
            observer.sample()
            before = (observer.received("predictor"), observer.received("canary"))
            after_both = self.burst(name, [(self.boards["plain"], 1.0)], 5.0)
            observer.sample()
            served = (observer.received("predictor") - before[0], observer.received("canary") - before[1])
        later = [t for t in observer.transitions if t["at"] >= changed]
        weights = [t["weight"] for t in later if t["phase"] in ("Agreement", "Progressing")]
        rules = route.get("spec", {}).get("rules", [])
        backends = [(b["name"], b.get("weight")) for rule in rules for b in rule.get("backendRefs", [])]
        matched = [m for rule in rules for m in rule.get("matches", []) if m.get("headers")]
        clean = {n for n, _ in backends} == {name} and not matched and not any(rule.get("filters") for rule in rules)
        leftovers = [p for p in self.pods_of(name) if "canary" in p]
        return {
            "first": first.get("phase"), "second": second.get("phase"), "weights_of_the_second": weights,
            "reason": second.get("reason"), "message": second.get("message"), "analyses": observer.analyses,
            "route_rules_after": rules, "callers": callers([s for s in outcomes if s.at >= changed]),
            "afterwards": {"sent": len(after_both), "stable": served[0], "candidate": served[1]},
            "goals": goals(
                ("both promoted", first.get("phase") == second.get("phase") == "Succeeded"),
                ("the second starts from 0%, not from the first's 100%", bool(weights) and weights[0] == 0),
                ("no stale route: every backend the stable Service; no match, no mirror", clean),
                (
                    "through Envoy afterwards, every request answered by the stable pods",
                    served == (len(after_both), 0) and callers(after_both)["failed"] == 0,
                ),
                ("no candidate pod left", not leftovers),
            ),
        }  # fmt: skip

    def kill(self) -> dict[str, Any]:
        """The operator SIGKILLed with the candidate at a random moment of a random step after the first, where
        traffic is split (three steps at least, in the quick run too): it resumes at that step."""
        name = "kill"
        steps = self.settings.steps if len(self.settings.steps) >= 3 else KILL_STEPS
        chance = random.Random()
        step = chance.randrange(1, len(steps) - 1)
        into_step = chance.uniform(0.0, 0.8) * self.settings.step_seconds
        with self.service(name, self.settings.rollout(steps=steps)) as observer:
            traffic = self.traffic(name)
            time.sleep(3)
            changed = self.change(name, {"batching": {"maxQueueDelayMicroseconds": 0}})
            wait_for(
                lambda: (s := observer.state()).get("step") == step and s.get("stepStartedAt"),
                f"step {step + 1} in effect",
                self.timeout(),
            )
            time.sleep(into_step)
            before = observer.state()
            route_before = (self.plane.route(name) or {}).get("spec")
            self.plane.operator.kill()
            killed = time.monotonic()
            time.sleep(3)
            self.plane.operator.start()
            time.sleep(2 * TICK_SECONDS)
            after = observer.state()
            route_after = (self.plane.route(name) or {}).get("spec")
            final = observer.final(self.timeout())
            outcomes = traffic.stop()
        resumed = [t for t in observer.transitions if t["at"] >= killed]
        restarted = any(
            t["phase"] == "Agreement" or (t["weight"] or 0) < (before["weight"] or 0)
            for t in resumed
            if t["phase"] not in ("Finishing", "Succeeded")
        )
        resumed_there = (after.get("step"), after.get("weight")) == (before.get("step"), before.get("weight"))
        return {
            "killed_at": {"step": before.get("step"), "weight": before.get("weight"),
                          "seconds_into_step": round(into_step, 1)},
            "after_restart": {"step": after.get("step"), "weight": after.get("weight"), "phase": after.get("phase")},
            "final": final.get("phase"), "callers": callers([s for s in outcomes if s.at >= changed]),
            "transitions": relative(observer.transitions, changed),
            "goals": goals(
                ("resumes at the step it was killed at (no jump to 0% or 100%)", resumed_there and not restarted),
                ("the route keeps its weights across the restart", route_before == route_after),
                ("then promoted", final.get("phase") == "Succeeded"),
            ),
        }  # fmt: skip

    def blind(self) -> dict[str, Any]:
        """Prometheus stopped mid-rollout: the rollout pauses and holds its traffic; back, it goes on."""
        name = "blind"
        limit = self.settings.interval_seconds + 2 * TICK_SECONDS
        with self.service(name, self.settings.rollout()) as observer:
            traffic = self.traffic(name)
            time.sleep(3)
            changed = self.change(name, {"batching": {"maxQueueDelayMicroseconds": 0}})
            wait_for(lambda: observer.state().get("stepStartedAt"), "the first step in effect", self.timeout())
            weight = observer.state().get("weight")
            self.plane.prometheus.stop()
            stopped = time.monotonic()
            paused = wait_for(
                lambda: (s := observer.state()).get("reason") == "PrometheusUnreachable" and s,
                "the rollout to pause",
                limit + 20,
            )
            pause_seconds = time.monotonic() - stopped
            time.sleep(2 * self.settings.step_seconds)  # longer than a step: it must not move on blind
            held = observer.state()
            self.plane.prometheus.start()
            final = observer.final(self.timeout())
            outcomes = traffic.stop()
        return {
            "paused_after_seconds": round(pause_seconds, 1), "paused": paused.get("phase"),
            "weight_while_blind": held.get("weight"), "final": final.get("phase"),
            "callers": callers([s for s in outcomes if s.at >= changed]),
            "transitions": relative(observer.transitions, changed),
            "goals": goals(
                (f"pauses within an interval of Prometheus stopping (+2 ticks: {limit:g} s)", pause_seconds <= limit),
                ("holds its weight while blind, for two steps", (held["phase"], held["weight"]) == ("Paused", weight)),
                ("goes on once Prometheus is back, and is promoted", final.get("phase") == "Succeeded"),
            ),
        }  # fmt: skip


@dataclass
class Run:
    """One rollout under live traffic: what the observer saw and what callers got from the change on."""

    observer: Observer
    outcomes: list[Sent]
    changed: float
    final: dict[str, Any]
    admission: dict[str, Any] | None = None  # Drill.admission, before the change
    seen: dict[str, Any] | None = None  # what `during` found beside the rollout
    envoy: dict[str, int] = field(default_factory=dict)  # ENVOY_CHURN's increase from the change to the end

    @property
    def callers(self) -> dict[str, Any]:
        return callers(self.outcomes)

    def failed_near(self, moments: list[float], seconds: float = 2.0) -> list[Sent]:
        return [s for s in self.outcomes if s.kind != "ok" and any(abs(s.at - t) <= seconds for t in moments)]

    def rolled_back_by(self, reason: str) -> bool:
        return self.final.get("phase") == "RolledBack" and self.final.get("reason") == reason

    def exposed_to_rollback(self) -> float | None:
        """Seconds from the step whose traffic was in effect when it failed to the rollback."""
        transitions = self.observer.transitions
        back = next((i for i, t in enumerate(transitions) if t["phase"] == "RollingBack"), None)
        if back is None:
            return None
        started = [t for t in transitions[:back] if t["stepStartedAt"] is not None]
        return round(transitions[back]["at"] - started[-1]["at"], 1) if started else None

    def report(self, goals: list[dict[str, Any]], **figures: Any) -> dict[str, Any]:
        return {
            "final": self.final.get("phase"),
            "reason": self.final.get("reason"),
            "message": self.final.get("message"),
            "callers": self.callers,
            **figures,
            "transitions": relative(self.observer.transitions, self.changed),
            "analyses": self.observer.analyses,
            "goals": goals,
        }


def relative(transitions: list[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    return [{**t, "at": round(t["at"] - since, 1)} for t in transitions]


def goals(*checks: tuple[str, bool]) -> list[dict[str, Any]]:
    return [{"text": text, "met": bool(met)} for text, met in checks]


@dataclass(frozen=True)
class Ablation:
    """A scenario again with what makes its goal removed: safeguards of the operator (INFEROP_ROLLOUT_ABLATE,
    rollout.SAFEGUARDS) or sections of its rollout changed (`rollout`). Its goal then must fail: the goal
    `must_fail` names (by its first words), or any."""

    scenario: str
    removed: str
    safeguards: tuple[str, ...] = ()
    rollout: dict[str, dict[str, Any]] = field(default_factory=dict)
    must_fail: str = ""

    def run(self, drill: Drill) -> dict[str, Any]:
        """The scenario without what this removes; one that never ends (a rollout held for ever) fails its goals,
        while any other error (a setup that timed out) fails the ablation itself."""
        with drill.without(self) as ablated:
            try:
                found = SCENARIOS[self.scenario](ablated)
                kept = [g for g in found["goals"] if g["text"].startswith(self.must_fail)]
            except NeverEnded as never:  # held for ever: whatever its goals were, they were not met in time
                said = dict(re.findall(r'"(phase|reason|weight)": "?(\w+)', str(never))[::-1])  # the first of each
                held = ", ".join(f"{key} {said[key]}" for key in ("phase", "reason", "weight") if key in said)
                found = {"error": str(never)[:4000], "goals": goals((f"the rollout ends (it did not: {held})", False))}
                kept = found["goals"]
        failed = [g["text"][:200] for g in kept if not g["met"]]
        return {
            **{key: value for key, value in found.items() if key != "goals"},
            "removed": self.removed,
            "goals_with_it_removed": found["goals"],
            "goals": goals(
                (f"without {self.removed}, its goal fails: {'; '.join(failed) or 'none did'}", bool(failed))
            ),
        }


GATES_OFF = {"maxLatencyRatio": 100, "maxP99Ratio": 100, "maxFailureRatioIncrease": 1}  # each at its most


def gates_off(*gates: str) -> dict[str, dict[str, Any]]:
    """The rollout's analysis with `gates` at their most: what they would fail, they pass."""
    return {"analysis": {gate: GATES_OFF[gate] for gate in gates}}


WITHIN = "back at weight 0 within"
ABLATIONS = {
    "slow": Ablation("slow", "the latency gates", rollout=gates_off("maxLatencyRatio", "maxP99Ratio")),
    "p99": Ablation("p99", "the p99 gate", rollout=gates_off("maxP99Ratio")),
    "failing": Ablation(
        "failing", "the failure gate", rollout=gates_off("maxFailureRatioIncrease"), must_fail="failed requests"
    ),
    "crash": Ablation(
        "crash", "judging failures outside Triton", ("pod-failures", "gateway-failures"), must_fail=WITHIN
    ),
    "gateway_503": Ablation("gateway_503", "the gateway's figures", ("gateway-failures",), must_fail=WITHIN),
    "oom": Ablation(
        "oom", "the latency gates and the pods' failures", ("pod-failures",),
        gates_off("maxLatencyRatio", "maxP99Ratio"), must_fail=WITHIN,
    ),
    "late": Ablation("late", "the sliding window", ("sliding-window",), must_fail=WITHIN),
    "starting": Ablation(
        "starting", "waiting for the candidate's Ready pods", ("ready-pods",), must_fail="every weight had"
    ),
    "capacity": Ablation("capacity", "the stable pods following the weight", rollout={"scaleDown": {"enabled": False}}),
    "capacity_slow": Ablation("capacity_slow", "the stable pods back first", ("stable-first",)),
    "pipeline": Ablation(
        "pipeline", "counting the pipeline members' failures", ("member-failures",), must_fail="promoted"
    ),
}  # fmt: skip
assert all(name in SAFEGUARDS for ablation in ABLATIONS.values() for name in ablation.safeguards)

SCENARIOS: dict[str, Callable[[Drill], dict[str, Any]]] = {
    "good": Drill.good,
    "slow": Drill.slow,
    "p99": Drill.p99,
    "failing": Drill.failing,
    "crash": Drill.crash,
    "gateway_503": Drill.gateway_503,
    "oom": Drill.oom,
    "late": Drill.late,
    "starting": Drill.starting,
    "steer": Drill.steer,
    "capacity": Drill.capacity,
    "capacity_slow": Drill.capacity_slow,
    "wrong": Drill.wrong,
    "near": Drill.near,
    "shadow": Drill.shadow,
    "header": Drill.header,
    "second": Drill.second,
    "kill": Drill.kill,
    "blind": Drill.blind,
    "pipeline": Drill.pipeline,
}
SCENARIOS.update({f"{name}_ablated": ablation.run for name, ablation in ABLATIONS.items()})


def run(workdir: Path, quick: bool, chosen: list[str]) -> dict[str, Any]:
    settings = Settings.of(quick)
    models = export_models(workdir)
    env = {"INFEROP_ROLLOUT_TICK_SECONDS": str(TICK_SECONDS)}
    results: dict[str, Any] = {"settings": settings.__dict__, "scenarios": {}}
    with GatewayPlane(workdir / "plane", env) as plane:
        drill = Drill(plane, models, settings)
        for name in chosen:
            log.info("scenario %s", name)
            started = time.monotonic()
            try:
                found = SCENARIOS[name](drill)
            except Exception as error:  # what did not happen in time, or went wrong: this one fails, the others run
                log.exception("scenario %s", name)
                found = {
                    "error": str(error)[:4000],
                    "goals": goals((f"the scenario runs to its end: {error}"[:300], False)),
                }
            results["scenarios"][name] = {**found, "seconds": round(time.monotonic() - started, 1)}
            log.info("scenario %s: %s", name, results["scenarios"][name]["goals"])
        results["operator_tracebacks"] = plane.operator.tracebacks()
    results["met"] = all(g["met"] for s in results["scenarios"].values() for g in s["goals"])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two steps of 15 s (make test's size)")
    add_subset_option(parser, "--scenarios", SCENARIOS)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.add_argument("--workdir", type=Path, default=None, help="kept afterwards (default: a temporary one)")
    args = parser.parse_args(argv)
    chosen: list[str] = args.scenarios
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="inferop-rollout-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        results = run(workdir, args.quick, chosen)
    text = json.dumps(results, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0 if results["met"] else 1


if __name__ == "__main__":
    sys.exit(main())


def run_rollout_drill(root: Path, quick: bool) -> dict[str, Any]:
    """The drill as its own process (it enters the node's network namespace, which this process must not)."""

    figures = root / "rollout.json"
    argv = [sys.executable, "-m", __name__, f"--json={figures}", f"--workdir={root / 'work'}"]
    result = subprocess.run([*argv, *(["--quick"] if quick else [])], check=False, stdout=subprocess.DEVNULL)
    if not figures.exists():
        raise RuntimeError(f"the rollout drill wrote no figures (exit {result.returncode}); its log is on stderr")
    found: dict[str, Any] = json.loads(figures.read_text())
    return found


def format_rollout(result: dict[str, Any]) -> str:
    lines = [
        "### Rollouts through a real gateway",
        "",
        f"Envoy Gateway 1.9.1 and Envoy 1.39.1 in front of real tritonservers, open-loop Poisson traffic at "
        f"{result['settings']['rate']:g} requests/s; steps {result['settings']['steps']} of "
        f"{result['settings']['step_seconds']} s, analysed every {result['settings']['interval_seconds']} s.",
        "",
        "| candidate | outcome | callers | figures | goals |",
        "|---|---|---|---|---|",
    ]
    skip = {
        "goals",
        "transitions",
        "callers",
        "final",
        "reason",
        "message",
        "seconds",
        "error",
        "goals_with_it_removed",
    }
    for name, scenario in result["scenarios"].items():
        outcome = " ".join(str(scenario[key]) for key in ("final", "reason") if scenario.get(key))
        callers_seen = scenario.get("callers") or {}
        seen = (
            f"{callers_seen.get('sent')} sent, {callers_seen.get('failed')} failed, p99 {callers_seen.get('p99_ms')} ms"
        )
        shown = {key: value for key, value in scenario.items() if key not in skip}
        if "dashboard" in shown:  # its figures, not every panel's series
            shown["dashboard"] = {key: value for key, value in shown["dashboard"].items() if key != "panels"}
        figures = "; ".join(f"{key} {value}" for key, value in shown.items())
        met = "<br>".join(f"{'met' if g['met'] else 'NOT MET'}: {g['text']}" for g in scenario["goals"])
        lines.append(f"| {name} | {outcome} | {seen} | {figures} | {met} |")
    return "\n".join(lines)
