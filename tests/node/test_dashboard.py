"""The chart's dashboard on real pods: every query of its Triton and kubelet panels answered with data, in its panel's
unit, by a real Prometheus scraping the operator's Triton pods of a service in mid-rollout (one stable pod under half
a CPU and 2 GiB, one candidate; split by replicas) and the node's kubelet, whose cAdvisor reads their cgroups. The
gateway's panel needs a Gateway: the rollout drill reads it (tests/devtools/test_rollout_dataplane.py)."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferop_devtools.cluster.controlplane import Layout
from inferop_devtools.cluster.node import NodeSite, kubelet_scrape_job
from inferop_devtools.dashboard import PANELS, Panel, evaluate, plausible
from inferop_devtools.gateway.discovery import PodDiscovery
from inferop_devtools.gateway.plane import TRITON_PODS
from inferop_devtools.prometheus import Prometheus
from inferop_operator.identity import COMPONENTS, INSTANCE
from tests.helpers import ExportedRepo, wait_for
from tests.kube.helpers import RESYNC_SECONDS
from tests.node.helpers import INFEROP, Cluster, one_cpu
from tests.runtime.test_triton import infer, sample

pytestmark = pytest.mark.integration

NAME = "dash"
TRACK = "app_kubernetes_io_component"
TRACKS = set(COMPONENTS.values())
# Half a CPU: one caller of Inception V3 keeps a pod at its limit.
RESOURCES = {"requests": {"cpu": "250m", "memory": "2Gi"}, "limits": {"cpu": "500m", "memory": "2Gi"}}
MEMORY_LIMIT = 2 * 2**30
# Scrapes every 2 s, so that each may take 2 s (a scrape's timeout is at most its interval): a pod at its CPU limit
# answers its metrics slowly, and a scrape that times out leaves a gap in its series.
SCRAPE_SECONDS = 2
# The kubelet's cAdvisor reads the cgroups every 10 s (its --housekeeping-interval): the panels' rates span three
# of its readings, as Grafana's $__rate_interval would at this $__interval.
INTERVAL_SECONDS = 28
STABLE_CALLS = 3  # each caller sends this many calls to the stable pod for every one to the candidate
CALLERS = 3
VARIABLES = {"$namespace": "default", "$service": NAME}


def manifest(model_repo: ExportedRepo) -> dict[str, Any]:
    """Inception V3 at half a CPU, two replicas and a rollout that holds its first step (half the pods each), with
    an agreement check that a few inputs decide (both revisions are the same model)."""
    agreement = {"minAgreement": 0.5, "tolerance": 0.45, "maxSamples": 50}
    rollout = {"steps": [50, 100], "paused": True, "agreement": agreement}
    found = one_cpu(NAME, model_repo, "inception_v3", {"rollout": rollout})
    found["spec"] |= {"replicas": 2, "resources": RESOURCES}
    return found


@pytest.fixture
def in_the_node(kube: Cluster) -> Iterator[NodeSite]:
    """This thread in the node's network, as a host-network process of the node: Prometheus, the operator and the
    callers started meanwhile run there, and reach the pods' addresses."""
    site = NodeSite.of(kube.state_dir)
    with site.network():
        yield site


def answered(prometheus: Prometheus, pods: set[str], panel: Panel) -> dict[str, dict[str, float]] | None:
    """The panel's queries once every one has data, with a series for each track where its legend shows the track
    and for each of `pods` where it shows the pod (the kubelet reads each pod's cgroups on a tick of its own)."""
    found = evaluate(prometheus, panel, VARIABLES, INTERVAL_SECONDS, SCRAPE_SECONDS)

    def whole(legend: str, series: dict[str, float]) -> bool:
        return (
            bool(series)
            and (TRACK not in legend or set(series) == TRACKS)
            and (legend != "{{pod}}" or set(series) >= pods)
        )

    complete = all(whole(legend, series) for legend, series in found.items())
    return found if found and complete else None


def at_the_step(kube: Cluster) -> bool:
    """Whether the rollout holds its first step: the agreement check passed and the split is in effect."""
    service = json.loads(kube.run("get", "infsvc", NAME, "-o", "json"))
    rollout = (service.get("status") or {}).get("rollout") or {}
    return bool(rollout.get("stepStartedAt")) and rollout.get("weight") == 50


def test_every_panel_answers_in_its_unit_on_real_pods(
    kube: Cluster, in_the_node: NodeSite, model_repo: ExportedRepo, tmp_path: Path
) -> None:
    control = Layout(kube.state_dir)
    discovery = PodDiscovery(lambda: json.loads(kube.run("get", "pods", "-A", "-o", "json"))["items"],
                             [TRITON_PODS], tmp_path / "targets")  # fmt: skip
    jobs = [TRITON_PODS.scrape_job(tmp_path / "targets"), kubelet_scrape_job(in_the_node, control)]
    kube.run("apply", "-f", str(Path(__file__).parents[2] / "charts" / "inferop" / "crds"))
    stop = threading.Event()
    with (
        discovery,
        Prometheus([], jobs=jobs, scrape_interval=f"{SCRAPE_SECONDS}s") as prometheus,
        (tmp_path / "operator.log").open("wb") as log,
    ):
        env = {**kube.env, "INFEROP_PROMETHEUS_URL": prometheus.url, "INFEROP_RESYNC_SECONDS": str(RESYNC_SECONDS)}
        operator = subprocess.Popen([*INFEROP, "operator"], env=env, stdout=log, stderr=subprocess.STDOUT)
        callers: list[threading.Thread] = []
        try:
            kube.apply(manifest(model_repo))
            ready = kube.run(
                "wait", "--for=condition=Ready", f"infsvc/{NAME}", "--timeout=180s", check=False, timeout=190
            )
            assert "condition met" in ready, kube.run("describe", "infsvc,pods", check=False)
            kube.run(
                "patch",
                "infsvc",
                NAME,
                "--type=merge",
                "-p",
                '{"spec": {"batching": {"maxQueueDelayMicroseconds": 0}}}',
            )

            def serving() -> dict[str, Any] | None:
                pods = json.loads(kube.run("get", "pods", "-l", f"{INSTANCE}={NAME}", "-o", "json"))["items"]
                ready = {
                    p["metadata"]["labels"]["app.kubernetes.io/component"]: p
                    for p in pods
                    if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                }
                return ready if set(ready) == TRACKS and len(pods) == 2 else None

            pods = wait_for(serving, timeout=240, interval=1, what="one Ready pod of each track")
            wait_for(functools.partial(at_the_step, kube), timeout=240, interval=1, what="the agreement passed")
            stable, candidate = (pods[COMPONENTS[track]]["status"]["podIP"] for track in ("stable", "candidate"))
            urls = [f"{stable}:8000"] * STABLE_CALLS + [f"{candidate}:8000"]
            callers = [threading.Thread(target=call, args=(urls, model_repo, seed, stop)) for seed in range(CALLERS)]
            for caller in callers:
                caller.start()
            # The panels' rates over windows of the callers' calls alone: not the agreement check's, as many on
            # each pod, nor the stable pod the split let go.
            window = max(panel.rate_interval_seconds(INTERVAL_SECONDS, SCRAPE_SECONDS) for panel in PANELS)
            time.sleep(window + SCRAPE_SECONDS)
            figures: dict[str, dict[str, dict[str, float]]] = {
                panel.title: wait_for(
                    functools.partial(answered, prometheus, {pod["metadata"]["name"] for pod in pods.values()}, panel),
                    timeout=120,
                    interval=1,
                    what=f"data for every query of {panel.title!r}",
                )
                for panel in PANELS
                if panel.source != "gateway"
            }
            listed = kube.run("get", "pods", "-o", "wide")  # what ran when the panels were read
        finally:
            stop.set()
            for caller in callers:
                caller.join(timeout=60)
            kube.run("delete", "infsvc", NAME, "--wait=true", check=False, timeout=120)
            operator.terminate()
            operator.wait(timeout=30)
    for panel in PANELS:
        for legend, found in figures.get(panel.title, {}).items():
            assert all(plausible(panel.unit, value) for value in found.values()), (panel.title, legend, found)
    by_outcome = figures["Requests per second by outcome"]
    assert all(value > 0 for value in by_outcome["success {{app_kubernetes_io_component}} {{model}}"].values())
    assert by_outcome["failed {{app_kubernetes_io_component}} {{model}}"] == {"predictor": 0.0, "canary": 0.0}
    share = figures["Traffic share by track"]["share {{app_kubernetes_io_component}}"]
    assert share["predictor"] == pytest.approx(STABLE_CALLS / (STABLE_CALLS + 1), abs=0.1), share
    assert sum(share.values()) == pytest.approx(1.0)
    assert all(
        batch >= 1
        for batch in figures["Achieved batch size"]["batch {{app_kubernetes_io_component}} {{model}}"].values()
    )
    time_in_server = figures["Request time in the server"]["mean {{app_kubernetes_io_component}} {{model}}"]
    parts = figures["Queue and compute time per request"]
    for part in ("queue", "compute"):  # the whole holds its parts
        found = parts[f"{part} {{{{app_kubernetes_io_component}}}} {{{{model}}}}"]
        assert all(time_in_server[track] >= found[track] for track in TRACKS), (part, found)
    # The kubelet's panels: both pods, as its cAdvisor reads their Triton containers' cgroups.
    memory = figures["Memory working set against the limit"]
    assert memory["limit"] == {"": MEMORY_LIMIT}
    names = {pod["metadata"]["name"] for pod in pods.values()}
    assert set(memory["{{pod}}"]) >= names, (memory, listed)
    assert all(2**20 < working_set < MEMORY_LIMIT for working_set in memory["{{pod}}"].values())
    assert figures["Pods serving, by track"]["pods {{app_kubernetes_io_component}}"] == {"predictor": 1, "canary": 1}
    throttled = figures["CPU throttling"]["{{pod}}"]
    assert max(throttled.values()) > 0.5, throttled  # the stable pod, asked for three calls in four


def call(urls: list[str], model_repo: ExportedRepo, seed: int, stop: threading.Event) -> None:
    """Inception V3 at each of `urls` in turn, closed loop, until `stop`."""
    import tritonclient.http as httpclient

    clients = {url: httpclient.InferenceServerClient(url, network_timeout=60) for url in set(urls)}
    try:
        while not stop.is_set():
            for url in urls:
                infer(clients[url], "inception_v3", sample(model_repo, "inception_v3", 1, seed))
    finally:
        for client in clients.values():
            client.close()
