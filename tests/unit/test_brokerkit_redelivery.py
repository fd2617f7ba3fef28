"""Redelivery accounting: only a message's own failures count; tallies are bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharedstream import AdvanceOutcome
from sharedstream.brokerkit.redelivery import DeliveryTally, PoisonCheck, RedeliveryPolicy
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import AdvanceItem, SharedStreamProducer, outcome_with_unseen


def test_only_own_failures_count() -> None:
    assert RedeliveryPolicy.counts(AdvanceOutcome(1, 1, 0))
    assert not RedeliveryPolicy.counts(outcome_with_unseen(1, 1, 0, unseen=1))
    assert RedeliveryPolicy.counts(outcome_with_unseen(0, 2, 0, unseen=1))
    assert not RedeliveryPolicy.counts(AdvanceOutcome(1, 0, 0))


def test_limits() -> None:
    policy = RedeliveryPolicy(max_redeliveries=2)
    assert [policy.exhausted(n) for n in (1, 2, 3)] == [False, False, True]
    # The third delivery may still be fanned out (two failed before it); the fourth not.
    assert [policy.poisoned_on_arrival(n) for n in (3, 4)] == [False, True]


@given(st.lists(st.integers(0, 20), max_size=200), st.integers(1, 8))
def test_a_tally_counts_and_forgets_only_the_oldest(keys: list[int], capacity: int) -> None:
    tally: DeliveryTally[int] = DeliveryTally(capacity)
    exact: dict[int, int] = {}
    for key in keys:
        exact[key] = exact.get(key, 0) + 1
        while len(exact) > capacity:
            del exact[next(iter(exact))]
        assert tally.add(key) == exact[key]
    assert len(tally) <= capacity
    assert {key: tally.get(key) for key in exact} == exact


def test_forget() -> None:
    tally: DeliveryTally[str] = DeliveryTally()
    tally.add("m", 3)
    tally.forget("m")
    tally.forget("m")
    assert tally.get("m") == 0



class _Owner(SharedStreamProducer):
    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        yield 1, 1

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        return None


class _Ledger:
    def __init__(self, counts: Mapping[str, int], error: Exception | None = None) -> None:
        self.counts_of, self.error = dict(counts), error
        self.asked: list[list[str]] = []

    async def add(self, names: Sequence[str]) -> None:
        raise AssertionError("not asked to count")

    async def counts(self, names: Sequence[str]) -> Mapping[str, int]:
        self.asked.append(list(names))
        if self.error is not None:
            raise self.error
        return {name: self.counts_of[name] for name in names if name in self.counts_of}


def _check(ledger: _Ledger | None, max_redeliveries: int = 1) -> PoisonCheck:
    owner = _Owner()
    owner.failure_ledger = ledger
    owner.stream_name = "s"
    return PoisonCheck(RedeliveryPolicy(max_redeliveries), owner,
                       logger=key_value_logger("test.poison"))


def test_the_ledger_decides_whether_a_suspect_is_poison(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "test.poison")
    ledger = _Ledger({"crashed": 1, "failing": 2})
    check = _check(ledger)  # max_redeliveries 1: poison past 1 failure of its own
    suspects = {0: ("crashed", 5), 1: ("failing", 3), 2: ("unknown", 4), 3: (None, 3)}
    assert asyncio.run(check.confirmed(suspects)) == {1, 3}  # no name: the broker's count
    assert ledger.asked == [["crashed", "failing", "unknown"]]
    assert check.cleared == 2
    assert "fanning out again messages delivered more than max_redeliveries + 1" in caplog.text
    assert "messages=2" in caplog.text


def test_past_the_ceiling_a_message_is_poison_whatever_the_ledger_says() -> None:
    check = _check(_Ledger({}), max_redeliveries=1)
    assert check.policy.ceiling == 20
    assert asyncio.run(check.confirmed({0: ("a", 20), 1: ("b", 21)})) == {1}


def test_without_a_ledger_the_broker_s_count_decides() -> None:
    check = _check(None)
    assert asyncio.run(check.confirmed({0: ("a", 3), 4: ("b", 7)})) == {0, 4}
    assert asyncio.run(check.confirmed({})) == set()


def test_a_ledger_that_cannot_answer_fans_the_suspects_out_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = _check(_Ledger({"a": 9}, error=OSError("the store is away")))
    assert asyncio.run(check.confirmed({0: ("a", 3), 1: ("b", 100)})) == {1}  # 1: the ceiling
    assert "cannot read raw events' failures from the store" in caplog.text
    assert "the store is away" in caplog.text


def test_split_keeps_arrival_order_and_puts_each_message_in_one_list() -> None:
    check = _check(_Ledger({"own": 2, "crashed": 0}))  # max_redeliveries 1
    arrived = ["m0", "m1", "m2", "m3", "m4"]
    suspects = {1: ("own", 3), 3: ("crashed", 5), 4: (None, 3)}
    fan_out, poison = asyncio.run(check.split(arrived, suspects))
    assert (fan_out, poison) == (["m0", "m2", "m3"], ["m1", "m4"])
    assert asyncio.run(check.split(arrived, {})) == (arrived, [])
    assert asyncio.run(check.split([], {})) == ([], [])
