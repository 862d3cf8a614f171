"""The rollout's webhook (inferop_operator.webhook): each decision posted as JSON in order, retried when the receiver
fails, never holding up the caller, bounded when the receiver is down."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from inferop_operator.rollout import RolloutStatus
from inferop_operator.webhook import QUEUE_LIMIT, Notifier, decision
from tests.helpers import WebhookReceiver as Receiver
from tests.helpers import wait_for


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver(failures=2)
    yield made
    made.server.shutdown()


def state(phase: str, weight: int) -> RolloutStatus:
    return RolloutStatus.model_validate(
        {"phase": phase, "reason": "StepStarted", "stable": "aaa", "candidate": "bbb", "weight": weight,
         "stableSpec": {"model": {}}}
    )  # fmt: skip


def test_each_decision_arrives_in_order_after_the_receivers_failures(receiver: Receiver) -> None:
    notifier = Notifier(retry_seconds=0.05)
    metadata = {"namespace": "models", "name": "conv-net"}
    for weight in (5, 25, 50):
        notifier.notify(receiver.url, decision(metadata, state("Progressing", weight)), timeout=5, attempts=3)
    wait_for(lambda: len(receiver.accepted) == 3, timeout=10, what="three decisions accepted")
    assert [posted["rollout"]["weight"] for posted in receiver.accepted] == [5, 25, 50]
    first = receiver.accepted[0]
    assert (first["kind"], first["namespace"], first["name"], first["rollout"]["phase"]) == (
        "InferenceService", "models", "conv-net", "Progressing",
    )  # fmt: skip
    assert "stableSpec" not in first["rollout"] and first["droppedBefore"] == 0
    assert receiver.posts == 5 and notifier.delivered == 3  # the first two posts failed, and were retried


def test_a_receiver_that_hangs_never_holds_the_caller_and_the_queue_stays_bounded() -> None:
    hanging = Receiver()
    hanging.open.clear()
    notifier = Notifier(retry_seconds=0.05)
    sent = QUEUE_LIMIT + 10
    began = time.monotonic()
    for weight in range(sent):
        notifier.notify(hanging.url, {"weight": weight}, timeout=30, attempts=1)
    assert time.monotonic() - began < 1.0
    assert notifier.dropped >= 9  # the first post is held by the receiver, QUEUE_LIMIT wait, the rest pushed out
    hanging.open.set()
    wait_for(lambda: notifier.delivered == sent - notifier.dropped, timeout=30, what="the queue delivered")
    assert [posted["weight"] for posted in hanging.accepted][-1] == sent - 1  # the newest kept
    hanging.server.shutdown()


def test_a_post_is_given_up_after_its_attempts() -> None:
    failing = Receiver(failures=100)
    notifier = Notifier(retry_seconds=0.01)
    notifier.notify(failing.url, {"weight": 5}, timeout=5, attempts=3)
    wait_for(lambda: notifier.failed == 1, timeout=10, what="the post given up")
    assert failing.posts == 3 and not failing.accepted
    failing.server.shutdown()
