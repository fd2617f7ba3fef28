"""Retries with backoff: the schedule, what is retried, what is wrapped (a fake sleep)."""

from __future__ import annotations

import pytest

from sharedstream.brokerkit.errors import BrokerRequestError
from sharedstream.brokerkit.retry import RetryPolicy, retrying


class Flaky(Exception):
    def __init__(self, transient: bool) -> None:
        super().__init__("transient" if transient else "lasting")
        self.transient = transient


def test_delays_double_up_to_the_cap() -> None:
    assert list(RetryPolicy(5, 0.5, max_delay=2.0).delays()) == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert list(RetryPolicy(0, 0.5).delays()) == []


async def attempt(errors: list[Flaky], policy: RetryPolicy) -> tuple[str, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def call() -> str:
        if errors:
            raise errors.pop(0)
        return "done"

    result = await retrying("fetching", call, policy=policy, catch=Flaky,
                            transient=lambda exc: isinstance(exc, Flaky) and exc.transient,
                            wrap=BrokerRequestError, sleep=sleep)
    return result, slept


async def test_transient_errors_are_retried_with_backoff() -> None:
    result, slept = await attempt([Flaky(True), Flaky(True)], RetryPolicy(3, 0.1))
    assert (result, slept) == ("done", [0.1, 0.2])


async def test_a_lasting_error_is_wrapped_at_once() -> None:
    with pytest.raises(BrokerRequestError, match="fetching failed: lasting") as caught:
        await attempt([Flaky(False)], RetryPolicy(3, 0.1))
    assert isinstance(caught.value.__cause__, Flaky)


async def test_the_last_attempts_error_is_wrapped_when_retries_run_out() -> None:
    errors = [Flaky(True) for _ in range(3)]
    with pytest.raises(BrokerRequestError) as caught:
        await attempt(errors, RetryPolicy(2, 0.1))
    assert errors == [], "three attempts: the first and two retries"
    assert caught.value.retryable


async def test_errors_it_was_not_asked_to_catch_pass_through() -> None:
    async def call() -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        await retrying("x", call, policy=RetryPolicy(3, 0.0), catch=Flaky,
                       transient=lambda exc: True, wrap=BrokerRequestError)
