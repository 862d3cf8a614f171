"""Status a user reads with kubectl: phase, conditions and replicas derived from facts, never assumed."""

from __future__ import annotations

from typing import Any

import pytest

from inferop_core.memory import CONTAINER_RUNTIME
from inferop_core.objectstore import ADVICE
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_operator.builders import Service, build_deployment
from inferop_operator.diagnosis import FETCH_FIELDS, candidate_failure, pod_facts
from inferop_operator.kubeapi import ApiFailure
from inferop_operator.plan import MEMORY_MARGIN, memory_limit, plan_service
from inferop_operator.spec import parse_spec
from inferop_operator.status import (
    CONDITION_TYPES,
    READY_REQUIRES,
    MemoryStatus,
    Status,
    children_failed_status,
    condition,
    deployed_status,
    follow_deployment,
    follow_pods,
    invalid_status,
    merge_conditions,
    new_advice,
    new_warnings,
    plan_status,
    pods_condition,
    read_status,
    ready_condition,
    refused_status,
    same_condition,
    status_patch,
)
from tests.specs import MODEL, raw_spec

OLD = "2020-01-01T00:00:00Z"
AT_OLD = {"last_transition_time": OLD}
MI = 2**20
IO_BYTES = (1 * 8 * 7 + 7 + 1) * 4  # board in, policy and value out: FP32
INPUT_BYTES = 1 * 8 * 7 * 4  # what a queued request holds


def peak(instances: int = 2, batch: int = 8, queue: int = 2 * 2 * 8) -> int:
    """The peak of make_service's model (4Mi weights, 1Mi activations a sample) in NVIDIA's container, by hand."""
    costs = CONTAINER_RUNTIME
    return (
        costs.baseline_bytes
        + instances * costs.instance_bytes
        + round(instances * 4 * MI * costs.weight_factor)
        + round(instances * batch * MI * costs.activation_factor)
        + round(
            queue * (INPUT_BYTES * costs.buffer_factor + costs.request_bytes)
            + instances * batch * (IO_BYTES * costs.buffer_factor + costs.request_bytes)
            + instances * costs.busy_instance_bytes
        )
    )


def make_service(capacity: float | None = None, **sections: Any) -> Service:
    profile: dict[str, Any] = {
        "parameters": 10,
        "macsPerSample": 100,
        "weightBytes": 4 * MI,
        "activationBytesPerSample": MI,
    }
    if capacity is not None:
        profile["samplesPerCpuSecond"] = capacity
    raw = raw_spec(
        model={**MODEL, "profile": profile}, instances=2, resources={"limits": {"cpu": "4", "memory": "1Gi"}}
    )
    raw.update(sections)
    spec = parse_spec(raw)
    return Service(name="conv-net", namespace="models", uid="uid-1", spec=spec, plan=plan_service(spec), image="triton")


def deployment(
    desired: int = 2, ready: int = 2, generation: int = 3, observed: int = 3, available: str | None = "True"
) -> dict[str, Any]:
    """A Deployment as the API server returns it."""
    status: dict[str, Any] = {"observedGeneration": observed, "replicas": desired, "readyReplicas": ready}
    if available is not None:
        status["conditions"] = [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            {
                "type": "Available",
                "status": available,
                "reason": "MinimumReplicasAvailable" if available == "True" else "MinimumReplicasUnavailable",
                "message": "Deployment has minimum availability.",
            },
        ]
    return {"metadata": {"generation": generation}, "spec": {"replicas": desired}, "status": status}


def written(status: Status) -> dict[str, Any]:
    """The status as the handlers write it and kubectl shows it: camelCase, unset fields left out."""
    return status.model_dump(by_alias=True, exclude_none=True)


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def aged(status: Status) -> Status:
    """`status` as if written long ago: every condition's transition time is OLD."""
    return status.model_copy(
        update={"conditions": [c.model_copy(update={"last_transition_time": OLD}) for c in status.conditions]}
    )


class TestMergeConditions:
    def test_unchanged_status_keeps_the_transition_time(self) -> None:
        previous = [condition("Ready", False, "ReplicasNotReady", "0/2 replicas ready").model_copy(update=AT_OLD)]
        (merged,) = merge_conditions(previous, [condition("Ready", False, "ReplicasNotReady", "1/2 replicas ready")])
        assert merged.last_transition_time == OLD
        assert merged.message == "1/2 replicas ready"  # the message itself is current

    def test_changed_status_moves_the_transition_time(self) -> None:
        previous = [condition("Ready", False, "ReplicasNotReady", "1/2").model_copy(update=AT_OLD)]
        (merged,) = merge_conditions(previous, [condition("Ready", True, "AllReplicasReady", "2/2")])
        assert merged.status == "True"
        assert merged.last_transition_time is not None and merged.last_transition_time > OLD
        assert merged.last_transition_time.endswith("Z")

    def test_new_conditions_get_a_time(self) -> None:
        (merged,) = merge_conditions([], [condition("Valid", True, "SpecValid", "ok")])
        assert merged.last_transition_time is not None and merged.last_transition_time > OLD

    def test_fixed_order(self) -> None:
        current = [
            condition("Ready", True, "r", ""),
            condition("MemoryFit", True, "m", ""),
            condition("Valid", True, "v", ""),
            condition("Available", True, "a", ""),
            condition("ChildrenApplied", True, "c", ""),
            condition("ThreadBudget", True, "t", ""),
        ]
        merged = merge_conditions([], current)
        assert [c.type for c in merged] == [
            "Valid",
            "ThreadBudget",
            "MemoryFit",
            "ChildrenApplied",
            "Available",
            "Ready",
        ]

    def test_conditions_that_no_longer_apply_are_dropped(self) -> None:
        previous = [condition("MemoryFit", False, "InsufficientMemory", "x").model_copy(update=AT_OLD)]
        merged = merge_conditions(previous, [condition("Valid", False, "InvalidSpec", "y")])
        assert [c.type for c in merged] == ["Valid"]

    @pytest.mark.parametrize(("ok", "text"), [(True, "True"), (False, "False"), (None, "Unknown")])
    def test_condition_status_strings(self, ok: bool | None, text: str) -> None:
        assert condition("Ready", ok, "r", "m").status == text


class TestDeployedStatus:
    @pytest.mark.parametrize(
        ("deployed", "phase", "ready", "reason", "message"),
        [
            (deployment(), "Ready", "True", "AllReplicasReady", "2/2 replicas ready"),
            (deployment(ready=1), "Progressing", "False", "ReplicasNotReady", "1/2 replicas ready"),
            (
                deployment(ready=0, available="False"),
                "Progressing",
                "False",
                "ReplicasNotReady",
                "0/2 replicas ready",
            ),
            (
                deployment(desired=0, ready=0),
                "Progressing",
                "False",
                "ScaledToZero",
                "replicas is 0: nothing serves requests",
            ),
            (
                deployment(generation=4, observed=3),
                "Progressing",
                "False",
                "ReplicasNotReady",
                "2/2 replicas ready",
            ),
            (None, "Progressing", "False", "DeploymentMissing", "the Deployment does not exist yet"),
        ],
        ids=[
            "ready",
            "not ready",
            "unavailable",
            "scaled to zero",
            "not caught up with generation",
            "missing",
        ],
    )
    def test_ready_and_phase(
        self, deployed: dict[str, Any] | None, phase: str, ready: str, reason: str, message: str
    ) -> None:
        status = written(deployed_status(make_service(), deployed, 7, Status()))
        assert status["phase"] == phase
        ready_condition = by_type(status)["Ready"]
        assert (ready_condition["status"], ready_condition["reason"], ready_condition["message"]) == (
            ready,
            reason,
            message,
        )
        assert status["observedGeneration"] == 7

    def test_replica_counts(self) -> None:
        status = written(deployed_status(make_service(), deployment(desired=3, ready=1), 1, Status()))
        assert (status["replicas"], status["readyReplicas"]) == (3, 1)

    def test_missing_deployment_has_no_replicas(self) -> None:
        status = written(deployed_status(make_service(), None, 1, Status()))
        assert (status["replicas"], status["readyReplicas"]) == (0, 0)
        assert by_type(status)["Available"]["status"] == "Unknown"
        assert by_type(status)["Available"]["reason"] == "NoDeploymentStatus"

    @pytest.mark.parametrize(("available", "expected"), [("True", "True"), ("False", "False")])
    def test_available_follows_the_deployment(self, available: str, expected: str) -> None:
        status = written(deployed_status(make_service(), deployment(available=available), 1, Status()))
        condition_ = by_type(status)["Available"]
        assert condition_["status"] == expected
        assert condition_["reason"] in ("MinimumReplicasAvailable", "MinimumReplicasUnavailable")

    def test_deployment_without_status_yet(self) -> None:
        built = build_deployment(make_service())  # as applied, before the controller reports
        status = written(deployed_status(make_service(), built, 1, Status()))
        assert by_type(status)["Available"]["status"] == "Unknown"
        assert status["phase"] == "Progressing"
        assert by_type(status)["Ready"]["reason"] == "ReplicasNotReady"

    def test_checks_that_passed_are_reported(self) -> None:
        status = written(deployed_status(make_service(), deployment(), 1, Status()))
        conditions = by_type(status)
        assert list(conditions) == [
            "Valid",
            "ThreadBudget",
            "MemoryFit",
            "ChildrenApplied",
            "Progressing",
            "PodsHealthy",
            "Available",
            "Ready",
        ]
        assert conditions["Valid"]["status"] == "True"
        assert (conditions["ChildrenApplied"]["status"], conditions["ChildrenApplied"]["reason"]) == ("True", "Applied")
        assert conditions["ChildrenApplied"]["message"] == (
            "ConfigMap conv-net-config, Service conv-net, Deployment conv-net applied"
        )
        assert conditions["ThreadBudget"]["status"] == "True"
        assert (
            "2 instance(s) x (2 intra-op + 1 inter-op - 1) = 4 threads on 4 CPU(s)"
            in conditions["ThreadBudget"]["message"]
        )
        assert (conditions["MemoryFit"]["status"], conditions["MemoryFit"]["reason"]) == ("True", "Fits")
        message = conditions["MemoryFit"]["message"]
        assert message.startswith(f"peak estimate {format_bytes(CONTAINER_RUNTIME.baseline_bytes)} runtime + ")
        limit = format_bytes(parse_quantity(memory_limit(peak())))
        assert message.endswith(
            f"= {format_bytes(peak())}, x {MEMORY_MARGIN} margin = {limit} against 1Gi of memory "
            f"(resources.limits.memory) ({CONTAINER_RUNTIME.assumed})"
        )

    def test_memory_not_checked_is_unknown(self) -> None:
        status = written(deployed_status(make_service(resources={"limits": {"cpu": "4"}}), deployment(), 1, Status()))
        memory = by_type(status)["MemoryFit"]
        assert (memory["status"], memory["reason"]) == ("Unknown", "NotChecked")
        assert "resources.limits.memory is not set" in memory["message"]
        assert "availableBytes" not in status["memory"]

    def test_url_threads_and_memory(self) -> None:
        status = written(deployed_status(make_service(), deployment(), 1, Status()))
        assert status["url"] == "http://conv-net.models.svc:8000"
        assert status["threads"] == {
            "cpus": 4.0,
            "cpuSource": "limit",
            "instances": 2,
            "intraOp": 2,
            "interOp": 1,
            "summary": "2x(2+1)/4cpu",
        }
        assert status["memory"] == {"requiredBytes": peak(), "availableBytes": 2**30}

    def test_transition_time_kept_across_reconciles(self) -> None:
        first = deployed_status(make_service(), deployment(ready=1), 1, Status())
        second = deployed_status(make_service(), deployment(), 1, aged(first))
        times = {c.type: c.last_transition_time for c in second.conditions}
        assert times["Valid"] == OLD  # still True
        assert times["Ready"] > OLD  # False -> True


class TestPlanStatus:
    def test_selector_matches_the_pods(self) -> None:
        service = make_service()
        selector = dict(pair.split("=") for pair in written(plan_status(service))["selector"].split(","))
        assert selector == build_deployment(service)["spec"]["selector"]["matchLabels"]

    def test_assumed_cpu_is_visible(self) -> None:
        status = written(plan_status(make_service(resources={}, instances=1)))
        assert (status["threads"]["cpus"], status["threads"]["cpuSource"]) == (1.0, "assumed")
        assert status["threads"]["summary"] == "1x(1+1)/1cpu"

    def test_instances_taking_turns_say_so(self) -> None:
        status = written(plan_status(make_service(resources={"limits": {"cpu": "1", "memory": "8Gi"}}, instances=None)))
        assert (status["threads"]["instances"], status["threads"]["summary"]) == (2, "2x(1+1)/1cpu in turns")

    def test_derived_queue_bound(self) -> None:
        # 4 CPUs, 2 instances x 2 intra-op threads: 8 x 4 = 32 samples/s x 0.95 x 10 s x 0.5 = 152.
        status = written(plan_status(make_service(capacity=8.0)))
        assert status["queue"] == {"maxQueueSize": 152, "source": "capacity", "capacitySamplesPerSecond": 32.0}
        assert status["memory"]["requiredBytes"] == peak(queue=152)  # the estimate holds the queue it bounds

    def test_queue_bound_from_the_spec(self) -> None:
        status = written(plan_status(make_service(capacity=8.0, batching={"maxQueueSize": 5})))
        assert status["queue"] == {"maxQueueSize": 5, "source": "spec", "capacitySamplesPerSecond": 32.0}

    def test_queue_bound_of_unknown_capacity(self) -> None:
        status = written(plan_status(make_service()))
        assert status["queue"] == {"maxQueueSize": 2 * 2 * 8, "source": "unknown capacity"}

    def test_status_queue_is_the_configured_one(self) -> None:
        service = make_service(capacity=8.0)
        assert written(plan_status(service))["queue"]["maxQueueSize"] == service.plan.serving.max_queue_size

    def test_fractional_cpus(self) -> None:
        status = written(plan_status(make_service(resources={"limits": {"cpu": "2500m"}})))
        assert status["threads"]["summary"] == "2x(1+1)/2cpu"
        assert status["threads"]["cpus"] == 2.5


class TestFailedStatus:
    def test_invalid_spec(self) -> None:
        message = "spec.batching.maxBatchSize: Input should be greater than or equal to 1"
        status = written(invalid_status(message, 4, Status()))
        assert (status["phase"], status["observedGeneration"]) == ("Failed", 4)
        conditions = by_type(status)
        assert (conditions["Valid"]["status"], conditions["Valid"]["reason"]) == ("False", "InvalidSpec")
        assert conditions["Valid"]["message"] == message
        assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "InvalidSpec")
        assert "ThreadBudget" not in conditions

    def test_thread_budget_refusal(self) -> None:
        status = written(refused_status("ThreadBudget", "Oversubscribed", "8 threads on 2 CPU(s)", 2, Status()))
        assert status["phase"] == "Failed"
        conditions = by_type(status)
        assert list(conditions) == ["Valid", "ThreadBudget", "Ready"]
        assert conditions["Valid"]["status"] == "True"
        assert (conditions["ThreadBudget"]["status"], conditions["ThreadBudget"]["reason"]) == (
            "False",
            "Oversubscribed",
        )
        assert conditions["ThreadBudget"]["message"] == "8 threads on 2 CPU(s)"
        assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "Oversubscribed")
        assert "8 threads on 2 CPU(s)" in conditions["Ready"]["message"]

    def test_memory_refusal_reports_the_thread_budget_passed(self) -> None:
        status = written(refused_status("MemoryFit", "InsufficientMemory", "needs 3Gi", 2, Status()))
        conditions = by_type(status)
        assert list(conditions) == ["Valid", "ThreadBudget", "MemoryFit", "Ready"]
        assert conditions["ThreadBudget"]["status"] == "True"
        assert (conditions["MemoryFit"]["status"], conditions["MemoryFit"]["reason"]) == (
            "False",
            "InsufficientMemory",
        )
        assert conditions["Ready"]["reason"] == "InsufficientMemory"

    def test_a_refusal_outside_the_prerequisites_holds_ready_back_itself(self) -> None:
        needs = "spec.rollout.header needs a Gateway"
        conditions = by_type(written(refused_status("Rollout", "NeedsGateway", needs, 3, Status())))
        assert (conditions["Rollout"]["status"], conditions["Ready"]["status"]) == ("False", "False")
        assert conditions["Ready"]["reason"] == "NeedsGateway"
        assert conditions["Ready"]["message"] == f"spec refused, nothing deployed for it: {needs}"

    def test_a_missing_gateway_is_a_child_not_applied(self) -> None:
        status = written(refused_status("ChildrenApplied", "GatewayNotFound", "Gateway x does not exist", 3, Status()))
        conditions = by_type(status)
        assert conditions["ChildrenApplied"]["reason"] == "GatewayNotFound"
        assert conditions["Ready"]["message"] == "not every child is applied: Gateway x does not exist"

    def test_fixing_the_spec_moves_valid(self) -> None:
        invalid = invalid_status("bad", 1, Status())
        refused = refused_status("ThreadBudget", "Oversubscribed", "x", 2, aged(invalid))
        times = {c.type: c.last_transition_time for c in refused.conditions}
        assert times["Valid"] > OLD  # False -> True
        assert times["Ready"] == OLD  # still False


class TestReadiness:
    SERVING = condition("Ready", True, "AllReplicasReady", "2/2 replicas ready")

    def holding(self) -> list[Any]:
        return [condition(p.type, True, "Fine", "fine") for p in READY_REQUIRES]

    def test_the_pods_decide_once_every_prerequisite_holds(self) -> None:
        assert ready_condition(self.holding(), self.SERVING) == self.SERVING
        # memory not bounded (Unknown) does not hold a service back
        unknown = [*self.holding()[:2], condition("MemoryFit", None, "NotChecked", "no limit"), *self.holding()[3:]]
        assert ready_condition(unknown, self.SERVING) == self.SERVING

    @pytest.mark.parametrize("failing", range(len(READY_REQUIRES)))
    def test_the_first_failing_prerequisite_decides_whatever_the_pods_say(self, failing: int) -> None:
        found = self.holding()
        found[failing] = condition(READY_REQUIRES[failing].type, False, "Broken", "what broke")
        later = failing + 1 < len(found)
        if later:  # a later one failing too does not speak first
            found[failing + 1] = condition(READY_REQUIRES[failing + 1].type, False, "AlsoBroken", "later")
        ready = ready_condition(list(reversed(found)), self.SERVING)
        assert ready.status == "False"
        assert ready.reason == (READY_REQUIRES[failing].reason or "Broken")
        assert ("what broke" in ready.message) == ("{message}" in READY_REQUIRES[failing].message)
        assert "later" not in ready.message

    def test_every_prerequisite_is_a_condition_of_the_status_before_ready(self) -> None:
        types = [p.type for p in READY_REQUIRES]
        assert len(set(types)) == len(types)
        assert all(CONDITION_TYPES.index(t) < CONDITION_TYPES.index("Ready") for t in types)

    def test_nothing_failing_and_nothing_serving_is_refused(self) -> None:
        with pytest.raises(ValueError, match="pods"):
            ready_condition(self.holding())


def failure(status: int, reason: str, message: str, kind: str = "Service", name: str = "conv-net") -> ApiFailure:
    return ApiFailure(action="apply", kind=kind, name=name, status=status, reason=reason, message=message)


RANGE_FULL = failure(500, "InternalError", "Internal error occurred: failed to allocate a serviceIP: range is full")
QUOTA = failure(403, "Forbidden", 'services "conv-net" is forbidden: exceeded quota: no-services')
INVALID = failure(422, "Invalid", 'Service "7-up" is invalid: metadata.name: Invalid value: "7-up"', name="7-up")


class TestChildrenFailedStatus:
    @pytest.mark.parametrize(
        ("refused", "phase", "outlook"),
        [
            (RANGE_FULL, "Pending", "retried with a backoff"),
            (QUOTA, "Pending", "retried with a backoff"),
            (INVALID, "Failed", "not retried until the spec changes"),
        ],
        ids=["range full", "quota", "invalid"],
    )
    def test_the_servers_reason_and_message_name_the_child(self, refused: ApiFailure, phase: str, outlook: str) -> None:
        status = written(children_failed_status(make_service(), refused, 5, Status()))
        assert (status["phase"], status["observedGeneration"]) == (phase, 5)
        conditions = by_type(status)
        applied = conditions["ChildrenApplied"]
        assert (applied["status"], applied["reason"]) == ("False", refused.reason)
        assert applied["message"] == (
            f"apply Service {refused.name}: {refused.status} {refused.reason}: {refused.message} ({outlook})"
        )
        ready = conditions["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "ChildrenNotApplied")
        assert refused.message in ready["message"]

    def test_the_checks_that_passed_and_the_plan_stay_visible(self) -> None:
        status = written(children_failed_status(make_service(), RANGE_FULL, 1, Status()))
        assert list(by_type(status)) == ["Valid", "ThreadBudget", "MemoryFit", "ChildrenApplied", "Ready"]
        assert {by_type(status)[kind]["status"] for kind in ("Valid", "ThreadBudget", "MemoryFit")} == {"True"}
        assert status["threads"] == written(plan_status(make_service()))["threads"]
        assert status["memory"]["requiredBytes"] == peak()

    def test_what_the_deployment_reported_last_is_kept(self) -> None:
        deployed = aged(deployed_status(make_service(), deployment(), 1, Status()))
        conditions = by_type(written(children_failed_status(make_service(), QUOTA, 2, deployed)))
        assert conditions["Available"] == by_type(written(deployed))["Available"]
        assert conditions["ChildrenApplied"]["lastTransitionTime"] > OLD  # True -> False
        assert conditions["Valid"]["lastTransitionTime"] == OLD

    def test_applying_again_clears_the_failure(self) -> None:
        failed = children_failed_status(make_service(), QUOTA, 2, Status())
        healed = written(deployed_status(make_service(), deployment(), 2, failed))
        assert by_type(healed)["ChildrenApplied"]["status"] == "True"
        assert healed["phase"] == "Ready"

    def test_a_retry_meeting_the_same_answer_changes_no_condition(self) -> None:
        first = children_failed_status(make_service(), RANGE_FULL, 2, Status())
        again = children_failed_status(make_service(), RANGE_FULL, 2, first)
        assert same_condition("ChildrenApplied", first, again)
        assert again.conditions == first.conditions
        other = children_failed_status(make_service(), QUOTA, 2, first)
        assert not same_condition("ChildrenApplied", first, other)


class TestFollowDeployment:
    """What the Deployment watcher writes: readiness on top of the status the service handler wrote."""

    def test_refreshes_readiness_and_keeps_the_rest(self) -> None:
        reconciled = aged(deployed_status(make_service(), deployment(ready=1), 4, Status()))
        followed = follow_deployment(reconciled, deployment(ready=2), reconciled)
        assert (followed.phase, followed.replicas, followed.ready_replicas) == ("Ready", 2, 2)
        conditions = {c.type: c for c in followed.conditions}
        assert (conditions["Ready"].status, conditions["Ready"].message) == ("True", "2/2 replicas ready")
        assert conditions["Ready"].last_transition_time != OLD  # False -> True
        assert conditions["Available"].last_transition_time == OLD  # True before and after
        unchanged = ("Valid", "ThreadBudget", "MemoryFit", "ChildrenApplied")
        assert [conditions[kind] for kind in unchanged] == [reconciled.condition(kind) for kind in unchanged]
        assert followed.model_copy(
            update={"phase": None, "replicas": None, "ready_replicas": None, "conditions": []}
        ) == (reconciled.model_copy(update={"phase": None, "replicas": None, "ready_replicas": None, "conditions": []}))

    def test_what_the_watcher_writes_is_only_readiness(self) -> None:
        reconciled = deployed_status(make_service(), deployment(ready=1), 4, Status())
        patch = status_patch(written(reconciled), follow_deployment(reconciled, deployment(ready=2), reconciled))
        assert set(patch) == {"phase", "readyReplicas", "conditions"}

    def test_the_same_deployment_writes_nothing(self) -> None:
        reconciled = deployed_status(make_service(), deployment(), 4, Status())
        assert status_patch(written(reconciled), follow_deployment(reconciled, deployment(), reconciled)) == {}


class TestStatusPatch:
    def test_a_converged_service_writes_nothing(self) -> None:
        first = deployed_status(make_service(), deployment(), 1, Status())
        again = deployed_status(make_service(), deployment(), 1, read_status(written(first)))
        assert status_patch(written(first), again) == {}

    def test_a_key_no_longer_reported_is_removed(self) -> None:
        """Without the merge patch's null, a stale availableBytes would stay after the memory limit is removed."""
        limited = written(deployed_status(make_service(), deployment(), 1, Status()))
        unlimited = deployed_status(make_service(resources={"limits": {"cpu": "4"}}), deployment(), 2, Status())
        patch = status_patch(limited, unlimited)
        assert patch["memory"]["availableBytes"] is None
        assert patch["observedGeneration"] == 2

    def test_fields_a_failed_spec_does_not_report_stay(self) -> None:
        deployed = written(deployed_status(make_service(), deployment(), 1, Status()))
        patch = status_patch(deployed, invalid_status("bad", 2, read_status(deployed)))
        assert set(patch) == {"phase", "observedGeneration", "conditions"}  # threads, url... stay as they were

    def test_an_unreadable_status_counts_as_none(self) -> None:
        assert read_status({"phase": "Exploded", "conditions": "none"}) == Status()
        assert read_status(None) == Status()


class TestWarningsOnChange:
    def test_the_plans_warnings_are_recorded(self) -> None:
        status = deployed_status(make_service(resources={}, instances=1), deployment(), 1, Status())
        assert status.warnings is not None
        assert any(w.startswith("no CPU limit or request set") for w in status.warnings)

    def test_a_warning_is_new_once(self) -> None:
        first = deployed_status(make_service(resources={}, instances=1), deployment(), 1, Status())
        assert new_warnings(Status(), first) == first.warnings
        again = deployed_status(make_service(resources={}, instances=1), deployment(), 1, read_status(written(first)))
        assert new_warnings(read_status(written(first)), again) == []

    def test_only_what_the_edit_changed_is_new(self) -> None:
        limited = deployed_status(make_service(), deployment(), 1, Status())
        unlimited = deployed_status(make_service(resources={"limits": {"cpu": "4"}}), deployment(), 2, limited)
        assert new_warnings(limited, unlimited) == ["memory fit not checked: resources.limits.memory is not set"]
        # A warning that stops holding is dropped; the ones still holding were posted already.
        assumed = deployed_status(make_service(resources={}, instances=1), deployment(), 3, unlimited)
        fixed = deployed_status(make_service(resources={"limits": {"cpu": "1"}}, instances=1), deployment(), 4, assumed)
        assert new_warnings(assumed, fixed) == []
        assert not any(w.startswith("no CPU limit") for w in fixed.warnings or [])

    @pytest.mark.parametrize(
        "failed",
        [
            lambda previous: invalid_status("spec.replicas: must be >= 0", 3, previous),
            lambda previous: refused_status("ThreadBudget", "Oversubscribed", "8 threads on 2 CPU(s)", 3, previous),
        ],
        ids=["invalid", "refused"],
    )
    def test_a_failure_said_again_is_the_same_condition(self, failed: Any) -> None:
        first = failed(Status())
        again = failed(read_status(written(first)))
        kind = "Valid" if first.condition("Valid").status == "False" else "ThreadBudget"
        assert same_condition(kind, first, again)
        assert not same_condition(kind, Status(), first)


def pod(
    name: str = "conv-net-abc-1",
    memory_limit: str | None = "1Gi",
    image: str = "nvcr.io/nvidia/tritonserver:24.08-py3",
    ready: bool = False,
    restarts: int = 0,
    **state: Any,
) -> dict[str, Any]:
    """A Triton pod as the API server returns it; `state` gives the triton container's state and lastState."""
    resources = {"limits": {"memory": memory_limit}} if memory_limit else {}
    return {
        "metadata": {"name": name},
        "spec": {
            "initContainers": [{"name": "layout-model", "resources": {"limits": {"memory": "64Mi"}}}],
            "containers": [{"name": "triton", "image": image, "resources": resources}],
        },
        "status": {
            "initContainerStatuses": [
                {
                    "name": "layout-model",
                    "image": image,
                    "ready": True,
                    "state": {"terminated": {"reason": "Completed", "exitCode": 0}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "triton",
                    "image": image,
                    "ready": ready,
                    "state": state.get("state", {"running": {}}),
                    "lastState": state.get("last_state", {}),
                    "restartCount": restarts,
                }
            ],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


OOM = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
CRASH = {"terminated": {"reason": "Error", "exitCode": 1, "message": "failed to load 'conv_net': bad config"}}
BACK_OFF = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}


def fetch_status(message: str, reason: str = "Error", code: int = 1) -> dict[str, Any]:
    """The fetch init container's status after a failed fetch, as the kubelet reports it (restarting it)."""
    ended = {"reason": reason, "exitCode": code, **({"message": message} if message else {})}
    return {
        "name": "fetch-model",
        "image": "i",
        "ready": False,
        "state": {"running": {}},
        "lastState": {"terminated": ended},
    }


def healthy(pods: list[dict[str, Any]], memory_bytes: int = 800 * MI) -> Any:
    return pods_condition([pod_facts(p) for p in pods], MemoryStatus(required_bytes=memory_bytes))


class TestPodsHealthy:
    """PodsHealthy: why the pods fail, with the fix, derived from what the kubelet reports."""

    def test_running_and_starting_pods_are_healthy(self) -> None:
        found = healthy([pod(ready=True), pod("conv-net-abc-2", state={"waiting": {"reason": "ContainerCreating"}})])
        assert (found.status, found.reason) == ("True", "NoFailures")

    def test_oom_kill_below_the_estimate_names_the_size_that_fits(self) -> None:
        found = healthy([pod(memory_limit="512Mi", last_state=OOM, state=BACK_OFF)], memory_bytes=800 * MI)
        assert (found.status, found.reason) == ("False", "OOMKilled")
        assert "container triton of pod conv-net-abc-1 was OOM-killed at its memory limit of 512Mi" in found.message
        # 800Mi x 1.28 = 1024Mi: the size export would have written
        assert "estimates 800Mi with the queue full: set resources.limits.memory to 1024Mi" in found.message
        assert "(the estimate x 1.28, the margin that covers the worst underestimate measured" in found.message

    def test_oom_kill_above_the_estimate_says_by_how_much_it_was_exceeded(self) -> None:
        found = healthy([pod(memory_limit="1Gi", ready=True, last_state=OOM)], memory_bytes=800 * MI)
        assert found.reason == "OOMKilled"  # even restarted and ready: the same load kills it again
        assert "above the memory model's estimate of 800Mi" in found.message
        assert "needed at least 224Mi (28%) more than estimated" in found.message
        assert "raise runtime.memoryOverhead by at least that" in found.message
        assert "set resources.limits.memory to 1311Mi (the limit x 1.28)" in found.message  # 1024Mi x 1.28, rounded up

    def test_crash_loop_gives_the_last_termination(self) -> None:
        found = healthy([pod(state=BACK_OFF, last_state=CRASH)])
        assert (found.status, found.reason) == ("False", "CrashLoopBackOff")
        assert "it last exited with code 1 (Error): failed to load 'conv_net': bad config" in found.message

    def test_a_crash_loop_between_back_offs_says_the_same(self) -> None:
        """Restarted and not ready yet: the same condition, so no new Event on every restart."""
        waiting = healthy([pod(state=BACK_OFF, last_state=CRASH)])
        restarted = healthy([pod(state={"running": {}}, last_state=CRASH)])
        assert (restarted.reason, restarted.message) == (waiting.reason, waiting.message)
        recovered = healthy([pod(ready=True, state={"running": {}}, last_state=CRASH)])
        assert recovered.reason == "NoFailures"

    @pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
    def test_unpullable_image_names_it_and_what_to_check(self, reason: str) -> None:
        found = healthy([pod(image="registry.example/triton:nope", state={"waiting": {"reason": reason}})])
        assert (found.status, found.reason) == ("False", "ImagePullFailed")  # one reason: the kubelet alternates
        assert 'cannot pull image "registry.example/triton:nope"' in found.message
        for check in ("image name", "registry is reachable", "imagePullSecrets"):
            assert check in found.message

    def test_the_first_failing_pod_by_name_and_a_count_of_the_others(self) -> None:
        found = healthy(
            [pod("b", last_state=OOM, memory_limit="512Mi"), pod("a", last_state=OOM, memory_limit="512Mi")]
        )
        assert "of pod a was OOM-killed" in found.message
        assert found.message.endswith("(1 more container(s) likewise)")

    @pytest.mark.parametrize(
        ("written", "reason", "field"),
        [
            ("DigestMismatch: s3://models/conv_net/1/model.onnx: SHA-256 aa, but the model was exported as bb: the",
             "ModelDigestMismatch", "spec.model.sha256"),
            ("AccessDenied: s3://models/conv_net: the server refused the credentials (SignatureDoesNotMatch)",
             "ModelAccessDenied", "spec.model.storage.credentialsSecret"),
            ("BucketNotFound: s3://models/conv_net: bucket 'models' does not exist", "ModelBucketNotFound",
             "spec.model.storageUri"),
            ("DownloadTimeout: s3://models/conv_net: not complete within 300 s", "ModelDownloadTimeout",
             "spec.model.storage.downloadTimeoutSeconds"),
        ],
    )  # fmt: skip
    def test_a_failed_fetch_is_its_own_reason_with_the_fetch_s_words(
        self, written: str, reason: str, field: str
    ) -> None:
        """The fetch's last words (its termination log) name the reason; the message keeps the object and digests,
        and names the field of the spec that changes it."""
        failing = pod(ready=False)
        failing["status"]["initContainerStatuses"].insert(0, fetch_status(written))
        found = healthy([failing])
        assert (found.status, found.reason) == ("False", reason)
        said = written.partition(": ")[2]
        assert found.message.startswith(
            f"container fetch-model of pod conv-net-abc-1 could not fetch the model: {said}"
        )
        assert found.message.endswith(")") and field in found.message.rpartition("(to change: ")[2]

    def test_every_fetch_failure_names_a_field_to_change(self) -> None:
        assert set(FETCH_FIELDS) == set(ADVICE)

    def test_a_fetch_killed_without_last_words_is_still_named(self) -> None:
        failing = pod(ready=False)
        failing["status"]["initContainerStatuses"].insert(0, fetch_status("", reason="Error", code=137))
        found = healthy([failing])
        assert found.reason == "ModelFetchFailed"
        assert "exited with code 137 (Error): no termination message" in found.message
        assert "kubectl logs -c fetch-model" in found.message

    def test_a_missing_credentials_secret_is_named_with_what_it_must_hold(self) -> None:
        failing = pod(ready=False)
        waiting = {"reason": "CreateContainerConfigError", "message": 'secret "model-store" not found'}
        failing["status"]["initContainerStatuses"].insert(
            0, {"name": "fetch-model", "image": "i", "ready": False, "state": {"waiting": waiting}}
        )
        found = healthy([failing])
        assert (found.status, found.reason) == ("False", "ContainerConfigError")
        assert 'secret "model-store" not found' in found.message
        assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in found.message

    def test_an_image_pull_comes_before_a_crash(self) -> None:
        found = healthy(
            [pod("a", state=BACK_OFF, last_state=CRASH), pod("b", state={"waiting": {"reason": "ErrImagePull"}})]
        )
        assert found.reason == "ImagePullFailed"


class TestCandidateFailure:
    """What of a rollout's candidate pods rolls it back whatever its metrics say (diagnosis.candidate_failure): each
    failure from what the kubelet reports, none from healthy or starting pods."""

    def failure(self, pods: list[dict[str, Any]], takes_traffic: bool = True) -> Any:
        return candidate_failure([pod_facts(p) for p in pods], 800 * MI, takes_traffic)

    def test_healthy_and_starting_pods_fail_nothing(self) -> None:
        starting = pod("conv-net-canary-2", state={"waiting": {"reason": "ContainerCreating"}})
        assert self.failure([pod("conv-net-canary-1", ready=True), starting]) is None

    def test_an_oom_kill_names_the_size_that_fits(self) -> None:
        found = self.failure([pod(memory_limit="512Mi", ready=True, restarts=1, last_state=OOM)])
        assert found is not None and found.reason == "OOMKilled"
        assert "was OOM-killed at its memory limit of 512Mi" in found.message

    def test_a_crash_loop_says_the_servers_last_words(self) -> None:
        found = self.failure([pod(restarts=3, state=BACK_OFF, last_state=CRASH)])
        assert found is not None and found.reason == "CrashLoopBackOff"
        assert "failed to load 'conv_net': bad config" in found.message

    def test_a_restart_ready_again_still_fails_it(self) -> None:
        killed = {"terminated": {"reason": "Error", "exitCode": 137, "message": "liveness probe failed"}}
        found = self.failure([pod(ready=True, restarts=1, last_state=killed)])
        assert found is not None and found.reason == "Restarted"
        assert found.message == (
            "container triton of pod conv-net-abc-1 restarted 1 time(s); it last exited with code 137 (Error): "
            "liveness probe failed"
        )

    def test_a_fetch_retried_before_the_server_started_is_no_restart(self) -> None:
        retried = pod(ready=True)
        retried["status"]["initContainerStatuses"][0]["restartCount"] = 2
        assert self.failure([retried]) is None

    def test_no_ready_pod_fails_it_only_while_its_step_sends_it_requests(self) -> None:
        starting = [pod("conv-net-canary-1"), pod("conv-net-canary-2")]
        assert self.failure(starting, takes_traffic=False) is None  # the agreement, or a step not yet in effect
        found = self.failure(starting)
        assert found is not None and found.reason == "Unavailable"
        assert found.message == (
            "no pod of the candidate is Ready (conv-net-canary-1, conv-net-canary-2) while its step sends it live "
            "requests"
        )

    def test_a_pod_being_deleted_is_not_looked_at(self) -> None:
        """A rolled-back candidate's pods may still be terminating when the next candidate starts."""
        previous = pod("conv-net-canary-old", restarts=1, last_state=OOM)
        previous["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        assert self.failure([previous, pod("conv-net-canary-new", ready=True)]) is None

    def test_an_oom_kill_comes_before_a_crash_loop_and_a_restart(self) -> None:
        found = self.failure(
            [pod("a", restarts=2, state=BACK_OFF, last_state=CRASH), pod("b", restarts=1, last_state=OOM)]
        )
        assert found is not None and found.reason == "OOMKilled"


def stuck(deadline: int = 600) -> dict[str, Any]:
    stuck = deployment(ready=0, available="False")
    stuck["spec"]["progressDeadlineSeconds"] = deadline
    stuck["status"]["conditions"][0] = {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": 'ReplicaSet "conv-net-7f9" has timed out progressing.',
    }
    return stuck


class TestAdvice:
    """Progressing and PodsHealthy in the status, and the Warning each change gets once."""

    def test_a_stuck_rollout_says_what_to_check(self) -> None:
        status = deployed_status(make_service(), stuck(), 1, Status())
        progress = status.condition("Progressing")
        assert progress is not None
        assert (progress.status, progress.reason) == ("False", "ProgressDeadlineExceeded")
        assert "no progress for 600s" in progress.message
        assert 'ReplicaSet "conv-net-7f9" has timed out progressing' in progress.message
        assert "timeouts.startupSeconds" in progress.message and "Pending" in progress.message

    def test_the_deployment_asks_for_a_deadline_from_the_startup_budget(self) -> None:
        deployed = build_deployment(make_service(timeouts={"startupSeconds": 900}))
        assert deployed["spec"]["progressDeadlineSeconds"] == 1200
        assert build_deployment(make_service())["spec"]["progressDeadlineSeconds"] == 600  # Kubernetes' default

    def test_each_failure_is_new_advice_once(self) -> None:
        oom = [pod_facts(pod(memory_limit="512Mi", last_state=OOM))]
        first = deployed_status(make_service(), stuck(), 1, Status(), oom)
        assert {(c.type, c.reason) for c in new_advice(Status(), first)} == {
            ("Progressing", "ProgressDeadlineExceeded"),
            ("PodsHealthy", "OOMKilled"),
        }
        again = deployed_status(make_service(), stuck(), 1, read_status(written(first)), oom)
        assert new_advice(read_status(written(first)), again) == []
        assert status_patch(written(first), again) == {}  # a resync writes nothing either

    def test_recovered_pods_clear_the_condition(self) -> None:
        failing = deployed_status(make_service(), deployment(), 1, Status(), [pod_facts(pod(state=BACK_OFF))])
        assert failing.condition("PodsHealthy").reason == "CrashLoopBackOff"  # type: ignore[union-attr]
        recovered = follow_pods(failing, [pod_facts(pod(ready=True))], failing)
        assert recovered.condition("PodsHealthy").status == "True"  # type: ignore[union-attr]
        assert follow_pods(failing, [], failing).condition("PodsHealthy").status == "True"  # type: ignore[union-attr]

    def test_a_refused_child_keeps_what_the_pods_said(self) -> None:
        failing = deployed_status(make_service(), deployment(), 1, Status(), [pod_facts(pod(state=BACK_OFF))])
        refused = children_failed_status(make_service(), QUOTA, 2, failing)
        assert refused.condition("PodsHealthy") == failing.condition("PodsHealthy")
