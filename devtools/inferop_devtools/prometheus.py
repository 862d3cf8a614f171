"""A real Prometheus server and the chart's alerting rules, on one machine and without a cluster.

The chart ships its alerts inside a PrometheusRule; tests and drills need the very same rules in a real
Prometheus that scrapes a real tritonserver. `chart_alert_rules` renders the chart with helm and lifts the
rule groups out into a Prometheus rule file; `Prometheus` runs Debian's prometheus binary
(scripts/prometheus.sh) as a plain process on 127.0.0.1 with a throw-away TSDB, scraping the given targets
under the job name the rules select.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from inferop.paths import log_tail, repo_root
from inferop_core.errors import InferopError
from inferop_devtools.cluster.controlplane import free_ports
from inferop_devtools.cluster.tools import helm

GET_PROMETHEUS = "run scripts/prometheus.sh (Debian's prometheus package)"
CHART = repo_root() / "charts" / "inferop"
# The release the rules are rendered for. Its name contains the chart's, so the full name is the release
# name and the PodMonitor's job (what every rule selects on) is "<namespace>/<release>-triton".
RELEASE = "inferop"
NAMESPACE = "inferop-system"
CHART_JOB = f"{NAMESPACE}/{RELEASE}-triton"
# Without the API version the chart renders no Prometheus Operator object at all.
MONITORING_ON = ("--set", "monitoring.enabled=true", "--api-versions", "monitoring.coreos.com/v1")
READY_TIMEOUT_S = 30.0


class PrometheusError(InferopError, RuntimeError):
    """Prometheus, promtool or helm is missing, failed, or answered an error; the message says which."""


def find_binary(name: str) -> Path:
    """`prometheus` or `promtool` from PATH (Debian installs both in /usr/bin)."""
    found = shutil.which(name)
    if found is None:
        raise PrometheusError(f"{name} not found: {GET_PROMETHEUS}")
    return Path(found)


def render_chart(*args: str) -> str:
    """`helm template` of the chart with monitoring on (plus `args`), as helm prints it.

    helm's cache and config go to a temporary directory so the user's repositories never matter."""
    with tempfile.TemporaryDirectory(prefix="inferop-helm-") as home:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data",
        }
        argv = [str(helm()), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *MONITORING_ON, *args]
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise PrometheusError(f"helm template failed: {result.stderr.strip()}")
    return result.stdout


def rule_file(rendered: str) -> dict[str, Any]:
    """The `spec.groups` of every PrometheusRule in rendered YAML, as one Prometheus rule file."""
    groups = [
        group
        for doc in yaml.safe_load_all(rendered)
        if doc and doc.get("kind") == "PrometheusRule"
        for group in doc.get("spec", {}).get("groups", [])
    ]
    if not groups:
        raise PrometheusError("the rendering holds no PrometheusRule (is monitoring.rules.enabled false?)")
    return {"groups": groups}


def chart_alert_rules(overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The chart's alerting rules as a Prometheus rule file, rendered with `--set key=value` for each
    override, e.g. {"monitoring.rules.stalledFor": "2s", "monitoring.interval": "1s"}."""
    sets = [arg for key, value in (overrides or {}).items() for arg in ("--set", f"{key}={value}")]
    return rule_file(render_chart(*sets))


def alert_names(rules: Mapping[str, Any]) -> list[str]:
    """Every alert a rule file defines, in order."""
    return [rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def config(
    targets: Sequence[str],
    job: str,
    rule_paths: Sequence[Path],
    scrape_interval: str,
    evaluation_interval: str,
    labels: Mapping[str, str],
    file_sd: Path | None = None,
    jobs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """prometheus.yml: one job, of static `targets` and, with `file_sd`, the targets that file lists (re-read
    when it changes), unless there are neither, then `jobs` as they are. `labels` go on every static series, as a
    PodMonitor's relabelling would put namespace and pod there."""
    static: dict[str, Any] = {"targets": list(targets)}
    if labels:
        static["labels"] = dict(labels)
    job_config: dict[str, Any] = {"job_name": job, "static_configs": [static]}
    if file_sd is not None:
        job_config["file_sd_configs"] = [{"files": [str(file_sd)]}]
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "rule_files": [str(path) for path in rule_paths],
        "scrape_configs": [*([job_config] if targets or file_sd else []), *map(dict, jobs)],
    }


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Alert:
    """An active alert. `active_at` is Prometheus' own: when its expression first held (the pending
    state began); `seen_at` is when this client saw it in its current state."""

    name: str
    state: str  # pending or firing
    active_at: datetime
    seen_at: datetime
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float


@dataclass(frozen=True)
class RuleStatus:
    """An alerting rule as Prometheus evaluates it: state inactive/pending/firing, health ok/err/unknown
    (unknown until its first evaluation)."""

    state: str
    health: str
    last_error: str


def _timestamp(text: str) -> datetime:
    """Prometheus' RFC 3339 times carry nanoseconds, which datetime cannot hold."""
    head, _, tail = text.rstrip("Z").partition(".")
    fraction = tail[:6].ljust(6, "0") if tail else "000000"
    return datetime.fromisoformat(f"{head}.{fraction}+00:00")


class Prometheus:
    """A real Prometheus on 127.0.0.1 scraping `targets` (host:port of tritonserver's metrics port) as
    `job`, evaluating `rule_files` (rule-file dicts, e.g. from `chart_alert_rules`).

    Use as a context manager, or `start()` / `stop()`; its config, rules, TSDB and log live in a temporary
    directory removed on stop. `start()` returns in about 0.1 s; the first scrape follows about 5 s later
    (`wait_for_targets`). `labels` go on every scraped series, as a PodMonitor puts namespace and pod.
    `file_sd` names a file_sd file of more targets, each with its own labels (see `PodTargets` in
    inferop_devtools.cluster.addons). `jobs` are more scrape jobs, as prometheus.yml takes them (such as
    `kubelet_scrape_job` in inferop_devtools.cluster.node)."""

    def __init__(
        self,
        targets: Sequence[str],
        job: str = CHART_JOB,
        rule_files: Sequence[Mapping[str, Any]] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        labels: Mapping[str, str] | None = None,
        file_sd: Path | None = None,
        jobs: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.targets = list(targets)
        self.jobs = list(jobs)
        self.file_sd = file_sd
        self.job = job
        self.rule_files = list(rule_files)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.labels = dict(labels or {})
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT_S) -> Prometheus:
        """Start the server and return once /-/ready answers 200 (rules loaded, TSDB open)."""
        binary = find_binary("prometheus")
        self._workdir = Path(tempfile.mkdtemp(prefix="inferop-prometheus-"))
        rule_paths = [self._workdir / f"rules-{index}.yaml" for index in range(len(self.rule_files))]
        for path, rules in zip(rule_paths, self.rule_files, strict=True):
            path.write_text(yaml.safe_dump(dict(rules), sort_keys=False, allow_unicode=True))
        config_path = self._workdir / "prometheus.yml"
        intervals = (self.scrape_interval, self.evaluation_interval)
        settings = config(self.targets, self.job, rule_paths, *intervals, self.labels, self.file_sd, self.jobs)
        config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
        self.port = self.port or free_ports(1)[0]  # started again, it keeps its address
        argv = [
            str(binary),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self._workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with open(self._workdir / "prometheus.log", "wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited with code {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while it replays and loads
            time.sleep(0.1)
        raise PrometheusError(f"prometheus not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Prometheus flushes and exits), SIGKILL after `timeout`; no process is left behind."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self._workdir / "prometheus.log" if self._workdir else None, lines)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path> and return its `data`; an API error raises with Prometheus' message."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            body = json.load(error)  # 400/422 carry {"status": "error", "error": ...}
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def wait_for_targets(self, timeout: float = 20.0) -> None:
        """Return once every static target (of `jobs` too) has been scraped successfully. Prometheus 2.42 hands
        new targets to its scraper on a 5 s tick, so the first samples arrive about 5 s after /-/ready."""
        groups = [group for job in self.jobs for group in job.get("static_configs", ())]
        expected = len(self.targets) + sum(len(group["targets"]) for group in groups)
        deadline = time.monotonic() + timeout
        while True:
            targets = self.api("targets", state="active")["activeTargets"]
            if len(targets) == expected and all(target["health"] == "up" for target in targets):
                return
            if time.monotonic() > deadline:
                states = {t["scrapeUrl"]: f"{t['health']} {t['lastError']}".strip() for t in targets}
                raise PrometheusError(f"targets not all scraped after {timeout:g}s: {states or 'none yet'}")
            time.sleep(0.1)

    def query(self, expr: str) -> list[Sample]:
        """An instant query's vector: one sample per series."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} gives a {data['resultType']}, not an instant vector")
        return [Sample(labels=item["metric"], value=float(item["value"][1])) for item in data["result"]]

    def alerts(self) -> list[Alert]:
        """Every active alert, pending or firing."""
        seen = datetime.now(timezone.utc)
        return [
            Alert(
                name=item["labels"]["alertname"],
                state=item["state"],
                active_at=_timestamp(item["activeAt"]),
                seen_at=seen,
                labels=item["labels"],
                annotations=item["annotations"],
                value=float(item["value"]),
            )
            for item in self.api("alerts")["alerts"]
        ]

    def alert_rules(self) -> dict[str, RuleStatus]:
        """Alert name -> its rule's status, for every loaded alerting rule (active or not)."""
        return {
            rule["name"]: RuleStatus(state=rule["state"], health=rule["health"], last_error=rule.get("lastError", ""))
            for group in self.api("rules", type="alert")["groups"]
            for rule in group["rules"]
        }

    def wait_for_alert(self, name: str, state: str = "firing", timeout: float = 60.0, interval: float = 0.1) -> Alert:
        """Poll until alert `name` is in `state`; its `seen_at` bounds when it got there."""
        deadline = time.monotonic() + timeout
        while True:
            for alert in self.alerts():
                if alert.name == name and alert.state == state:
                    return alert
            if time.monotonic() > deadline:
                raise PrometheusError(f"alert {name} not {state} after {timeout:g}s; active: {self.alerts()}")
            time.sleep(interval)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
