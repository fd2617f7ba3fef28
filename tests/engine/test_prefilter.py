"""Prefilters (``shared_stream_prefilter``) through the manager, in both modes.

A raw event a trigger's prefilter declines never reaches its filter and
counts as acked for it at once; everything else behaves as without one.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sharedstream import AdvanceOutcome, SharedStreamManager
from sharedstream.engine.fanout import PASS_ALL, KeyedPrefilter
from tests.engine.harness import (
    FastFeedTrigger,
    Feed,
    FeedTrigger,
    Runner,
    eventually,
    settle,
)
from tests.log_lines import fields_of, text_of


class OddOnly(FeedTrigger):
    """Emits for odd raw events only, says so in its prefilter, and records what it is handed."""

    def __init__(self, feed: str, name: str) -> None:
        super().__init__(feed, name, skip=range(0, 100, 2))
        self.seen: list[Any] = []

    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        return lambda raw: raw % 2 == 1

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async def spy() -> AsyncIterator[Any]:
            async for raw in shared_stream:
                self.seen.append(raw)
                yield raw

        async for event in super().filter_shared_stream(spy()):
            yield event


class FastOddOnly(FastFeedTrigger):
    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        return lambda raw: raw % 2 == 1


class BrokenPrefilter(FeedTrigger):
    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        def accept(raw: Any) -> bool:
            if raw == 3:
                raise RuntimeError("prefilter bug")
            return False

        return accept


class RaisingFactory(FeedTrigger):
    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        raise RuntimeError("cannot build a prefilter")


class NotCallable(FeedTrigger):
    def shared_stream_prefilter(self) -> Any:
        return "yes please"


async def test_declined_events_skip_the_filter_and_count_as_acked(feed: Feed) -> None:
    manager = SharedStreamManager()
    odd = OddOnly("f", "odd")
    odd_runner = Runner(manager, odd, 1).start()
    every = Runner(manager, FeedTrigger("f", "all"), 2).start()
    feed.push(0, 1, 2, 3)
    await eventually(lambda: len(feed.advanced()) == 4)
    assert odd.seen == [1, 3]  # the even ones never reached its filter
    assert odd_runner.raws() == [1, 3]
    assert every.raws() == [0, 1, 2, 3]
    clean = AdvanceOutcome(acked=2, failed=0, rejected=0)
    assert feed.advanced() == [(0, clean), (1, clean), (2, clean), (3, clean)]
    await manager.stop_all()


async def test_an_event_every_prefilter_declines_is_advanced_clean(feed: Feed) -> None:
    manager = SharedStreamManager()
    odd = OddOnly("f", "odd")
    Runner(manager, odd, 1).start()
    feed.push(0, 2)
    await eventually(lambda: len(feed.advanced()) == 2)
    # Not "broadcast to nobody" (0, 0, 0), which a producer holds for redelivery.
    assert feed.advanced() == [(0, AdvanceOutcome(1, 0, 0)), (2, AdvanceOutcome(1, 0, 0))]
    assert all(item.outcome.is_clean for batch in feed.batches for item in batch)
    assert odd.seen == []
    await manager.stop_all()


async def test_a_declined_event_does_not_wait_on_an_earlier_open_window(feed: Feed) -> None:
    """Lane order still holds: the declined event waits for the one before it."""
    manager = SharedStreamManager()
    odd = OddOnly("f", "odd")
    runner = Runner(manager, odd, 1, auto_confirm=False).start()
    feed.push(1, 2)
    await eventually(lambda: len(runner.events) == 1)
    await settle()
    assert feed.advanced() == []  # 1's event is not stored yet; 2 is behind it in the lane
    runner.confirm_all()
    await eventually(lambda: len(feed.advanced()) == 2)
    assert [payload for payload, _ in feed.advanced()] == [1, 2]
    await manager.stop_all()


async def test_fast_path_subscribers_get_only_what_they_accept(feed: Feed) -> None:
    manager = SharedStreamManager()
    odd = Runner(manager, FastOddOnly("f", "odd"), 1).start()
    every = Runner(manager, FastFeedTrigger("f", "all"), 2).start()
    feed.push(0, 1, 2, 3, 4, 5)
    await eventually(lambda: len(every.events) == 6)
    await settle()
    assert odd.raws() == [1, 3, 5]
    await manager.stop_all()


async def test_a_prefilter_that_raises_is_switched_off(
    feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    manager = SharedStreamManager()
    runner = Runner(manager, BrokenPrefilter("f", "b"), 1).start()
    with caplog.at_level(logging.WARNING, logger="sharedstream.fanout"):
        feed.push(2, 3, 4, 5)
        await eventually(lambda: len(feed.advanced()) == 4)
    # 2 declined; the test raised on 3 and is switched off: the filter gets 3 and later.
    assert runner.raws() == [3, 4, 5]
    [line] = caplog.records
    assert text_of(line).startswith("shared-stream prefilter raised; switched off")
    assert fields_of(line) == {"triggers": [1]}
    assert line.exc_info is not None
    await manager.stop_all()


@pytest.mark.parametrize("trigger_class", [RaisingFactory, NotCallable])
async def test_a_broken_prefilter_factory_means_no_prefilter(
    feed: Feed, caplog: pytest.LogCaptureFixture, trigger_class: type[FeedTrigger]
) -> None:
    manager = SharedStreamManager()
    with caplog.at_level(logging.WARNING, logger="sharedstream.stream"):
        runner = Runner(manager, trigger_class("f", "b"), 1).start()
    [line] = caplog.records
    assert text_of(line).startswith("shared_stream_prefilter() ")
    assert fields_of(line)["trigger_class"] == trigger_class.__qualname__
    feed.push(0, 1)
    await eventually(lambda: len(runner.events) == 2)
    await manager.stop_all()


# -- keyed prefilters: one selection per raw event for a whole shape ------------------------


class Selections:
    """A ``select`` for raw ints that counts its calls; ``PASS_ALL`` for negatives."""

    def __init__(self, *, broken_on: int | None = None) -> None:
        self.calls: list[Any] = []
        self.broken_on = broken_on

    def __call__(self, raw: int) -> Any:
        self.calls.append(raw)
        if raw == self.broken_on:
            raise RuntimeError("select bug")
        return PASS_ALL if raw < 0 else raw % 10


class Bucket(FeedTrigger):
    """Emits for the raw events ``n`` with ``n % 10 == bucket`` (or negative), keyed on that."""

    def __init__(self, feed: str, name: str, bucket: Any, select: Selections,
                 mine: Callable[[int], bool] | None = None) -> None:
        super().__init__(feed, name)
        self.bucket, self.select = bucket, select
        self.mine = mine or (lambda raw: raw < 0 or raw % 10 == bucket)

    def shared_stream_prefilter(self) -> Callable[[Any], bool] | None:
        return KeyedPrefilter("mod10", self.select, self.bucket)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async def only_mine() -> AsyncIterator[Any]:
            async for raw in shared_stream:
                if self.mine(raw):
                    yield raw

        async for event in super().filter_shared_stream(only_mine()):
            yield event


async def test_keyed_prefilters_of_one_shape_select_once_per_raw_event(feed: Feed) -> None:
    manager = SharedStreamManager()
    select = Selections()
    runners = [Runner(manager, Bucket("f", f"b{j}", j, select), j).start() for j in range(10)]
    every = Runner(manager, FeedTrigger("f", "all"), 99).start()
    raws = [*range(25), -1]
    feed.push(*raws)
    await eventually(lambda: len(feed.advanced()) == len(raws))
    assert select.calls == raws  # one selection per raw event for the ten of them
    for j, runner in enumerate(runners):
        assert runner.raws() == [n for n in range(25) if n % 10 == j] + [-1]
    assert every.raws() == raws
    # Each raw event: 9 buckets declined (acked at once), one bucket and "all" emitted.
    assert feed.advanced()[0] == (0, AdvanceOutcome(acked=11, failed=0, rejected=0))
    assert feed.advanced()[-1] == (-1, AdvanceOutcome(acked=11, failed=0, rejected=0))
    await manager.stop_all()


async def test_keyed_prefilters_with_unhashable_values_still_match(feed: Feed) -> None:
    """An unhashable ``wanted`` or selection falls back to comparing, with the same answers."""
    manager = SharedStreamManager()

    class ListSelect(Selections):
        def __call__(self, raw: int) -> Any:
            got = super().__call__(raw)
            return got if got is PASS_ALL or got != 3 else [3]  # unhashable for 3

    select = ListSelect()
    three = Runner(manager, Bucket("f", "three", [3], select, lambda raw: raw % 10 == 3),
                   1).start()
    four = Runner(manager, Bucket("f", "four", 4, select), 2).start()
    feed.push(3, 4, 13, 5)
    await eventually(lambda: len(feed.advanced()) == 4)
    assert four.raws() == [4]
    # Bucket [3] (a list) gets what its own test accepts: the selections equal to [3].
    assert three.raws() == [3, 13]
    await manager.stop_all()


@pytest.mark.parametrize("beside_others", [False, True])  # the one-shape fast path, or not
async def test_a_raising_keyed_select_switches_off_its_whole_shape(
    feed: Feed, caplog: pytest.LogCaptureFixture, beside_others: bool
) -> None:
    manager = SharedStreamManager()
    select = Selections(broken_on=3)
    one = Runner(manager, Bucket("f", "one", 1, select), 1).start()
    two = Runner(manager, Bucket("f", "two", 2, select), 2).start()
    if beside_others:
        Runner(manager, FeedTrigger("f", "all"), 3).start()
    with caplog.at_level(logging.WARNING, logger="sharedstream.fanout"):
        feed.push(1, 2, 3, 4)
        await eventually(lambda: len(feed.advanced()) == 4)
    assert select.calls == [1, 2, 3]  # never asked again
    # Both filters get 3 and everything later (their own filters still drop 4).
    assert (one.raws(), two.raws()) == ([1], [2])
    [line] = caplog.records
    assert fields_of(line) == {"triggers": [1, 2]}
    assert "select bug" in caplog.text  # the traceback
    await manager.stop_all()


async def test_a_keyed_subscriber_that_leaves_stops_receiving(feed: Feed) -> None:
    manager = SharedStreamManager()
    select = Selections()
    one = Runner(manager, Bucket("f", "one", 1, select), 1).start()
    other_one = Runner(manager, Bucket("f", "one-again", 1, select), 2).start()
    feed.push(1, 11)
    await eventually(lambda: len(feed.advanced()) == 2)
    await one.stop()
    feed.push(21, 2)
    await eventually(lambda: len(feed.advanced()) == 4)
    assert one.raws() == [1, 11]
    assert other_one.raws() == [1, 11, 21]
    # 21: the one left subscriber emitted; 2: declined by it.
    assert feed.advanced()[2:] == [(21, AdvanceOutcome(1, 0, 0)), (2, AdvanceOutcome(1, 0, 0))]
    await other_one.stop()
    await manager.stop_all()


async def test_selective_deliveries_keep_the_parked_set_to_the_waiting_subscribers(
    feed: Feed,
) -> None:
    """A keyed delivery wakes its receiver and takes it off the parked set, nothing else.

    With many selective watchers each raw event wakes one of them; the set of
    parked subscribers must neither keep woken ones (it would grow without
    bound) nor be swept whole on every raw event (cost per event growing with K).
    """
    manager = SharedStreamManager()
    select = Selections()
    runners = [Runner(manager, Bucket("f", f"b{j}", j, select), j).start() for j in range(10)]
    for round_end in range(30, 301, 30):
        feed.push(*range(round_end - 30, round_end))
        await eventually(lambda: len(feed.advanced()) == round_end)  # noqa: B023 - awaited here
        await settle()
        [group] = manager._groups.values()  # the state under test
        parked = group.fanout.parked
        assert len(parked) == 10  # every one of them is waiting again, each listed once
        assert all(sub.waiter is not None for sub in parked)
    for j, runner in enumerate(runners):
        assert runner.raws() == [n for n in range(300) if n % 10 == j]
    await manager.stop_all()
