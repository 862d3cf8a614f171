"""The operator's Warning for advice: one per change, and nothing kept of a service once it is deleted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferop_operator import handlers
from inferop_operator.status import Condition, Status


def failing_pods(message: str) -> Status:
    failing = Condition(type="PodsHealthy", status="False", reason="CrashLoopBackOff", message=message)
    return Status(conditions=[failing])


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(handlers.kopf, "warn", lambda body, reason, message: said.append(message))
    monkeypatch.setattr(handlers, "_advised", {})
    return said


def forget(uid: str, kind: str) -> None:
    event: Any = {"type": kind, "object": {}}
    asyncio.run(handlers.forget_deleted(event=event, uid=uid))


def test_the_same_advice_is_said_once_per_change(warnings: list[str]) -> None:
    # Two handlers can see the same change before either's status write is back: the second says nothing.
    handlers.advise({}, "a", Status(), failing_pods("exec format error"))
    handlers.advise({}, "a", Status(), failing_pods("exec format error"))
    handlers.advise({}, "a", Status(), failing_pods("OOMKilled"))
    assert warnings == ["exec format error", "OOMKilled"]


def test_a_deleted_service_is_forgotten(warnings: list[str]) -> None:
    handlers.advise({}, "a", Status(), failing_pods("exec format error"))
    handlers.advise({}, "b", Status(), failing_pods("exec format error"))
    forget("a", "MODIFIED")
    assert {uid for uid, _ in handlers._advised} == {"a", "b"}
    forget("a", "DELETED")
    assert {uid for uid, _ in handlers._advised} == {"b"}
