"""The operator's Kafka edge: calls from many handler threads share requests, per cluster, against the sandbox."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kcm_common.kafka import KafkaSettings, KafkaUnavailableError
from kcm_operator.admin import BatchedAdmin, SubscriptionAdmin
from kcm_operator.reconcile import desired_from_spec, diff


class CountingAdmin(SubscriptionAdmin):
    """The real admin, counting the requests it sends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[int] = []
        self._count_lock = threading.Lock()

    def describe(self, names):
        with self._count_lock:
            self.requests.append(len(names))
        return super().describe(names)

    def alter(self, changes, validate_only=False):
        with self._count_lock:
            self.requests.append(len(changes))
        return super().alter(changes, validate_only)


def test_concurrent_single_calls_are_batched_and_each_caller_gets_its_own_result(sandbox):
    counting = CountingAdmin(KafkaSettings(sandbox.bootstrap))
    admin = BatchedAdmin(counting, linger_s=0.2)
    wanted = [desired_from_spec("ns", f"app-{index}", {"metrics": [f"m{index}."], "intervalMs": 1000 + index})
              for index in range(60)]
    try:
        with ThreadPoolExecutor(60) as pool:
            errors = list(pool.map(lambda desired: admin.alter_one(diff(desired, admin.describe_one(desired.name))),
                                   wanted))
            described = list(pool.map(lambda desired: admin.describe_one(desired.name), wanted))
    finally:
        admin.close()

    assert errors == [None] * 60
    assert described == [desired.configs() for desired in wanted]
    assert len(counting.requests) < 15, counting.requests  # 180 calls; one request each would be 180
    assert max(counting.requests) > 1


def test_a_failed_request_fails_every_caller_in_the_batch():
    admin = BatchedAdmin(SubscriptionAdmin(KafkaSettings("127.0.0.1:1"), timeout_s=1), linger_s=0.2)
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(admin.describe_one, f"s{index}") for index in range(5)]

    for future in futures:
        with pytest.raises(KafkaUnavailableError):
            future.result()
