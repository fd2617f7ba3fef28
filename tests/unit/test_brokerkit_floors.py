"""Lane floors: a failure holds its ordered lane; the lane's later messages bounce behind it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sharedstream import AdvanceOutcome
from sharedstream.brokerkit.floors import (
    AGAIN,
    BOUNCE,
    LEAVE,
    POISON,
    REJECTED,
    SETTLE,
    LaneFloors,
)
from sharedstream.brokerkit.redelivery import RedeliveryPolicy
from sharedstream.engine.producer import outcome_with_unseen

ACKED, FAILED, REFUSED = AdvanceOutcome(1, 0, 0), AdvanceOutcome(0, 1, 0), AdvanceOutcome(0, 0, 1)
NOBODY = AdvanceOutcome(0, 0, 0)


def floors(max_redeliveries: int = 5, capacity: int = 4096) -> LaneFloors[str]:
    return LaneFloors(RedeliveryPolicy(max_redeliveries), capacity=capacity)


def test_each_outcome_has_its_place() -> None:
    lanes = floors()
    assert lanes.place("a", "m1", ACKED, ordered=True) == SETTLE
    assert lanes.place("b", "m2", REFUSED, ordered=True) == REJECTED
    assert lanes.place("c", "m3", NOBODY, ordered=True) == LEAVE
    assert lanes.place("d", "m4", FAILED, ordered=True) == AGAIN


def test_a_failure_holds_an_ordered_lane_until_it_comes_back() -> None:
    lanes = floors()
    assert lanes.place("key", "m1", FAILED, ordered=True) == AGAIN
    assert lanes.floor("key") == "m1"
    # The lane's later messages are handed back behind it, whatever they did, uncounted.
    assert lanes.place("key", "m2", ACKED, ordered=True) == BOUNCE
    assert lanes.place("key", "m3", FAILED, ordered=True) == BOUNCE
    assert lanes.failures.get("m3") == 0
    assert lanes.bounced.get("m2") == 1
    # Other lanes go on.
    assert lanes.place("other", "x1", ACKED, ordered=True) == SETTLE
    # The floor's message comes back first and lifts the floor.
    assert lanes.place("key", "m1", ACKED, ordered=True) == SETTLE
    assert lanes.floor("key") is None
    assert lanes.place("key", "m2", ACKED, ordered=True) == SETTLE


def test_a_floor_dead_lettered_on_arrival_no_longer_holds_its_lane() -> None:
    lanes = floors(max_redeliveries=1)
    assert lanes.place("key", "m1", FAILED, ordered=True) == AGAIN
    assert lanes.place("key", "m2", ACKED, ordered=True) == BOUNCE
    # m1 comes back poison by the store's count and is dead-lettered before it is placed.
    lanes.forget("key", "m1")
    assert lanes.floor("key") is None
    assert lanes.place("key", "m2", ACKED, ordered=True) == SETTLE
    # Forgetting a message that does not hold the lane's floor leaves the floor.
    assert lanes.place("key", "m3", FAILED, ordered=True) == AGAIN
    lanes.forget("key", "m4")
    assert lanes.floor("key") == "m3"


def test_a_lane_of_one_message_never_holds_a_floor() -> None:
    lanes = floors()
    assert lanes.place(("message", "m1"), "m1", FAILED, ordered=False) == AGAIN
    assert lanes.floor(("message", "m1")) is None


def test_own_failures_past_the_limit_are_poison_and_others_do_not_count() -> None:
    lanes = floors(max_redeliveries=1)
    unseen = outcome_with_unseen(0, 1, 0, unseen=1)  # its subscriber died on another message
    assert lanes.place("k", "m", unseen, ordered=False) == AGAIN
    assert lanes.failures.get("m") == 0
    assert lanes.bounced.get("m") == 1
    assert lanes.place("k", "m", FAILED, ordered=False) == AGAIN
    assert lanes.place("k", "m", FAILED, ordered=False) == POISON


def test_poison_on_arrival_discounts_what_was_not_its_own() -> None:
    lanes = floors(max_redeliveries=1)
    assert lanes.poisoned_on_arrival("m", 3)  # delivered 3 times, allowed 2
    lanes.bounced.add("m")
    assert not lanes.poisoned_on_arrival("m", 3)  # one of them was a bounce


def test_poison_on_arrival_discounts_the_deliveries_taken_here_that_did_not_fail() -> None:
    """A lease that lapsed while nobody failed on the message is a redelivery, not a failure."""
    lanes = floors(max_redeliveries=0)
    assert lanes.poisoned_on_arrival("m", 2)  # one earlier delivery: counted, by default
    assert not lanes.poisoned_on_arrival("m", 2, taken=1)  # ours, and it lapsed: not counted
    assert lanes.place("k", "m", FAILED, ordered=False) == POISON  # its own failure counts
    lanes = floors(max_redeliveries=1)
    lanes.place("k", "m", FAILED, ordered=False)  # delivery 1: failed
    # delivery 2 lapsed; delivery 3 arrives: one of its two taken deliveries was a failure
    assert not lanes.poisoned_on_arrival("m", 3, taken=2)
    # deliveries this consumer never saw (a crash, another process) are never discounted
    assert lanes.poisoned_on_arrival("m", 4, taken=2)
    lanes.bounced.add("m", 3)  # bounces are deliveries taken here too: the larger count rules
    assert not lanes.poisoned_on_arrival("m", 4, taken=2)


def test_settling_and_forgetting_drop_the_tallies() -> None:
    lanes = floors()
    lanes.place("k", "m", FAILED, ordered=False)
    lanes.bounced.add("m")
    assert lanes.place("k", "m", ACKED, ordered=False) == SETTLE
    assert (lanes.failures.get("m"), lanes.bounced.get("m")) == (0, 0)
    lanes.place("k", "n", FAILED, ordered=False)
    lanes.forget("k", "n")
    assert lanes.failures.get("n") == 0


def test_floors_are_bounded_oldest_first() -> None:
    lanes = floors(capacity=2)
    for n in range(3):
        lanes.place(f"lane{n}", f"m{n}", FAILED, ordered=True)
    assert lanes.floor("lane0") is None  # forgotten: its message never came back here
    assert (lanes.floor("lane1"), lanes.floor("lane2")) == ("m1", "m2")


@given(st.lists(st.sampled_from(["failed", "lapsed", "bounced"]), max_size=12),
       st.integers(min_value=0, max_value=4))
def test_when_every_delivery_was_ours_only_its_own_failures_count_on_arrival(
    history: list[str], max_redeliveries: int,
) -> None:
    """Property: the arrival rule then sees exactly the message's own failures (no lapse, no
    bounce), whatever their order."""
    lanes = floors(max_redeliveries=max_redeliveries)
    unseen = outcome_with_unseen(0, 1, 0, unseen=1)
    for taken, delivery in enumerate(history):
        own = lanes.failures.get("m")
        assert lanes.poisoned_on_arrival("m", taken + 1, taken=taken) == (
            own > max_redeliveries)
        if delivery == "failed":
            lanes.place("k", "m", FAILED, ordered=False)
        elif delivery == "bounced":
            lanes.place("k", "m", unseen, ordered=False)
        # "lapsed": its lock ran out while it was held; nothing was placed
