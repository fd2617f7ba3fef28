"""``StreamEnds``: when streaming pulls that keep ending are said, and not ready."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sharedstream.producers._pubsub_stream_ends import LOUD_FROM, StreamEnds

TOO_BIG = "ResourceExhausted: Received message larger than max ({} vs. 4194304)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ends(healthy_after: float = 120.0) -> tuple[StreamEnds, Clock]:
    clock = Clock()
    return StreamEnds(healthy_after, clock=clock), clock


def end_after(streak: StreamEnds, clock: Clock, error: str, lived: float) -> bool:
    """A stream opens, lives ``lived`` seconds and ends with ``error``; whether it was loud."""
    streak.opened()
    clock.now += lived
    return streak.ended(error)


def test_the_third_end_in_a_row_is_loud_though_each_message_had_its_own_size() -> None:
    """Invariant 1: numbers in the text (a message's size) do not make another failure."""
    streak, clock = ends()
    loud = [end_after(streak, clock, TOO_BIG.format(9437248 + n), lived=10) for n in range(3)]
    assert loud == [False, False, True]
    assert streak.in_a_row == 3
    assert streak.error == TOO_BIG.format(9437250)  # said as it was, numbers kept


def test_another_error_or_a_long_lived_stream_starts_a_new_streak() -> None:
    """Invariant 2: the streak is of quick ends with one error."""
    streak, clock = ends(healthy_after=120)
    for _ in range(2):
        end_after(streak, clock, TOO_BIG.format(1), lived=5)
    end_after(streak, clock, "ServiceUnavailable: connection reset", lived=5)
    assert streak.in_a_row == 1
    for _ in range(2):
        end_after(streak, clock, "ServiceUnavailable: connection reset", lived=5)
    assert streak.in_a_row == 3
    # Pub/Sub ends a healthy stream now and then, with the same error: counted afresh.
    assert not end_after(streak, clock, "ServiceUnavailable: connection reset", lived=600)
    assert streak.in_a_row == 1


@given(st.integers(min_value=1, max_value=5000))
def test_n_ends_in_a_row_make_at_most_log2_lines(n: int) -> None:
    """Invariant 3: the 3rd, 6th, 12th... end is loud; never one line per end."""
    streak, clock = ends()
    loud = [i + 1 for i in range(n) if end_after(streak, clock, TOO_BIG.format(i), lived=1)]
    assert loud == [LOUD_FROM * 2 ** k for k in range(len(loud))]
    assert len(loud) == (0 if n < LOUD_FROM else math.floor(math.log2(n / LOUD_FROM)) + 1)


def test_failing_from_the_third_end_until_a_stream_stays_up() -> None:
    """Invariant 4: not ready while the streams keep ending; ready once one stayed up."""
    streak, clock = ends(healthy_after=120)
    assert not streak.failing()
    for _ in range(2):
        end_after(streak, clock, TOO_BIG.format(5), lived=10)
    assert not streak.failing()  # twice may be chance
    end_after(streak, clock, TOO_BIG.format(5), lived=10)
    assert streak.failing()  # between two streams
    streak.opened()
    clock.now += 119
    assert streak.failing()  # open, but not yet past the time the failure takes to return
    clock.now += 1
    assert not streak.failing()  # up for healthy_after: it got past it
    assert streak.ended(TOO_BIG.format(5)) is False  # and its end starts a new streak
    assert streak.in_a_row == 1
    assert not streak.failing()


def test_an_end_without_an_open_stream_counts_as_quick() -> None:
    streak, _clock = ends()
    for _ in range(LOUD_FROM):
        streak.ended("Unknown: boom")
    assert streak.in_a_row == LOUD_FROM
    assert streak.failing()
