"""Redelivery accounting: only a message's own failures count; tallies are bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sharedstream import AdvanceOutcome
from sharedstream.brokerkit.redelivery import DeliveryTally, RedeliveryPolicy
from sharedstream.engine.producer import outcome_with_unseen


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
