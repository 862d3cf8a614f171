"""A rollout step's analysis (inferop_operator.analysis, progress.analyse): the window each analysis reads, the Envoy
clusters that carry each track's requests through Envoy Gateway, and what is asked of Prometheus about them. Pure:
Prometheus's answers are given, as what its counters would hold (tests/operator/test_rollout_analysis.py asks a
real one about Triton's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import pytest

from inferop_operator import analysis
from inferop_operator.analysis import (
    PrometheusUnreachable,
    cluster_matcher,
    gateway_queries,
    gateway_window,
    route_clusters,
)
from inferop_operator.builders import Routing, Service, build_http_route
from inferop_operator.identity import ROUTE_API, Track
from inferop_operator.plan import plan_service
from inferop_operator.progress import analyse, figures_reader
from inferop_operator.rollout import (
    AnalysisStatus,
    RolloutStatus,
    TrackFigures,
    Traffic,
    analysis_window,
    judge,
    timestamp,
    track_figures,
)
from inferop_operator.spec import GatewayRef, InferenceServiceSpec, Rollout, parse_spec
from tests.specs import CLASSIFIER, raw_spec

T0 = 1_800_000_000.0
ROLLOUT = {"steps": [0, 5, 100], "stepSeconds": 60, "analysis": {"intervalSeconds": 10, "minRequests": 20}}
TRACKS: dict[str, Track] = {"conv-net": "stable", "conv-net-canary": "candidate"}


@dataclass(frozen=True)
class Phase:
    """A stretch of a track's traffic: from `start` (seconds after T0) on, `rate` requests a second, `failing` of them
    failed, each answered in `ms`."""

    start: float
    rate: float
    failing: float = 0.0
    ms: float = 2.0


def counted(phases: list[Phase], now: float) -> Callable[[float], TrackFigures]:
    """One track's figures over the last `seconds` before `now`, as the increases of Triton's counters over that
    window would give them (what Prometheus answers the analysis' queries, without its extrapolation)."""

    def read(seconds: float) -> TrackFigures:
        start, successes, failures, duration_us = now - seconds, 0.0, 0.0, 0.0
        ends = [T0 + phase.start for phase in phases[1:]] + [now]
        for phase, end in zip(phases, ends, strict=True):
            overlap = max(0.0, min(end, now) - max(T0 + phase.start, start))
            answered = phase.rate * overlap
            failures += answered * phase.failing
            successes += answered * (1 - phase.failing)
            duration_us += answered * (1 - phase.failing) * phase.ms * 1000
        return track_figures(successes, failures, duration_us)

    return read


def at_step(started: float = T0, weight: int = 5) -> RolloutStatus:
    return RolloutStatus(
        phase="Progressing", stable="a", candidate="b", step=1, weight=weight, split="gateway",
        step_started_at=timestamp(started),
    )  # fmt: skip


def spec_of(**rollout: object) -> InferenceServiceSpec:
    return parse_spec(raw_spec(rollout={**ROLLOUT, **rollout}))


class TestSlidingWindow:
    """Each analysis reads the last intervalSeconds: a regression late in a long step is judged on what the candidate
    does now, not diluted by what it did before."""

    # 5% of 200 requests a second to the candidate; it starts failing 1 in 20 fifty seconds into the 60 s step.
    CANDIDATE: ClassVar = [Phase(0, 10), Phase(50, 10, failing=0.05)]
    STABLE: ClassVar = [Phase(0, 190)]

    def analysis_at(self, now: float) -> AnalysisStatus:
        tracks = {"candidate": counted(self.CANDIDATE, now), "stable": counted(self.STABLE, now)}
        return analyse(at_step(), spec_of(), lambda track, seconds: tracks[track](seconds), now)

    def test_a_step_whose_last_interval_fails_fails_though_the_whole_step_would_pass(self) -> None:
        spec, now = spec_of(), T0 + 60
        tracks = {"candidate": counted(self.CANDIDATE, now), "stable": counted(self.STABLE, now)}
        analysis = analyse(at_step(), spec, lambda track, seconds: tracks[track](seconds), now)
        assert (analysis.verdict, analysis.check, analysis.window_seconds) == ("Failed", "failureRatio", 10)
        assert (analysis.since, analysis.at) == (timestamp(T0 + 50), timestamp(now))
        assert analysis.candidate is not None and analysis.candidate.failures == 5
        assert "failure ratio +5.00% against the stable revision's (at most +1.00%)" in analysis.message
        # The step since its start, as the analysis read it before: 5 failures in 600, within the 1 point allowed.
        assert spec.rollout is not None
        whole = judge(tracks["candidate"](60), tracks["stable"](60), spec.rollout, 1, 5, 60, now)
        assert whole.verdict == "Passed" and whole.candidate is not None and whole.candidate.failure_ratio == 0.0083

    def test_the_regression_is_caught_within_one_interval_of_its_start(self) -> None:
        verdicts = {after: self.analysis_at(T0 + after).verdict for after in (10, 20, 30, 40, 50, 60)}
        assert verdicts == {10: "Passed", 20: "Passed", 30: "Passed", 40: "Passed", 50: "Passed", 60: "Failed"}

    @pytest.mark.parametrize(
        ("started", "now", "window"),
        [(T0, T0 + 10, (T0, 10)), (T0, T0 + 47, (T0 + 37, 10)), (T0 + 4, T0 + 12, (T0 + 4, 8)), (T0, T0, (T0 - 1, 1))],
        ids=["first", "later", "never-before-the-step", "at-least-a-second"],
    )
    def test_the_window_is_the_last_interval_never_before_the_steps_traffic(
        self, started: float, now: float, window: tuple[float, float]
    ) -> None:
        rollout = Rollout.model_validate(ROLLOUT)
        assert analysis_window(at_step(started), rollout, now) == window

    def test_behind_a_pipeline_the_failures_are_its_members(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Its ensemble counts the images the decoding stage refuses (400s) as failures, twice: its members do not
        (tests/operator/test_rollout_analysis.py shows both on a real tritonserver)."""
        asked: list[str] = []
        monkeypatch.setattr(analysis, "query", lambda url, promql: asked.append(promql) or 2.0)
        spec = parse_spec(raw_spec(model=CLASSIFIER, pipeline={}, rollout=ROLLOUT))
        service = Service("images", "models", "u", spec, plan_service(spec), "nvcr.io/nvidia/tritonserver:25.01-py3")
        figures = figures_reader(service, spec, "http://prometheus:9090", through_gateway=False)("candidate", 10)
        of_models = sorted(
            (promql.split("(")[2].split("{")[0], promql.split('model="')[1].split('"')[0]) for promql in asked
        )
        assert of_models == [
            ("nv_inference_request_duration_us", "inception_v3"),
            ("nv_inference_request_failure", "inception_v3_model"),
            ("nv_inference_request_failure", "inception_v3_post"),
            ("nv_inference_request_failure", "inception_v3_pre"),
            ("nv_inference_request_success", "inception_v3"),
        ]
        assert (figures.requests, figures.failures) == (8, 6)

    def test_no_prometheus_or_one_that_does_not_answer_is_unreachable(self) -> None:
        spec, now = spec_of(), T0 + 10
        blind = analyse(at_step(), spec, None, now)
        assert blind.verdict == "Unreachable" and "INFEROP_PROMETHEUS_URL" in blind.message

        def down(track: Track, seconds: float) -> TrackFigures:
            raise PrometheusUnreachable("Prometheus at http://prometheus:9090 cannot be asked: refused")

        unreachable = analyse(at_step(), spec, down, now)
        assert (unreachable.verdict, unreachable.message, unreachable.window_seconds) == (
            "Unreachable", "Prometheus at http://prometheus:9090 cannot be asked: refused", 10,
        )  # fmt: skip


def routed(traffic: Traffic) -> Service:
    """conv-net through Gateway `public`, its candidate at `traffic` (what either serves makes no route)."""
    ab = {"header": {"name": "x-ab", "value": "b"}, "shadow": {"percent": 20}}
    spec = parse_spec(raw_spec(rollout={**ROLLOUT, **ab}))
    routing = Routing(traffic=traffic, gateway=GatewayRef(name="public", namespace="edge"))
    image, plan = "nvcr.io/nvidia/tritonserver:25.01-py3", plan_service(spec)
    candidate = Service("conv-net", "models", "u", spec, plan, image, "candidate", routing)
    return Service("conv-net", "models", "u", spec, plan, image, routing=routing, candidate=candidate)


def clusters_of(traffic: Traffic) -> dict[Track, list[str]]:
    return route_clusters(build_http_route(routed(traffic), ROUTE_API), "models", TRACKS)


class TestRouteClusters:
    """Envoy Gateway's cluster for each backendRef of the route the operator writes (every one with a filter, so
    each has its own), named as Envoy Gateway v1.9 names them."""

    def test_a_step_a_cluster_a_track_and_the_header_rule_the_candidates(self) -> None:
        assert clusters_of(Traffic(weight=5, header=True)) == {
            "stable": ["httproute/models/conv-net/rule/0/backend/0"],
            "candidate": ["httproute/models/conv-net/rule/0/backend/1", "httproute/models/conv-net/rule/1/backend/0"],
        }

    def test_mirrored_requests_are_the_candidates(self) -> None:
        assert clusters_of(Traffic(weight=0, mirror_percent=20)) == {
            "stable": [f"httproute/models/conv-net/rule/{rule}/backend/{backend}" for rule, backend in STABLE_SLOTS],
            "candidate": ["httproute/models/conv-net/rule/0-mirror-0"],
        }

    def test_no_traffic_to_the_candidate_no_cluster(self) -> None:
        stable = [f"httproute/models/conv-net/rule/{rule}/backend/{backend}" for rule, backend in STABLE_SLOTS]
        assert clusters_of(Traffic()) == {"stable": stable, "candidate": []}


# Without traffic to the candidate, the default rule's two backendRefs and the header-matched rule's are the stable's.
STABLE_SLOTS = [(0, 0), (0, 1), (1, 0)]


class TestGatewayQueries:
    CLUSTERS: ClassVar = ["httproute/models/conv-net/rule/0/backend/0", "httproute/models/conv-net/rule/1/backend/1"]

    def test_exactly_the_tracks_clusters_summed_over_envoys(self) -> None:
        where = f'envoy_cluster_name=~"{"|".join(self.CLUSTERS)}"'
        buckets = f"increase(envoy_cluster_upstream_rq_time_bucket{{{where}}}[10s])"
        assert cluster_matcher(self.CLUSTERS) == where
        assert gateway_queries(self.CLUSTERS, 9.2) == {
            "requests": f"sum(increase(envoy_cluster_upstream_rq_total{{{where}}}[10s]))",
            "unsent": f"sum(increase(envoy_cluster_upstream_rq_pending_failure_eject{{{where}}}[10s]))",
            "errors": f'sum(increase(envoy_cluster_upstream_rq_xx{{{where},envoy_response_code_class="5"}}[10s]))',
            "resets envoy_cluster_upstream_rq_rx_reset": (
                f"sum(increase(envoy_cluster_upstream_rq_rx_reset{{{where}}}[10s]))"
            ),
            "resets envoy_cluster_upstream_cx_connect_fail": (
                f"sum(increase(envoy_cluster_upstream_cx_connect_fail{{{where}}}[10s]))"
            ),
            "time": f"sum by (le) ({buckets})",
        }

    def test_a_name_s_metacharacters_are_escaped(self) -> None:
        assert (
            cluster_matcher(["httproute/m/a.b/rule/0/backend/0"])
            == r'envoy_cluster_name=~"httproute/m/a\\.b/rule/0/backend/0"'
        )

    def test_figures_from_the_answers(self) -> None:
        queries = gateway_queries(self.CLUSTERS, 10)
        resets = queries["resets envoy_cluster_upstream_rq_rx_reset"]
        answers = {queries["requests"]: 200.0, queries["errors"]: 10.0, resets: 4.0}
        histogram = {queries["time"]: {"5": 100.0, "10": 200.0, "+Inf": 200.0}}
        figures = gateway_window(answers.get, histogram.__getitem__, self.CLUSTERS, 10)
        assert figures is not None
        assert (figures.requests, figures.error_ratio, figures.reset_ratio, figures.p99_ms) == (200, 0.05, 0.02, 9.9)
        assert figures.slower_than(7.5) == (10.0, 0.0)

    def test_requests_refused_before_they_were_sent_count(self) -> None:
        """Pods that reset every connection from the gateway: Envoy's upstream_rq_total stays at 0, the requests are
        in upstream_rq_pending_failure_eject, and each is answered 503."""
        queries = gateway_queries(self.CLUSTERS, 10)
        failed = queries["resets envoy_cluster_upstream_cx_connect_fail"]
        answers = {queries["requests"]: 0.0, queries["unsent"]: 85.0, queries["errors"]: 85.0, failed: 85.0}
        figures = gateway_window(answers.get, lambda _: {}, self.CLUSTERS, 10)
        assert figures is not None
        assert (figures.requests, figures.unsent, figures.error_ratio, figures.reset_ratio) == (85, 85, 1.0, 1.0)
        without_the_count = gateway_window({**answers, queries["unsent"]: 0.0}.get, lambda _: {}, self.CLUSTERS, 10)
        assert without_the_count is not None and without_the_count.error_ratio == 1.0  # 5xx are requests too

    def test_no_5xx_series_yet_is_none_and_no_request_timed_no_p99(self) -> None:
        queries = gateway_queries(self.CLUSTERS, 10)
        figures = gateway_window({queries["requests"]: 0.0}.get, lambda _: {}, self.CLUSTERS, 10)
        assert figures is not None
        assert (figures.requests, figures.errors, figures.resets, figures.p99_ms) == (0, 0, 0, None)

    def test_no_series_of_the_clusters_is_no_figures_not_zero(self) -> None:
        """Envoy serves the requests counter at 0 from the cluster's start: no series at all is a cluster Envoy does
        not have, or an Envoy Prometheus does not scrape. Nothing is judged on it."""
        assert gateway_window({}.get, lambda _: {}, self.CLUSTERS, 10) is None
        assert gateway_window({}.get, lambda _: {}, [], 10) is None
