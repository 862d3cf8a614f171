"""Revisions and the rollout: pure functions of the spec, the rollout state written last and what was observed.

A revision is what a pod serves: the model, the serving config and the container (`revision_of`). When the spec's
revision differs from the stable one and the spec asks for a rollout, the candidate runs beside the stable
revision and goes through:

    Agreement    its pods start; both revisions answer the same held-out inputs and must agree (no live traffic)
    Progressing  step by step it takes `steps` percent of live requests (shadowed ones at steps of 0, every
                 header-matched one), each step analysed every `analysis.intervalSeconds` against the stable
                 revision over the last interval; a failure rolls back at once, a step that passed for `stepSeconds`
                 gives way to the next
    Paused       held at its step: by `rollout.paused`, or for want of data (never promoted blind)
    Promoting    it passed at 100: the stable Deployment takes its spec and rolls, the candidate holding all traffic
    Finishing    the stable Deployment serves it; traffic back on the stable Service while the candidate drains
    Succeeded    the candidate's objects are gone; the stable revision is the candidate
    RollingBack  a failed check or an abort: no traffic to the candidate from this moment, its pods drain; from
                 Agreement, Progressing or Paused, also a candidate pod OOM-killed, crash-looping or restarted, or
                 none Ready while its step sends it live requests. Where the stable pods followed the weight down
                 (rollout.scaleDown), a candidate rolled back for its latency, by an abort or a reverted spec keeps
                 its traffic until they are back at full size; a failing one loses it at once
    RolledBack   its objects are gone; it stays rolled back until the spec names another revision

`advance` is the whole machine: the handlers observe (pods, Deployments, the route, Prometheus, the agreement
check) and write what it returns. Times are seconds since the epoch, written as RFC 3339.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr

from inferop_operator.diagnosis import Diagnosis
from inferop_operator.spec import InferenceServiceSpec, Rollout, Section

if TYPE_CHECKING:  # numpy stays out of the operator until a rollout compares answers
    from inferop_core.agreement import AgreementResult

Phase = Literal[
    "Agreement", "Progressing", "Paused", "Promoting", "Finishing", "Succeeded", "RollingBack", "RolledBack"
]
# Phases in which the candidate's objects exist; in the others they are deleted.
CANDIDATE_PHASES: frozenset[str] = frozenset(
    {"Agreement", "Progressing", "Paused", "Promoting", "Finishing", "RollingBack"}
)
# Phases in which the candidate's pods are watched for failures (diagnosis.candidate_failure): any rolls it back.
JUDGED_PHASES: frozenset[str] = frozenset({"Agreement", "Progressing", "Paused"})
# Phases that end a rollout: nothing happens until the spec names another revision.
FINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "RolledBack"})
# Fields of the spec that do not change what a pod serves: editing them makes no new revision.
NOT_SERVED = frozenset({"replicas", "autoscaling", "network_policy", "gateway", "rollout"})
# After traffic leaves the candidate, its pods keep running this long before they are deleted, so that requests
# a gateway still routed by the previous weights finish (Envoy applies a route within a second or two).
DRAIN_SECONDS = 10.0
REVISION_LENGTH = 10
# The rollout's safeguards that the operator's INFEROP_ROLLOUT_ABLATE removes, so that a drill shows what each one
# prevents (its scenario's goal must fail without it); never removed where anything serves.
SAFEGUARDS: dict[str, str] = {
    "pod-failures": "the candidate's restarts, OOM kills and crash loops in the API roll it back",
    "gateway-failures": "its 5xx answers, resets and refused connections at the gateway roll it back",
    "ready-pods": "a step's weight waits for the candidate's Ready pods that it needs",
    "sliding-window": "each analysis reads the last interval, not the step so far",
    "stable-first": "a candidate rolled back for its latency keeps its traffic until the stable pods are back",
    "member-failures": "behind an image pipeline, failures are its members', not the images it refuses its callers",
}


def served_fields(spec: InferenceServiceSpec) -> dict[str, Any]:
    """What of `spec` reaches its pods, as the spec spells it."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=set(NOT_SERVED))


def revision_of(spec: InferenceServiceSpec, image: str) -> str:
    """The revision `spec` serves: a digest of everything that reaches its pods (and nothing that does not)."""
    text = json.dumps({"spec": served_fields(spec), "image": image}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:REVISION_LENGTH]


def with_served(spec: InferenceServiceSpec, served: dict[str, Any]) -> InferenceServiceSpec:
    """`spec` serving what `served` says (another revision's served fields): replicas, autoscaling, routing and
    the rollout stay the spec's."""
    rest = spec.model_dump(mode="json", by_alias=True, exclude_none=True, include=set(NOT_SERVED))
    return InferenceServiceSpec.model_validate({**served, **rest})


def decide(
    spec: InferenceServiceSpec,
    revision: str,
    state: RolloutStatus | None,
    split: str,
    now: float,
    previous: tuple[InferenceServiceSpec, str] | None = None,
) -> RolloutStatus:
    """The rollout state for a spec just read: `revision` is the spec's (`revision_of`), `previous` the spec handled
    before this change and its revision, when known (kopf's diff base), for a service whose status keeps no stable
    revision yet. Without spec.rollout a change serves at once and nothing is kept."""
    if spec.rollout is None:
        return RolloutStatus(stable=revision)
    if state is None or state.stable is None or state.stable_spec is None:
        if previous is None or previous[1] == revision:
            return RolloutStatus(stable=revision, stable_spec=served_fields(spec))
        state = RolloutStatus(stable=previous[1], stable_spec=served_fields(previous[0]))
    if revision == state.stable:
        if state.phase in ("Agreement", "Progressing", "Paused"):
            return roll_back(state, now, "SpecReverted", f"the spec serves revision {state.stable} again", True)
        return state
    if revision == state.candidate:
        if retry_asked(spec.rollout, state):
            started = start(str(state.stable), revision, split, now, state)
            return started.model_copy(
                update={"retried": spec.rollout.retry, "message": f"retried by spec.rollout.retry: {started.message}"}
            )
        return state
    return start(str(state.stable), revision, split, now, state)


def retry_asked(rollout: Rollout, state: RolloutStatus) -> bool:
    """spec.rollout.retry asks for the rolled-back candidate again, and was not taken up before."""
    token = rollout.retry
    return (
        state.phase == "RolledBack"
        and token is not None
        and token != state.retried
        and state.candidate is not None
        and token.split("/")[0] == state.candidate
    )


def stable_spec(spec: InferenceServiceSpec, state: RolloutStatus) -> InferenceServiceSpec:
    """What the stable Deployment serves: the stable revision, or the candidate once it is being promoted."""
    if state.stable_spec is None or state.phase in ("Promoting", "Finishing"):
        return spec
    return with_served(spec, state.stable_spec)


def timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds_of(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


class Reported(Section):
    """A part of the status, camelCase like the spec; what this model does not know is ignored when read."""

    model_config = ConfigDict(extra="ignore")


# A histogram over a window: (upper bound, requests at or under it), ascending, +Inf last.
TimeBuckets = tuple[tuple[float, float], ...]


class GatewayFigures(Reported):
    """One revision's requests in an analysis window as the gateway's Envoy saw them: its clusters for the revision's
    backends of the service's HTTPRoute, from Envoy's stats in Prometheus."""

    requests: float = Field(
        description="Requests Envoy sent, or tried to send, to the revision's pods in the window: those whose "
        "connection failed first included."
    )
    unsent: float = Field(default=0, description="Of those, requests whose connection failed before they were sent.")
    errors: float = Field(description="Of those, answered 5xx (a reset or a refused connection included).")
    resets: float = Field(description="Requests the pods reset, and connections to them that failed.")
    error_ratio: float | None = Field(default=None, description="errors / requests (unset: no requests).")
    reset_ratio: float | None = Field(default=None, description="resets / requests (unset: no requests).")
    p99_ms: float | None = Field(
        default=None,
        description="99th percentile of the time Envoy waited for the pods' answers, in ms, from its histogram "
        "(unset: no request timed in the window).",
    )
    # The histogram itself, for the p99 gate's count of slow requests: read with the figures, never in the status.
    _time_buckets: TimeBuckets = PrivateAttr(default=())

    @property
    def time_total(self) -> float:
        """Requests in the histogram: those timed in the window."""
        return self._time_buckets[-1][1] if self._time_buckets else 0.0

    def slower_than(self, ms: float) -> tuple[float, float]:
        """The first of Envoy's bucket bounds at or above `ms`, and the requests timed above it: at most the
        requests slower than `ms`, never more."""
        edge, within = next(((b, count) for b, count in self._time_buckets if b >= ms), (math.inf, self.time_total))
        return edge, self.time_total - within


class TrackFigures(Reported):
    """One revision's requests in an analysis window, from Triton's counters in Prometheus, and at the gateway."""

    requests: float = Field(description="Requests answered or failed in the window.")
    failures: float = Field(description="Requests that failed in the window.")
    failure_ratio: float | None = Field(default=None, description="failures / requests (unset: no requests).")
    mean_latency_ms: float | None = Field(
        default=None, description="Mean time in Triton per successful request (queue and compute), in ms."
    )
    gateway: GatewayFigures | None = Field(
        default=None,
        description="The same revision at the gateway (unset: no Gateway, or no Envoy series for its backends).",
    )


Verdict = Literal["Passed", "Failed", "NoData", "Unreachable"]
# Requests a side must have timed at the gateway before its p99 is compared: fewer, and it is their slowest one.
P99_REQUESTS = 100
QUANTILE = 0.99
# A candidate's p99 beyond the ratio fails when this few of its requests as slow as that come by chance at most,
# from a candidate whose p99 is within it: with a few hundred requests the p99 is their slowest three or four, and
# two revisions of the same build read 1.39x apart here (Envoy's buckets are 5, 10, 25 ms...).
P99_SIGNIFICANCE = 0.001
# What decided a verdict other than Passed: the gateway's 5xx answers or its resets and failed connections, too few
# requests in Triton, Triton's failures, Triton's mean time, the gateway's p99.
Check = Literal["gatewayErrors", "gatewayResets", "requests", "failureRatio", "latency", "p99"]


class AnalysisStatus(Reported):
    """The last analysis of the step: the candidate against the stable revision over the same window."""

    verdict: Verdict = Field(description="Passed, Failed, NoData (too few requests) or Unreachable (Prometheus).")
    message: str = Field(description="The numbers and what was decided.")
    step: int = Field(description="Index of the step analysed.")
    weight: int = Field(description="The candidate's weight at that step, percent.")
    at: str = Field(description="When (RFC 3339): the window's end.")
    since: str | None = Field(default=None, description="The window's start (RFC 3339).")
    window_seconds: float = Field(
        description="Seconds analysed: the last analysis.intervalSeconds of the step, fewer at its start."
    )
    check: Check | None = Field(default=None, description="The check that failed, or that lacked data.")
    failures_in_a_row: int = Field(default=0, description="Failed analyses of this step in a row, this one included.")
    candidate: TrackFigures | None = Field(default=None, description="The candidate's figures.")
    stable: TrackFigures | None = Field(default=None, description="The stable revision's figures.")


Decided = Literal["Passed", "Refused", "Undecided"]


class OutputAgreement(Reported):
    """How one output of the candidate agreed with the stable revision's, and what its sequential test decided."""

    name: str = Field(description="The output.")
    judged_by: Literal["top1", "tolerance"] = Field(
        description="top1: the same top-1 class; tolerance: every value within maxAbsDifference."
    )
    samples: int = Field(description="Inputs the test counted (near ties are not).")
    agreement: float = Field(description="Share of the counted inputs that agree.")
    bound: float = Field(
        description="The Clopper-Pearson bound on that share at 99% confidence: the least share for a pass, the "
        "largest for a refusal."
    )
    decision: Decided = Field(description="The test's decision for this output.")
    near_ties: int = Field(default=0, description="Inputs where the stable revision's top-1 margin was below epsilon.")
    near_tie_flips: int = Field(default=0, description="Of those, the ones whose top-1 class differs; not counted.")
    max_abs_difference: float | None = Field(
        default=None, description="The largest difference of any value counted (tolerance outputs)."
    )


class AgreementStatus(Reported):
    """Both revisions on the same inputs, as many as the sequential test needed, before any live request reached the
    candidate."""

    passed: bool = Field(description="The candidate agrees with the stable revision.")
    samples: int = Field(description="Inputs answered by both.")
    inputs: str = Field(description="Where they came from: the validation set recorded with the model, or generated.")
    seconds: float = Field(description="How long the check took.")
    false_refusal: float = Field(
        description="The test's probability of refusing a candidate at minAgreement on every output (exact)."
    )
    false_acceptance: float = Field(
        description="Its probability of passing one at minAgreement - tolerance on any output (exact)."
    )
    outputs: list[OutputAgreement] = Field(default_factory=list, description="Each output compared.")
    message: str = Field(description="The comparison and, when it failed, by how much.")


class RolloutStatus(Reported):
    """Where the rollout of a changed model or serving config stands."""

    phase: Phase | None = Field(default=None, description="Where the candidate is (see the README's rollout).")
    # Unset rather than empty: Kubernetes 1.20's apiserver refuses an empty string in a status field as null.
    reason: str | None = Field(default=None, description="Why it is there, in one CamelCase word.")
    message: str | None = Field(default=None, description="The same for a person.")
    stable: str | None = Field(default=None, description="The revision that serves (its digest).")
    candidate: str | None = Field(default=None, description="The revision being rolled out, or last rolled out.")
    step: int | None = Field(default=None, description="Index of the current step in spec.rollout.steps.")
    weight: int = Field(default=0, description="Percent of live requests routed to the candidate now.")
    mirror_percent: int = Field(default=0, description="Percent of live requests copied to the candidate now.")
    header: bool = Field(default=False, description="Header-matched requests reach the candidate now.")
    split: Literal["gateway", "replicas"] | None = Field(
        default=None,
        description="How traffic is split: gateway (the HTTPRoute's weights) or replicas (pods behind one Service, "
        "approximate: the share of ready pods).",
    )
    scaling_for: int | None = Field(
        default=None,
        description="The share (percent) of requests the candidate's pods are being started for: the next step's "
        "traffic waits until they are all Ready, the current step's going on meanwhile.",
    )
    step_started_at: str | None = Field(default=None, description="When the current step's traffic took effect.")
    changed_at: str | None = Field(default=None, description="When the phase or the traffic last changed.")
    agreement: AgreementStatus | None = Field(default=None, description="The check before any live traffic.")
    analysis: AnalysisStatus | None = Field(default=None, description="The last analysis of a step.")
    stable_replicas: int | None = Field(
        default=None,
        description="The stable Deployment's pods while the candidate takes weight through a gateway: its share of "
        "spec.replicas at the step's weight plus rollout.scaleDown's headroom, once the weight has held for its delay; "
        "unset: spec.replicas.",
    )
    retried: str | None = Field(
        default=None, description="The spec.rollout.retry value the operator last took up (it acts once)."
    )
    stable_spec: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="The spec the stable revision was made from (its served fields), kept while another rolls out.",
    )

    @property
    def candidate_wanted(self) -> bool:
        return self.phase in CANDIDATE_PHASES


@dataclass(frozen=True)
class Traffic:
    """What the routing and the Deployments must say now."""

    weight: int = 0  # percent to the candidate
    mirror_percent: int = 0
    header: bool = False

    @classmethod
    def of(cls, state: RolloutStatus) -> Traffic:
        return cls(state.weight, state.mirror_percent, state.header)


@dataclass(frozen=True)
class Observed:
    """What the handlers saw this tick; None where nothing was asked (an agreement that has not run)."""

    now: float
    candidate_ready: bool = False  # the candidate's Deployment has every replica updated and ready
    traffic_settled: bool = False  # the route (or the replicas) carry the state's traffic
    stable_rolled_out: bool = False  # the stable Deployment runs its current spec on every replica, ready
    agreement: AgreementResult | None = None
    analysis: AnalysisStatus | None = None
    # What the candidate's pods report that fails it whatever its metrics say (diagnosis.candidate_failure)
    candidate_failure: Diagnosis | None = None
    # The stable pods at full size (spec.replicas) where they may follow the weight (through a gateway, without
    # autoscaling); None: they stay as the spec or the HPA has them.
    stable_full: int | None = None
    ablated: frozenset[str] = frozenset()  # SAFEGUARDS removed (a drill's ablation)


def start(stable: str, candidate: str, split: str, now: float, previous: RolloutStatus) -> RolloutStatus:
    """A new candidate, from the stable revision: no traffic, its pods to start, the agreement to check."""
    return previous.model_copy(
        update={
            "phase": "Agreement",
            "reason": "CandidateStarting",
            "message": f"revision {candidate} starts beside {stable}; it gets no traffic before it agrees",
            "stable": stable,
            "candidate": candidate,
            "step": None,
            "weight": 0,
            "mirror_percent": 0,
            "header": False,
            "split": split,
            "step_started_at": None,
            "scaling_for": None,
            "changed_at": timestamp(now),
            "agreement": None,
            "analysis": None,
        }
    )


def step_traffic(rollout: Rollout, step: int, split: str) -> Traffic:
    weight = rollout.steps[step]
    mirror = rollout.shadow.percent if rollout.shadow is not None and weight == 0 and split == "gateway" else 0
    return Traffic(weight=weight, mirror_percent=mirror, header=rollout.header is not None and split == "gateway")


def _moved(state: RolloutStatus, now: float, **update: Any) -> RolloutStatus:
    return state.model_copy(update={**update, "changed_at": timestamp(now)})


def roll_back(state: RolloutStatus, now: float, reason: str, message: str, answers: bool = False) -> RolloutStatus:
    """No traffic to the candidate from this moment; its pods drain, then go. A candidate that still `answers`
    (rolled back for its latency, by an abort or a reverted spec) keeps its traffic while stable pods scaled down
    for its weight come back (`advance` takes it off once they are all Ready): a failing one loses it at once."""
    if answers and state.stable_replicas is not None and (state.weight or state.header or state.mirror_percent):
        held = f"{message}; its traffic stays until the stable revision's pods are back at full size"
        return _moved(
            state, now, phase="RollingBack", reason=reason, message=held, scaling_for=None, stable_replicas=None
        )
    return _moved(
        state, now, phase="RollingBack", reason=reason, message=message, weight=0, mirror_percent=0, header=False,
        scaling_for=None, stable_replicas=None,
    )  # fmt: skip


def _enter_step(state: RolloutStatus, rollout: Rollout, step: int, now: float) -> RolloutStatus:
    traffic = step_traffic(rollout, step, state.split or "gateway")
    return _moved(
        state,
        now,
        phase="Progressing",
        reason="StepStarted",
        message=f"step {step + 1} of {len(rollout.steps)}: {traffic.weight}% of live requests"
        + (f", {traffic.mirror_percent}% mirrored" if traffic.mirror_percent else "")
        + (", header-matched requests" if traffic.header else ""),
        step=step,
        weight=traffic.weight,
        mirror_percent=traffic.mirror_percent,
        header=traffic.header,
        step_started_at=None,
        scaling_for=None,
    )


def _pods_for_step(
    state: RolloutStatus, rollout: Rollout, step: int, now: float, ablated: frozenset[str]
) -> RolloutStatus:
    """Step `step`, once the candidate has the Ready pods its traffic needs: through a gateway its Deployment is
    scaled for the step's share first (`scaling_for`), and `advance` enters the step when every pod is Ready. Split
    by replicas, the pods are the split: they come with the step."""
    traffic = step_traffic(rollout, step, state.split or "gateway")
    if state.split == "replicas" or "ready-pods" in ablated:
        return _enter_step(state, rollout, step, now)
    share = max(traffic.weight, traffic.mirror_percent)
    return state.model_copy(
        update={
            "reason": "CandidateScaling",
            "message": f"step {step + 1} of {len(rollout.steps)} waits for the candidate's pods for {share}% of "
            "requests to be Ready",
            "scaling_for": share,
        }
    )


def advance(state: RolloutStatus, rollout: Rollout, observed: Observed, candidate: dict[str, Any]) -> RolloutStatus:
    """The rollout's next state, given the spec's rollout section, what was observed and the candidate's served
    fields (which the stable revision keeps once promoted), with the stable pods it needs."""
    moved = _advance(state, rollout, observed, candidate)
    count = stable_replicas(moved, rollout, observed.stable_full, observed.now)
    return moved if count == moved.stable_replicas else moved.model_copy(update={"stable_replicas": count})


def stable_replicas(state: RolloutStatus, rollout: Rollout, full: int | None, now: float) -> int | None:
    """The stable pods the rollout's step needs (`full` at full size; None: not the rollout's to choose): its share
    of them at the step's weight plus headroom, once that weight has held for scaleDown.delaySeconds (before, the
    previous step's); None (full size) outside the steps, and when that is all of them."""
    scale = rollout.scale_down
    if full is None or not scale.enabled or state.phase not in ("Progressing", "Paused") or state.step is None:
        return None
    weight = state.weight
    started = seconds_of(state.step_started_at)
    if started is None or now - started < scale.delay_seconds:
        weight = rollout.steps[state.step - 1] if state.step > 0 else 0
    count = stable_share(full, weight, scale.headroom_percent)
    return None if count >= full else count


def stable_share(full: int, weight: int, headroom_percent: int) -> int:
    """Pods for the stable revision's (100 - weight)% of what `full` pods serve, times 1 + headroom; one at least."""
    need = math.ceil(round(full * (100 - weight) * (100 + headroom_percent) / 10_000, 9))
    return min(full, max(1, need))


def _advance(state: RolloutStatus, rollout: Rollout, observed: Observed, candidate: dict[str, Any]) -> RolloutStatus:
    now = observed.now
    phase = state.phase
    if phase in FINAL_PHASES or phase is None:
        return state
    if rollout.abort is not None and rollout.abort == state.candidate and phase not in ("RollingBack",):
        return roll_back(state, now, "Aborted", f"revision {state.candidate} aborted by spec.rollout.abort", True)
    failure = observed.candidate_failure
    if failure is not None and phase in JUDGED_PHASES:  # never promoted, by the spec or its steps
        return roll_back(state, now, f"Candidate{failure.reason}", f"revision {state.candidate}: {failure.message}")
    if phase in ("Progressing", "Paused") and rollout.promote is not None and rollout.promote == state.candidate:
        return _moved(
            state, now, phase="Promoting", reason="PromotedBySpec",
            message=f"revision {state.candidate} promoted by spec.rollout.promote: the stable Deployment takes "
            "its spec", weight=100, mirror_percent=0, scaling_for=None,
        )  # fmt: skip
    if state.scaling_for is not None and observed.candidate_ready:  # the next step's pods are Ready
        return _enter_step(state, rollout, 0 if state.step is None else state.step + 1, now)
    if phase == "Agreement":
        return state if state.scaling_for is not None else _agreement(state, rollout, observed)
    if phase in ("Progressing", "Paused"):
        return _step(state, rollout, observed)
    if phase == "Promoting":
        if not observed.stable_rolled_out:
            return state
        return _moved(
            state, now, phase="Finishing", reason="StableUpdated",
            message=f"the stable Deployment serves revision {state.candidate}: traffic back on it, the candidate's "
            "pods drain", stable=state.candidate, stable_spec=candidate, weight=0, mirror_percent=0, header=False,
        )  # fmt: skip
    if phase == "RollingBack" and (state.weight or state.header or state.mirror_percent):
        # Held by roll_back until the stable pods are all back and Ready.
        if not observed.stable_rolled_out and "stable-first" not in observed.ablated:
            return state
        return _moved(
            state, now, weight=0, mirror_percent=0, header=False,
            message=f"{state.message}: they are, and it has none now",
        )  # fmt: skip
    if phase in ("Finishing", "RollingBack"):
        since = seconds_of(state.changed_at) or now
        if observed.traffic_settled and now - since >= DRAIN_SECONDS:
            final = "Succeeded" if phase == "Finishing" else "RolledBack"
            message = (
                f"revision {state.candidate} serves every request"
                if final == "Succeeded"
                else f"revision {state.candidate} rolled back: {state.message}"
            )
            return _moved(state, now, phase=final, message=message)
        return state
    return state


def agreement_status(result: AgreementResult) -> AgreementStatus:
    """The check's outcome as the status reports it."""
    decisions: dict[str | None, Decided] = {"accept": "Passed", "refuse": "Refused", None: "Undecided"}
    outputs = [
        OutputAgreement(
            name=o.name, judged_by="top1" if o.kind == "top1" else "tolerance", samples=o.samples,
            agreement=round(o.share, 4), bound=round(o.bound, 4), decision=decisions[o.decision],
            near_ties=o.near_ties, near_tie_flips=o.near_tie_flips,
            max_abs_difference=float(f"{o.largest_difference:.4g}") if o.kind == "tolerance" else None,
        )
        for o in result.outputs
    ]  # fmt: skip
    return AgreementStatus(
        passed=result.passed,
        samples=result.samples,
        inputs=result.inputs,
        seconds=result.seconds,
        false_refusal=round(result.design.false_refusal, 5),
        false_acceptance=round(result.design.false_acceptance, 5),
        outputs=outputs,
        message=result.describe() + (f"; fails: {'; '.join(result.failures)}" if result.failures else ""),
    )


def _agreement(state: RolloutStatus, rollout: Rollout, observed: Observed) -> RolloutStatus:
    now = observed.now
    if not observed.candidate_ready:
        return state.model_copy(update={"reason": "CandidateStarting"})
    result = observed.agreement
    if result is None:
        return state
    summary = agreement_status(result)
    state = state.model_copy(update={"agreement": summary})
    if not result.passed:
        refused = "; ".join(result.failures)
        return roll_back(
            state, now, "Disagrees", f"revision {state.candidate} disagrees, so it gets no traffic: {refused} "
            f"({result.samples} inputs, {result.inputs}, {result.seconds:.1f} s)",
        )  # fmt: skip
    return _pods_for_step(state, rollout, 0, now, observed.ablated)


def _step(state: RolloutStatus, rollout: Rollout, observed: Observed) -> RolloutStatus:
    now = observed.now
    step = state.step or 0
    if state.step_started_at is None:
        if not observed.traffic_settled:
            return state
        state = state.model_copy(update={"step_started_at": timestamp(now)})
    analysis = observed.analysis
    if ended_by_spec(state, rollout, step) and (analysis is None or analysis.verdict != "Failed"):
        return _next_step(state, rollout, observed, step, "by spec.rollout.endStep")
    paused_by_spec = rollout.paused
    if analysis is None:
        if paused_by_spec and state.phase != "Paused":
            return _moved(state, now, phase="Paused", reason="PausedBySpec", message="held by spec.rollout.paused")
        if not paused_by_spec and state.reason == "PausedBySpec":
            return _moved(state, now, phase="Progressing", reason="Resumed", message="spec.rollout.paused unset")
        return state
    before = state.analysis if state.analysis is not None and state.analysis.step == step else None
    failures = (before.failures_in_a_row if before is not None else 0) + 1 if analysis.verdict == "Failed" else 0
    analysis = analysis.model_copy(update={"failures_in_a_row": failures})
    state = state.model_copy(update={"analysis": analysis})
    if analysis.verdict == "Failed":
        limit = rollout.analysis.failure_limit
        if failures >= limit:
            slow = analysis.check in ("latency", "p99")  # its answers are right, only late
            return roll_back(state, now, "AnalysisFailed", analysis.message, answers=slow)
        return state.model_copy(
            update={"reason": "AnalysisFailing", "message": f"{failures} of {limit} failed analyses in a row "
                    f"allowed before a rollback: {analysis.message}"}
        )  # fmt: skip
    if analysis.verdict in ("NoData", "Unreachable"):
        started = seconds_of(state.step_started_at) or now
        if analysis.verdict == "Unreachable" or now - started >= rollout.step_seconds:
            reason = "PrometheusUnreachable" if analysis.verdict == "Unreachable" else "NoData"
            if state.phase != "Paused" or state.reason != reason:
                return _moved(
                    state, now, phase="Paused", reason=reason, message=f"never promoted blind: {analysis.message}"
                )
        return state
    started = seconds_of(state.step_started_at) or now
    if paused_by_spec:
        if state.phase != "Paused" or state.reason != "PausedBySpec":
            return _moved(state, now, phase="Paused", reason="PausedBySpec", message="held by spec.rollout.paused")
        return state
    if now - started < rollout.step_seconds:
        if state.phase == "Paused":
            return _moved(state, now, phase="Progressing", reason="Resumed", message=analysis.message)
        return state
    pause = rollout.pause_at(step)
    if pause is not None and (pause.seconds is None or now - started < rollout.step_seconds + pause.seconds):
        if state.phase == "Paused" and state.reason == "PausedAtStep":
            return state
        until = "until promoted" if pause.seconds is None else f"for {pause.seconds} s more"
        return _moved(
            state, now, phase="Paused", reason="PausedAtStep",
            message=f"step {step + 1} of {len(rollout.steps)} ({state.weight}%) passed its {rollout.step_seconds} s "
            f"and holds {until} (spec.rollout.pauses; its analyses go on); `inferop rollout promote` ends it",
        )  # fmt: skip
    return _next_step(state, rollout, observed, step, "")


def ended_by_spec(state: RolloutStatus, rollout: Rollout, step: int) -> bool:
    """spec.rollout.endStep names this candidate's current step, whose traffic is in effect and whose last analysis
    did not fail."""
    failed = state.analysis is not None and state.analysis.step == step and state.analysis.verdict == "Failed"
    return (
        rollout.end_step == f"{state.candidate}/{step}"
        and state.step_started_at is not None
        and state.scaling_for is None
        and not failed
    )


def _next_step(state: RolloutStatus, rollout: Rollout, observed: Observed, step: int, why: str) -> RolloutStatus:
    """The step after `step`, once its pods are Ready; after the last, promotion. A step held by a pause goes on."""
    now = observed.now
    if step + 1 < len(rollout.steps):
        going_on = state.model_copy(update={"phase": "Progressing"}) if state.phase == "Paused" else state
        return _pods_for_step(going_on, rollout, step + 1, now, observed.ablated)
    return _moved(
        state, now, phase="Promoting", reason="PromotedBySpec" if why else "AllStepsPassed",
        message=f"revision {state.candidate} passed every step"
        + (f" (the last ended {why})" if why else "")
        + ": the stable Deployment takes its spec",
        weight=100, mirror_percent=0, scaling_for=None,
    )  # fmt: skip


def analysis_due(state: RolloutStatus, rollout: Rollout, now: float) -> bool:
    """A step whose traffic is in effect is analysed every `analysis.intervalSeconds`."""
    if state.phase not in ("Progressing", "Paused") or state.step_started_at is None:
        return False
    last = seconds_of(state.analysis.at) if state.analysis is not None and state.analysis.step == state.step else None
    since = last if last is not None else seconds_of(state.step_started_at)
    return since is None or now - since >= rollout.analysis.interval_seconds


def analysis_window(
    state: RolloutStatus, rollout: Rollout, now: float, ablated: frozenset[str] = frozenset()
) -> tuple[float, float]:
    """The window an analysis at `now` reads, as (start, seconds): the last `analysis.intervalSeconds`, never before the
    step's traffic took effect. A sliding window, not the step so far: a candidate that starts failing late in a long
    step is judged on what it does now, not diluted by the minutes it did well."""
    started = seconds_of(state.step_started_at)
    start = now - rollout.analysis.interval_seconds
    if started is not None:
        start = started if "sliding-window" in ablated else max(start, started)
    start = min(start, now - 1.0)  # a window of a second at least
    return start, now - start


def takes_live_traffic(state: RolloutStatus) -> bool:
    """The candidate's step sends it live requests now: a weight, or header-matched callers (mirrored ones get
    their answers from the stable revision)."""
    return (
        state.phase in ("Progressing", "Paused")
        and state.step_started_at is not None
        and (state.weight > 0 or state.header)
    )


def judge(
    candidate: TrackFigures,
    stable: TrackFigures | None,
    rollout: Rollout,
    step: int,
    weight: int,
    window: float,
    now: float,
    through_gateway: bool = False,
    ablated: frozenset[str] = frozenset(),
) -> AnalysisStatus:
    """The candidate against the stable revision over one window. Too few requests: no data, never a pass.

    Failures first: Triton's beyond the stable revision's share (on `minRequests` at least), then what callers got
    at the gateway (`through_gateway`, each track's `gateway` figures): 5xx answers, and resets and failed
    connections, beyond the stable revision's share. A candidate that crashes or refuses connections fails there
    without a single request in Triton's counters, where it would otherwise read as no data. Then too few requests in
    Triton is no data; a mean time above `maxLatencyRatio` times the stable revision's fails; and the gateway's p99
    above `maxP99Ratio` times the stable revision's fails (`_p99`: no request timed on a side is no data).

    Latency is compared only with the stable revision's in the same window, where both carry their share of the same
    load on the same machine: at a step where the stable revision has no traffic (100%), its latency from an earlier
    step was taken at a lighter load per pod, and a good candidate would fail against it on a busy machine. A slow
    candidate is caught at the earlier steps, where both serve."""
    limits = rollout.analysis
    allowed = limits.max_failure_ratio_increase
    at_gateway = (candidate.gateway, stable.gateway if stable is not None else None)
    figures = _figures(candidate, stable, window)

    def verdict(kind: Verdict, why: str, check: Check | None = None) -> AnalysisStatus:
        return AnalysisStatus(
            verdict=kind, message=f"{why}: {figures}", step=step, weight=weight, at=timestamp(now),
            since=timestamp(now - window), window_seconds=round(window, 1), check=check, candidate=candidate,
            stable=stable,
        )  # fmt: skip

    excess = (candidate.failure_ratio or 0.0) - ((stable.failure_ratio if stable else None) or 0.0)
    if candidate.requests >= limits.min_requests and excess > allowed:
        why = f"failure ratio {excess:+.2%} against the stable revision's (at most {allowed:+.2%})"
        return verdict("Failed", why, "failureRatio")
    failed = None if "gateway-failures" in ablated else _gateway_failures(*at_gateway, limits.min_requests, allowed)
    if failed is not None:
        return verdict("Failed", *failed)
    if candidate.requests < limits.min_requests:
        return verdict("NoData", f"{candidate.requests:.0f} of the {limits.min_requests} requests needed", "requests")
    reference = stable.mean_latency_ms if stable is not None else None
    if candidate.mean_latency_ms is None:
        return verdict("NoData", "no successful request to time", "latency")
    if reference:
        ratio = candidate.mean_latency_ms / reference
        if ratio > limits.max_latency_ratio:
            why = f"latency {ratio:.2f}x the stable revision's (at most {limits.max_latency_ratio:g}x)"
            return verdict("Failed", why, "latency")
        judged = f"latency {ratio:.2f}x, failure ratio {excess:+.2%} against the stable revision"
    else:
        judged = (
            f"failure ratio {excess:+.2%} against the stable revision; latency not compared: the stable revision "
            "served no request in this window (it was compared at the steps where both serve)"
        )
    p99 = _p99(*at_gateway, limits.min_requests, limits.max_p99_ratio, weight, through_gateway)
    if p99[0] != "Passed":
        return verdict(*p99)
    return verdict("Passed", f"{judged}; {p99[1]}")


def _gateway_failures(
    candidate: GatewayFigures | None, stable: GatewayFigures | None, min_requests: int, allowed: float
) -> tuple[str, Check] | None:
    """Why the gateway's figures fail the candidate, if they do: a share of 5xx answers, or of resets and failed
    connections, beyond the stable revision's by more than `allowed` (judged on `min_requests` at least)."""
    if candidate is None or candidate.requests < min_requests:
        return None
    reference = stable or GatewayFigures(requests=0, errors=0, resets=0)
    shares: tuple[tuple[Check, str, float | None, float | None], ...] = (
        ("gatewayErrors", "5xx answers", candidate.error_ratio, reference.error_ratio),
        ("gatewayResets", "resets and failed connections", candidate.reset_ratio, reference.reset_ratio),
    )
    for check, what, mine, theirs in shares:
        excess = (mine or 0.0) - (theirs or 0.0)
        if excess > allowed:
            return f"{what} at the gateway {excess:+.2%} against the stable revision's (at most {allowed:+.2%})", check
    return None


def _p99(
    candidate: GatewayFigures | None,
    stable: GatewayFigures | None,
    min_requests: int,
    most: float,
    weight: int,
    through_gateway: bool,
) -> tuple[Verdict, str, Check | None]:
    """The p99 gate: the candidate's p99 at the gateway over the stable revision's, at most `most`.

    No request at the gateway on a side is no data, never a pass; at 100% the stable revision is idle and not
    compared (as the mean). Requests without a p99 are a window in which Envoy did not update its histograms (every
    5 s), and fewer than P99_REQUESTS on a side (or `min_requests`, where more) make the quantile that side's slowest
    request or two, one of which crossing one of Envoy's coarse buckets (5, 10, 25 ms...) moves 2.5x: the gate is
    not applied, and the message says so. Without a gateway, or without Envoy series, there is nothing to compare.

    A p99 beyond the ratio is still a handful of requests: it fails when the candidate's requests slower than `most`
    times the stable revision's p99 (counted from the first bucket bound at or above it) are more than 1% of its
    requests would give with a chance under P99_SIGNIFICANCE."""
    if not through_gateway:
        return "Passed", "p99 not compared: no gateway (split by replicas)", None
    if candidate is None and stable is None:
        return "Passed", "p99 not compared: Prometheus has no Envoy series for the route's backends", None
    if candidate is None or candidate.requests <= 0:
        return "NoData", "no request of the candidate at the gateway for its p99", "p99"
    if stable is None or stable.requests <= 0:
        if weight >= 100:
            return "Passed", "p99 not compared: the stable revision served no request at the gateway", None
        return "NoData", "no request of the stable revision at the gateway for its p99", "p99"
    if candidate.p99_ms is None or stable.p99_ms is None:
        return "Passed", "p99 not judged: Envoy updated no histogram in this window (it does every 5 s)", None
    fewest = max(min_requests, P99_REQUESTS)
    if min(candidate.requests, stable.requests) < fewest:
        counts = f"{candidate.requests:.0f} and {stable.requests:.0f} requests timed at the gateway"
        return "Passed", f"p99 not judged: {counts}, fewer than the {fewest} it needs", None
    mine, theirs = candidate.p99_ms, stable.p99_ms
    ratio = mine / theirs if theirs > 0 else (math.inf if mine > 0 else 1.0)  # both in Envoy's first bucket
    said = f"p99 at the gateway {mine:.1f} ms against the stable revision's {theirs:.1f} ms: {ratio:.2f}x"
    if ratio <= most:
        return "Passed", said, None
    edge, slower = candidate.slower_than(theirs * most)
    timed = candidate.time_total
    chance = at_least(slower, timed, 1 - QUANTILE)
    counted = f"{slower:.0f} of its {timed:.0f} requests slower than {edge:g} ms"
    if chance >= P99_SIGNIFICANCE:
        likely = f"{chance:.2g} likely from a p99 within {most:g}x; the gate needs under {P99_SIGNIFICANCE:g}"
        return "Passed", f"{said}, but only {counted} ({likely})", None
    return "Failed", f"{said} (at most {most:g}x): {counted}, {chance:.2g} likely from a p99 within it", "p99"


def at_least(hits: float, trials: float, share: float) -> float:
    """The chance of `hits` or more in `trials` draws that each hit with chance `share` (the binomial's upper tail)."""
    n, k = round(trials), round(hits)
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    below = sum(
        math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(share)
                 + (n - i) * math.log1p(-share))
        for i in range(k)
    )  # fmt: skip
    return max(0.0, 1.0 - below)


def _figures(candidate: TrackFigures, stable: TrackFigures | None, window: float) -> str:
    def track(figures: TrackFigures | None) -> str:
        if figures is None:
            return "no figures"
        said = (
            f"{figures.requests:.0f} requests, {_ratio(figures.failure_ratio)} failed, {_ms(figures.mean_latency_ms)}"
        )
        gateway = figures.gateway
        if gateway is not None:
            said += (
                f" (gateway: {gateway.requests:.0f}, {_ratio(gateway.error_ratio)} 5xx, {gateway.resets:.0f} resets, "
                f"p99 {'n/a' if gateway.p99_ms is None else f'{gateway.p99_ms:.1f} ms'})"
            )
        return said

    return f"candidate {track(candidate)}; stable {track(stable)} (over {window:.0f} s)"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _ms(value: float | None) -> str:
    return "latency n/a" if value is None else f"{value:.1f} ms a request"


def track_figures(
    successes: float, failures: float, duration_us: float, gateway: GatewayFigures | None = None
) -> TrackFigures:
    """Figures from the increases of Triton's counters over a window (and the gateway's, where read)."""
    requests = successes + failures
    return TrackFigures(
        requests=round(requests, 1),
        failures=round(failures, 1),
        failure_ratio=round(failures / requests, 4) if requests > 0 else None,
        mean_latency_ms=round(duration_us / successes / 1000, 3) if successes > 0 else None,
        gateway=gateway,
    )


def gateway_figures(
    requests: float, errors: float, resets: float, buckets: TimeBuckets, unsent: float = 0.0
) -> GatewayFigures:
    """Figures from the increases of Envoy's counters for a revision's clusters over a window, and from its
    histogram of the time to the answer (`time_buckets`)."""
    p99_ms = histogram_quantile(QUANTILE, buckets)
    figures = GatewayFigures(
        requests=round(requests, 1),
        unsent=round(unsent, 1),
        errors=round(errors, 1),
        resets=round(resets, 1),
        error_ratio=round(errors / requests, 4) if requests > 0 else None,
        reset_ratio=round(resets / requests, 4) if requests > 0 else None,
        p99_ms=None if p99_ms is None else round(p99_ms, 3),
    )
    figures._time_buckets = buckets
    return figures


def time_buckets(by_le: Mapping[str, float]) -> TimeBuckets:
    """A histogram's increases by `le` (Prometheus' strings, "+Inf" last) as (bound, requests at or under it),
    ascending and cumulative as Prometheus makes them (an increase() a little out of order raised to the one below)."""
    pairs = sorted((float(le), count) for le, count in by_le.items() if not math.isnan(count))
    buckets, most = [], 0.0
    for bound, count in pairs:
        most = max(most, count)
        buckets.append((bound, most))
    return tuple(buckets)


def histogram_quantile(quantile: float, buckets: TimeBuckets) -> float | None:
    """The `quantile` of `buckets` as Prometheus' histogram_quantile reads it: linear within the bucket it falls
    in, from 0 below the first; the highest finite bound where it falls in the +Inf bucket; None without requests."""
    if not buckets or buckets[-1][0] != math.inf or buckets[-1][1] <= 0:
        return None
    rank = quantile * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > below:
            return lower if bound == math.inf else lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def replica_split(total: int, weight: int) -> tuple[int, int]:
    """(stable, candidate) pods behind one Service so that the candidate's share of the ready pods comes nearest to
    `weight` percent: at least one each while both serve, all on the candidate at 100 (approximate: a Service
    balances by pods, not by percent)."""
    if weight <= 0:
        return total, 0
    if weight >= 100:
        return 0, max(total, 1)
    total = max(total, 2)
    candidate = min(max(round(total * weight / 100), 1), total - 1)
    return total - candidate, candidate


def canary_replicas(stable_replicas: int, weight: int, mirror_percent: int, header: bool) -> int:
    """Pods the candidate needs behind a gateway: its share of the stable revision's pods, rounded up, at least one
    (it must answer the agreement check, mirrored and header-matched requests)."""
    share = max(weight, mirror_percent)
    return max(1, math.ceil(max(stable_replicas, 1) * share / 100))
