"""Each decision of a rollout posted as JSON to the webhook its spec names (spec.rollout.webhook), in order, on a
thread of its own: a slow or failing receiver never holds a rollout up. Each post is retried with a doubling delay,
a bounded number of times; the queue is bounded too, and when it is full the oldest decision waiting is dropped
(logged, and counted in what a later post carries)."""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferop_operator.identity import API_VERSION, KIND
from inferop_operator.rollout import RolloutStatus, timestamp

log = logging.getLogger(__name__)
QUEUE_LIMIT = 256  # decisions waiting, every service together
FIRST_RETRY_SECONDS = 1.0
USER_AGENT = "inferop-operator"


@dataclass(frozen=True)
class Post:
    url: str
    payload: dict[str, Any]
    timeout: float
    attempts: int


@dataclass
class Notifier:
    """One receiver thread for the whole operator, started at the first post."""

    retry_seconds: float = FIRST_RETRY_SECONDS
    _queue: collections.deque[Post] = field(default_factory=lambda: collections.deque(maxlen=QUEUE_LIMIT))
    _ready: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    dropped: int = 0  # decisions dropped from a full queue, so far
    delivered: int = 0
    failed: int = 0  # posts given up after their attempts

    def notify(self, url: str, payload: dict[str, Any], timeout: float, attempts: int) -> None:
        """Queues one decision and returns at once."""
        with self._ready:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
                log.warning("rollout webhook: %d decisions waiting, the oldest dropped", len(self._queue))
            self._queue.append(Post(url, {**payload, "droppedBefore": self.dropped}, timeout, attempts))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rollout-webhook", daemon=True)
                self._thread.start()
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                post = self._queue.popleft()
            if self._deliver(post):
                self.delivered += 1
            else:
                self.failed += 1

    def _deliver(self, post: Post) -> bool:
        body = json.dumps(post.payload).encode()
        delay = self.retry_seconds
        for attempt in range(1, post.attempts + 1):
            request = urllib.request.Request(
                post.url, data=body, method="POST",
                headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=post.timeout) as answer:
                    answer.read()
                return True
            except (urllib.error.URLError, OSError, ValueError) as error:
                why = f"HTTP {error.code}" if isinstance(error, urllib.error.HTTPError) else str(error)
                log.warning("rollout webhook %s: attempt %d of %d failed: %s", post.url, attempt, post.attempts, why)
            if attempt < post.attempts:
                time.sleep(delay)
                delay *= 2
        return False


def decision(metadata: Mapping[str, Any], state: RolloutStatus) -> dict[str, Any]:
    """What a post says: the service, when, and the rollout's state as status.rollout spells it (without the stable
    revision's spec)."""
    rollout = state.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"stable_spec"})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "namespace": metadata.get("namespace"),
        "name": metadata.get("name"),
        "at": timestamp(time.time()),
        "rollout": rollout,
    }


NOTIFIER = Notifier()
