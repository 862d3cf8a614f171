"""The chart's alerts, unit-tested with the real promtool: rendered by helm with monitoring on, checked, and
fed synthetic Triton series that stall, queue, idle and start up, for the shipped durations and for the
short ones a drill uses. A new alert in the chart fails here until a scenario makes it fire."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_devtools.cluster.tools import helm as kube_helm
from inferop_devtools.prometheus import (
    CHART,
    CHART_JOB,
    PrometheusError,
    alert_names,
    chart_alert_rules,
    find_binary,
    render_chart,
)

pytestmark = pytest.mark.integration

MONITORING = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]
RULES = MONITORING["rules"]
# What a PodMonitor's scrape puts on a Triton series: the pod's namespace and name, the InferenceService
# (podTargetLabels), the target; Triton adds model and version.
POD = {
    "job": CHART_JOB,
    "namespace": "models",
    "pod": "conv-net-5f7c9d-x2kq4",
    "app_kubernetes_io_instance": "conv-net",
    "instance": "10.0.0.7:8002",
    "model": "conv_net",
    "version": "1",
}
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    return sum(int(number) * UNITS[unit] for number, unit in re.findall(r"(\d+)([a-z]+)", duration))


@dataclass(frozen=True)
class Timing:
    """One rendering's durations, spelt as the chart's values."""

    interval: str
    rate_window: str
    stalled_for: str
    queue_time_for: str

    def overrides(self) -> dict[str, str]:
        return {
            "monitoring.interval": self.interval,
            "monitoring.scrapeTimeout": self.interval,
            "monitoring.rules.rateWindow": self.rate_window,
            "monitoring.rules.stalledFor": self.stalled_for,
            "monitoring.rules.queueTimeFor": self.queue_time_for,
        }

    def samples(self, duration: str) -> int:
        """How many scrape intervals `duration` spans."""
        return int(seconds(duration) // seconds(self.interval))

    def at(self, sample: int) -> str:
        """The time of a sample, as promtool's eval_time."""
        return f"{round(sample * seconds(self.interval) * 1000)}ms"


TIMINGS = {
    "shipped": Timing(MONITORING["interval"], RULES["rateWindow"], RULES["stalledFor"], RULES["queueTimeFor"]),
    # What a fault-injection drill renders: a stall shows within seconds.
    "drill": Timing("1s", "10s", "2s", "3s"),
}
THRESHOLD = int(RULES["queueTimeThresholdMicroseconds"])


def series(metric: str, values: list[int], **extra: str) -> dict[str, str]:
    labels = ",".join(f'{name}="{value}"' for name, value in {**POD, **extra}.items())
    return {"series": f"{metric}{{{labels}}}", "values": " ".join(map(str, values))}


def triton(success: list[int], pending: list[int], rejected: list[int] | None = None) -> list[dict[str, str]]:
    """A pod's series for the stall alert; Triton exports the rejection counter at 0 from model load."""
    rejections = rejected if rejected is not None else [0] * len(success)
    return [
        series("nv_inference_request_success", success),
        series("nv_inference_pending_request_count", pending),
        series("nv_inference_request_failure", rejections, reason="REJECTED"),
    ]


def humanize(value: float) -> str:
    """Prometheus' `humanize` template function, for values of 1 and above: SI prefixes, 4 digits."""
    prefixes = ["", "k", "M", "G", "T"]
    while abs(value) >= 1000 and len(prefixes) > 1:
        value /= 1000
        prefixes.pop(0)
    return f"{value:.4g}{prefixes[0]}"


def stalled(t: Timing) -> dict[str, Any]:
    return {
        "exp_labels": {
            "severity": RULES["severity"],
            **{k: POD[k] for k in ("namespace", "pod", "app_kubernetes_io_instance", "model")},
        },
        "exp_annotations": {
            "summary": f"Triton queue of {POD['model']} stalled in {POD['namespace']}/{POD['pod']}",
            "description": f"Requests to InferenceService {POD['namespace']}/{POD['app_kubernetes_io_instance']} "
            f"wait in or time out of the queue and none succeeded for {t.rate_window}; "
            "check the pod's logs and the model's instances.",
            "runbook_url": f"{RULES['runbookUrl']}#inferopqueuestalled",
        },
    }


def queue_time_rising(queue_us: int) -> dict[str, Any]:
    return {
        "exp_labels": {
            "severity": RULES["severity"],
            **{k: POD[k] for k in ("namespace", "app_kubernetes_io_instance", "model")},
        },
        "exp_annotations": {
            "summary": f"Triton queue time of {POD['model']} high in "
            f"{POD['namespace']}/{POD['app_kubernetes_io_instance']}",
            "description": f"Requests wait {humanize(queue_us)}µs on average in the queue (threshold {THRESHOLD} µs).",
            "runbook_url": f"{RULES['runbookUrl']}#inferopqueuetimerising",
        },
    }


Scenario = Callable[[Timing], dict[str, Any]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(build: Scenario) -> Scenario:
    """Register a promtool test group built for a timing; the name is the function's."""
    SCENARIOS[build.__name__] = build
    return build


def check(t: Timing, sample: int, alert: str, *expected: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": t.at(sample), "alertname": alert, "exp_alerts": list(expected)}


@scenario
def stall_after_healthy_traffic(t: Timing) -> dict[str, Any]:
    """Successes stop at `stop` while 3 requests wait: the rate is 0 once a whole window has no success,
    and the alert fires stalledFor later, not before."""
    stop = t.samples(t.rate_window) + 2
    fires = stop + t.samples(t.rate_window) + t.samples(t.stalled_for)
    end = fires + 3
    return {
        "input_series": triton([5 * min(i, stop) for i in range(end)], [3 * (i >= stop) for i in range(end)]),
        "alert_rule_test": [
            check(t, fires - 1, "InferopQueueStalled"),
            check(t, fires + 1, "InferopQueueStalled", stalled(t)),
        ],
    }


@scenario
def stall_with_queue_timeouts(t: Timing) -> dict[str, Any]:
    """Successes stop; every third scrape the 2 waiting requests have just expired (503) and the pending
    gauge reads 0 before the clients retry. The rejections keep the alert going through those dips."""
    stop = t.samples(t.rate_window) + 2
    fires = stop + t.samples(t.rate_window) + t.samples(t.stalled_for)
    end = fires + 6
    dip = [i > stop and (i - stop) % 3 == 0 for i in range(end)]
    rejected = [2 * sum(dip[: i + 1]) for i in range(end)]
    return {
        "input_series": triton(
            [5 * min(i, stop) for i in range(end)],
            [0 if dip[i] or i < stop else 2 for i in range(end)],
            rejected,
        ),
        "alert_rule_test": [
            check(t, fires - 1, "InferopQueueStalled"),
            check(t, fires + 3, "InferopQueueStalled", stalled(t)),
        ],
    }


@scenario
def stuck_from_the_first_request(t: Timing) -> dict[str, Any]:
    """A pod that just started and never answers: Triton exports the success counter at 0 from model
    load, so its rate is 0 from the second scrape and the alert fires stalledFor after that."""
    end = t.samples(t.stalled_for) + 4
    return {
        "input_series": triton([0] * end, [2] * end),
        "alert_rule_test": [
            check(t, t.samples(t.stalled_for), "InferopQueueStalled"),
            check(t, t.samples(t.stalled_for) + 2, "InferopQueueStalled", stalled(t)),
        ],
    }


@scenario
def busy_with_requests_queued_and_rejected(t: Timing) -> dict[str, Any]:
    """Requests always waiting, some turned away by a full queue, is overload, not a stall, while others
    keep succeeding."""
    end = 2 * t.samples(t.rate_window) + t.samples(t.stalled_for) + 4
    return {
        "input_series": triton([5 * i for i in range(end)], [4] * end, list(range(end))),
        "alert_rule_test": [check(t, end - 1, "InferopQueueStalled")],
    }


@scenario
def just_started_nothing_pending(t: Timing) -> dict[str, Any]:
    """A new pod with no traffic has a success rate of 0 but nothing waiting."""
    end = 2 * t.samples(t.rate_window) + t.samples(t.stalled_for) + 4
    return {
        "input_series": triton([0] * end, [0] * end),
        "alert_rule_test": [check(t, end - 1, "InferopQueueStalled")],
    }


@scenario
def slow_request_after_idle_spell(t: Timing) -> dict[str, Any]:
    """After a window without traffic a request waits a little under stalledFor, then succeeds: the alert
    goes pending and resolves without firing."""
    arrives = t.samples(t.rate_window) + 2
    served = arrives + max(1, t.samples(t.stalled_for) - 1)
    end = served + t.samples(t.stalled_for) + 4
    return {
        "input_series": triton(
            [100 + (i >= served) for i in range(end)], [int(arrives <= i < served) for i in range(end)]
        ),
        "alert_rule_test": [
            check(t, served - 1, "InferopQueueStalled"),
            check(t, end - 1, "InferopQueueStalled"),
        ],
    }


def queued(queue_us: Callable[[int], int], end: int) -> list[dict[str, str]]:
    """5 successes a scrape; the i-th scrape's successes waited queue_us(i) each."""
    total, queue = 0, []
    for i in range(end):
        total += 5 * queue_us(i) if i else 0
        queue.append(total)
    return [
        series("nv_inference_request_success", [5 * i for i in range(end)]),
        series("nv_inference_queue_duration_us", queue),
    ]


@scenario
def queue_time_above_threshold(t: Timing) -> dict[str, Any]:
    """Mean queue time doubles past the threshold at `rise`: the alert fires queueTimeFor after the
    window's mean crossed it, not before."""
    rise = t.samples(t.rate_window) + 2
    fires = rise + t.samples(t.rate_window) + t.samples(t.queue_time_for)
    end = fires + 3
    return {
        "input_series": queued(lambda i: 2 * THRESHOLD if i > rise else THRESHOLD // 2, end),
        "alert_rule_test": [
            check(t, rise + t.samples(t.queue_time_for) - 1, "InferopQueueTimeRising"),
            check(t, fires + 1, "InferopQueueTimeRising", queue_time_rising(2 * THRESHOLD)),
        ],
    }


@scenario
def queue_time_under_threshold(t: Timing) -> dict[str, Any]:
    end = 2 * t.samples(t.rate_window) + t.samples(t.queue_time_for) + 4
    return {
        "input_series": queued(lambda i: THRESHOLD - 1, end),
        "alert_rule_test": [check(t, end - 1, "InferopQueueTimeRising")],
    }


@scenario
def queue_time_idle(t: Timing) -> dict[str, Any]:
    """No success, no mean: the ratio is left out rather than divided by zero."""
    end = 2 * t.samples(t.rate_window) + t.samples(t.queue_time_for) + 4
    return {
        "input_series": [
            series("nv_inference_request_success", [0] * end),
            series("nv_inference_queue_duration_us", [0] * end),
        ],
        "alert_rule_test": [check(t, end - 1, "InferopQueueTimeRising")],
    }


@dataclass(frozen=True)
class Rendering:
    timing: Timing
    rules: dict[str, Any]
    directory: Path  # holds rules.yaml


@pytest.fixture(scope="session")
def promtool() -> Path:
    try:
        return find_binary("promtool")
    except PrometheusError as error:  # make tools installs it before make test: missing is a failure
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def helm() -> Path:
    """make test provides helm (make tools): missing, the tier fails rather than skips."""
    return kube_helm()


@pytest.fixture(scope="module", params=list(TIMINGS))
def rendering(request: pytest.FixtureRequest, helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Rendering:
    timing = TIMINGS[request.param]
    rules = chart_alert_rules({} if request.param == "shipped" else timing.overrides())
    directory = tmp_path_factory.mktemp(f"rules-{request.param}")
    (directory / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    return Rendering(timing, rules, directory)


def promtool_test(promtool: Path, rendering: Rendering, group: dict[str, Any], name: str) -> None:
    evaluation = rendering.timing.interval
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": evaluation,
        "tests": [{"name": name, "interval": evaluation, **group}],
    }
    path = rendering.directory / f"{name}.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False, allow_unicode=True))
    result = subprocess.run(
        [str(promtool), "test", "rules", path.name],
        cwd=rendering.directory,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"promtool test rules {name}:\n{result.stdout}{result.stderr}"


def test_promtool_accepts_the_rules(promtool: Path, rendering: Rendering) -> None:
    result = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"],
        cwd=rendering.directory,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_names(rendering.rules))} rules found" in result.stdout


def test_durations_are_the_values(rendering: Rendering) -> None:
    timing = rendering.timing
    rules = {rule["alert"]: rule for group in rendering.rules["groups"] for rule in group["rules"]}
    assert rules["InferopQueueStalled"]["for"] == timing.stalled_for
    assert rules["InferopQueueTimeRising"]["for"] == timing.queue_time_for
    windows = {window for rule in rules.values() for window in re.findall(r"\[([^\]]+)\]", rule["expr"])}
    assert windows == {timing.rate_window}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(promtool: Path, rendering: Rendering, name: str) -> None:
    promtool_test(promtool, rendering, SCENARIOS[name](rendering.timing), name)


def test_every_alert_has_a_firing_and_a_quiet_scenario(rendering: Rendering) -> None:
    cases = [case for build in SCENARIOS.values() for case in build(rendering.timing)["alert_rule_test"]]
    fire = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    shipped = set(alert_names(rendering.rules))
    assert shipped - fire == set(), "alerts the chart ships that no scenario makes fire"
    assert shipped - quiet == set(), "alerts the chart ships that no scenario shows quiet"
    assert fire | quiet <= shipped, "scenarios for alerts the chart no longer ships"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["monitoring.rules.rateWindow=59s"], "monitoring.rules.rateWindow (59s) must span at least two scrapes"),
        (["monitoring.interval=1s", "monitoring.rules.rateWindow=10s"], "monitoring.scrapeTimeout (10s) must not"),
    ],
)
def test_durations_that_would_silence_the_alerts_are_refused(helm: Path, values: list[str], message: str) -> None:
    with pytest.raises(PrometheusError, match=re.escape(message)):
        render_chart(*[arg for value in values for arg in ("--set", value)])
    render_chart("--set", "monitoring.rules.rateWindow=1m")  # exactly two scrapes of 30s
