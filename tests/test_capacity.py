"""The queue bound: the spec's if set, else Little's law on the measured capacity, so an accepted request is
answered within half its timeout; with no capacity, two rounds of batches and a message saying how to fix it."""

from __future__ import annotations

import math

import pytest

from inferop.capacity import (
    SERVED_SHARE_OF_CAPACITY,
    WAIT_SHARE_OF_TIMEOUT,
    QueueBound,
    derive_queue_bound,
    pod_capacity,
)
from inferop.threads import ThreadPlan, plan_threads


class TestDeriveQueueBound:
    @pytest.mark.parametrize("capacity", [8.0, None])
    def test_the_spec_value_wins(self, capacity: float | None) -> None:
        bound = derive_queue_bound(capacity, 10.0, instances=1, max_batch_size=8, requested=5)
        assert (bound.size, bound.source, bound.capacity) == (5, "spec", capacity)
        assert bound.explain(10.0) == "queue bound 5 (batching.maxQueueSize)"

    def test_littles_law_for_an_inception_like_model(self) -> None:
        # 10 samples/s x 0.8 served x 10 s x 0.5 = 40 samples of wait, less 3 rounds of 1 instance x batch 8.
        bound = derive_queue_bound(10.0, 10.0, instances=1, max_batch_size=8)
        assert (bound.size, bound.source, bound.capacity) == (16, "capacity", 10.0)
        assert bound.explain(10.0) == (
            "queue bound 16 = 10 samples/s x 0.8 served under overload x 10s x 0.5 less 3 rounds of batches, "
            "at most 1024"
        )

    @pytest.mark.parametrize(
        ("capacity", "seconds", "instances", "batch", "size"),
        [
            (10.0, 10.0, 1, 8, 16),
            (32.0, 10.0, 2, 8, 128 - 48),  # the pod of the inception example: 4 CPUs
            (5000.0, 2.0, 2, 16, 1024),  # the conv net: thousands of boards a second, capped
            (8.5, 3.0, 1, 1, math.floor(10.2) - 3),  # Little's law rounds down: never more wait than allowed
        ],
    )
    def test_littles_law_less_three_rounds(
        self, capacity: float, seconds: float, instances: int, batch: int, size: int
    ) -> None:
        assert derive_queue_bound(capacity, seconds, instances, batch).size == size

    @pytest.mark.parametrize(("capacity", "seconds"), [(8.0, 10.0), (32.0, 2.5), (5000.0, 2.0), (100.0, 1.0)])
    def test_an_accepted_request_is_answered_within_half_its_timeout(self, capacity: float, seconds: float) -> None:
        """Ahead of the last request admitted: the full queue, the batches in execution and its own, served at
        the rate a pod keeps under overload."""
        instances, batch = 2, 4
        bound = derive_queue_bound(capacity, seconds, instances, batch)
        assert bound.size > batch  # the floor did not apply: the law did
        served = capacity * SERVED_SHARE_OF_CAPACITY
        assert (bound.size + 2 * instances * batch) / served <= seconds * WAIT_SHARE_OF_TIMEOUT

    @pytest.mark.parametrize(
        ("capacity", "seconds", "batch"),
        [(8.0, 1.0, 8), (1.0, 10.0, 32), (0.1, 0.001, 1), (10.0, 5.0, 8)],  # the last: 20 - 24 < 8
    )
    def test_never_below_one_full_batch(self, capacity: float, seconds: float, batch: int) -> None:
        bound = derive_queue_bound(capacity, seconds, instances=1, max_batch_size=batch)
        assert (bound.size, bound.source) == (batch, "capacity")

    @pytest.mark.parametrize(("instances", "batch"), [(1, 8), (2, 16), (4, 1)])
    def test_unknown_capacity_is_two_rounds_of_batches(self, instances: int, batch: int) -> None:
        bound = derive_queue_bound(None, 10.0, instances, batch)
        assert (bound.size, bound.source, bound.capacity) == (2 * instances * batch, "unknown capacity", None)

    def test_unknown_capacity_says_how_to_fix_it(self) -> None:
        message = derive_queue_bound(None, 10.0, instances=1, max_batch_size=8).explain(10.0)
        assert message.startswith("queue bound 16 = 2 rounds of batches: capacity unknown")
        assert "model.profile.samplesPerCpuSecond" in message
        assert "re-export" in message
        assert "batching.maxQueueSize" in message

    def test_is_a_value(self) -> None:
        assert derive_queue_bound(10.0, 10.0, 1, 8) == QueueBound(16, "capacity", 10.0)


class TestPodCapacity:
    @pytest.mark.parametrize(
        ("threads", "busy_cpus"),
        [
            (plan_threads(4, 2), 4),  # 2 instances x 2 intra-op threads
            (plan_threads(4, 1, intra_op=2), 2),  # fewer threads than CPUs: idle CPUs add nothing
            (plan_threads(2, 2, intra_op=2), 2),  # oversubscribed: the CPUs are the limit
            (plan_threads(8, 3), 6),  # floor(8 / 3) = 2 intra-op threads each
            (plan_threads(2.5, 2), 2),
            (plan_threads(0.5, 1), 0.5),  # half a CPU runs one thread at half speed
            (plan_threads(4, 1, intra_op=2, inter_op=3), 2),  # inter-op threads do not run one op faster
        ],
    )
    def test_the_cpus_the_threads_can_use(self, threads: ThreadPlan, busy_cpus: float) -> None:
        assert pod_capacity(8.0, threads) == pytest.approx(8.0 * busy_cpus)

    def test_unknown_stays_unknown(self) -> None:
        assert pod_capacity(None, plan_threads(4, 2)) is None
