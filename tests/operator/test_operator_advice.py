"""The operator's Warnings for advice: one per change, and nothing kept of a service once it is deleted."""

from __future__ import annotations

import threading

from inferop_operator.status import AdviceLedger, Condition, Status

HEALTHY = Status(conditions=[Condition(type="PodsHealthy", status="True", reason="NoFailures")])


def failing_pods(message: str) -> Status:
    failing = Condition(type="PodsHealthy", status="False", reason="CrashLoopBackOff", message=message)
    return Status(conditions=[failing])


def posted(ledger: AdviceLedger, uid: str, status: Status) -> list[str]:
    return [advice.message for advice in ledger.derive(uid, Status(), lambda: status)[1]]


def test_the_same_advice_is_posted_once_per_change() -> None:
    # Two handlers can see the same change before either's status write is back: the second posts nothing.
    ledger = AdviceLedger()
    assert posted(ledger, "a", failing_pods("exec format error")) == ["exec format error"]
    assert posted(ledger, "a", failing_pods("exec format error")) == []
    assert posted(ledger, "a", failing_pods("OOMKilled")) == ["OOMKilled"]


def test_a_recovery_lets_the_same_failure_be_posted_again() -> None:
    ledger = AdviceLedger()
    posted(ledger, "a", failing_pods("exec format error"))
    assert posted(ledger, "a", HEALTHY) == []
    assert posted(ledger, "a", failing_pods("exec format error")) == ["exec format error"]


def test_a_status_built_from_older_reports_does_not_post_a_failure_twice() -> None:
    # A resync (on a thread) reads the pods healthy; before it is done, the pods' handler sees the OOM kill and
    # posts it. The resync's healthy status must not clear it, or the next look posts the same kill again.
    ledger = AdviceLedger()
    read, oom_seen = threading.Event(), threading.Event()

    def stale() -> Status:
        read.set()
        oom_seen.wait(timeout=1)  # set only if the pods' handler got in between
        return HEALTHY

    resync = threading.Thread(target=ledger.derive, args=("a", Status(), stale))
    resync.start()
    read.wait()
    first = posted(ledger, "a", failing_pods("OOMKilled"))
    oom_seen.set()
    resync.join()
    again = posted(ledger, "a", failing_pods("OOMKilled"))
    assert first + again == ["OOMKilled"]


def test_a_deleted_service_is_forgotten() -> None:
    ledger = AdviceLedger()
    posted(ledger, "a", failing_pods("exec format error"))
    posted(ledger, "b", failing_pods("exec format error"))
    ledger.forget("a")
    assert ledger.uids() == {"b"}
