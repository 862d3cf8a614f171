"""The operator's Warnings for advice: one per change, and nothing kept of a service once it is deleted."""

from __future__ import annotations

from inferop_operator.status import AdviceLedger, Condition, Status


def failing_pods(message: str) -> Status:
    failing = Condition(type="PodsHealthy", status="False", reason="CrashLoopBackOff", message=message)
    return Status(conditions=[failing])


def posted(ledger: AdviceLedger, uid: str, status: Status) -> list[str]:
    return [advice.message for advice in ledger.to_post(uid, Status(), status)]


def test_the_same_advice_is_posted_once_per_change() -> None:
    # Two handlers can see the same change before either's status write is back: the second posts nothing.
    ledger = AdviceLedger()
    assert posted(ledger, "a", failing_pods("exec format error")) == ["exec format error"]
    assert posted(ledger, "a", failing_pods("exec format error")) == []
    assert posted(ledger, "a", failing_pods("OOMKilled")) == ["OOMKilled"]


def test_a_recovery_lets_the_same_failure_be_posted_again() -> None:
    ledger = AdviceLedger()
    posted(ledger, "a", failing_pods("exec format error"))
    healthy = Status(conditions=[Condition(type="PodsHealthy", status="True", reason="NoFailures")])
    assert posted(ledger, "a", healthy) == []
    assert posted(ledger, "a", failing_pods("exec format error")) == ["exec format error"]


def test_a_deleted_service_is_forgotten() -> None:
    ledger = AdviceLedger()
    posted(ledger, "a", failing_pods("exec format error"))
    posted(ledger, "b", failing_pods("exec format error"))
    ledger.forget("a")
    assert ledger.uids() == {"b"}
