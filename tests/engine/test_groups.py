"""Group lifecycle and fan-out, on both paths, through the public manager API."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sharedstream import (
    DuplicateSubscription,
    InvalidStreamKey,
    PollTerminated,
    SharedStreamManager,
    SubscriberOverflow,
)
from tests.engine.harness import (
    FEEDS,
    FastFeedTrigger,
    Feed,
    FeedTrigger,
    Runner,
    eventually,
    settle,
)
from tests.log_lines import fields_of, text_of

TRIGGERS = [FastFeedTrigger, FeedTrigger]


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_same_key_shares_one_poll_and_each_filter_sees_every_event(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    manager = SharedStreamManager()
    evens = Runner(manager, trigger_cls("f", "evens", skip=[1, 3]), 1).start()
    odds = Runner(manager, trigger_cls("f", "odds", skip=[0, 2]), 2).start()
    everything = Runner(manager, trigger_cls("f", "all"), 3).start()
    feed.push(0, 1, 2, 3)
    await eventually(lambda: len(everything.events) == 4)
    await eventually(lambda: len(evens.events) == 2 and len(odds.events) == 2)
    assert evens.raws() == [0, 2]
    assert odds.raws() == [1, 3]
    assert everything.raws() == [0, 1, 2, 3]
    assert feed.opens == 1
    assert manager.has_group(("feed", "f"))
    await manager.stop_all()


def test_none_key_is_a_value_error() -> None:
    manager = SharedStreamManager()
    with pytest.raises(ValueError, match="must not be None"):
        manager.subscribe(trigger_id=1, trigger=FeedTrigger("f", "a"), key=None)
    bad_key: object = ["list"]
    with pytest.raises(InvalidStreamKey, match="hashable"):
        manager.subscribe(trigger_id=1, trigger=FeedTrigger("f", "a"), key=bad_key)


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_subscribing_the_same_trigger_twice_is_a_runtime_error(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    manager = SharedStreamManager()
    trigger = trigger_cls("f", "a")
    manager.subscribe(trigger_id=7, trigger=trigger, key=trigger.shared_stream_key())
    with pytest.raises(RuntimeError, match="already subscribed") as info:
        manager.subscribe(trigger_id=7, trigger=trigger, key=trigger.shared_stream_key())
    assert isinstance(info.value, DuplicateSubscription)
    await manager.stop_all()


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_poll_error_reaches_every_subscriber_and_evicts_the_group(
    feed: Feed, trigger_cls: type[FastFeedTrigger], caplog: pytest.LogCaptureFixture
) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, trigger_cls("f", "a"), 1).start()
    b = Runner(manager, trigger_cls("f", "b"), 2).start()
    feed.push(0)
    await eventually(lambda: a.raws() == [0] and b.raws() == [0])
    boom = ConnectionError("broker went away")
    feed.fail(boom)
    await eventually(lambda: a.error is not None and b.error is not None)
    assert a.error is boom
    assert b.error is boom
    assert not manager.has_group(("feed", "f"))
    logged = [r.getMessage() for r in caplog.records if r.name == "sharedstream.stream"]
    assert any("failed" in message for message in logged)
    await a.stop()
    await b.stop()


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_poll_that_returns_is_poll_terminated(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, trigger_cls("f", "a"), 1).start()
    feed.end()
    await eventually(lambda: a.error is not None)
    assert isinstance(a.error, PollTerminated)
    assert not manager.has_group(("feed", "f"))


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_subscriber_arriving_after_termination_gets_a_fresh_group(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    manager = SharedStreamManager()
    old = Runner(manager, trigger_cls("f", "old"), 1).start()
    feed.fail(ConnectionError("gone"))
    await eventually(lambda: old.error is not None)
    new = Runner(manager, trigger_cls("f", "new"), 2).start()
    feed.push(5)
    await eventually(lambda: new.raws() == [5])
    assert feed.opens == 2
    assert old.raws() == []
    await manager.stop_all()


async def test_subscriber_arriving_while_last_one_leaves_gets_a_fresh_group(feed: Feed) -> None:
    manager = SharedStreamManager()
    leaving = Runner(manager, FeedTrigger("f", "leaving"), 1).start()
    await settle()
    assert leaving.task is not None
    leaving.task.cancel()
    stopping = asyncio.create_task(manager.unsubscribe(1, ("feed", "f")))
    await asyncio.sleep(0)
    assert not manager.has_group(("feed", "f"))  # evicted at once...
    assert not stopping.done()  # ...while the old poll is still being stopped
    arriving = Runner(manager, FeedTrigger("f", "arriving"), 2).start()
    await stopping
    feed.push(1)
    await eventually(lambda: arriving.raws() == [1])
    assert feed.factory_calls == 2
    await manager.stop_all()


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_last_unsubscribe_stops_the_group_and_closes_the_source(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, trigger_cls("f", "a"), 1).start()
    b = Runner(manager, trigger_cls("f", "b"), 2).start()
    await settle()
    await a.stop()
    assert manager.has_group(("feed", "f"))
    await b.stop()
    assert not manager.has_group(("feed", "f"))
    assert feed.closes == 1


async def test_stop_all_stops_every_group(feed: Feed) -> None:
    FEEDS["g"] = other = Feed()
    manager = SharedStreamManager()
    Runner(manager, FeedTrigger("f", "a"), 1).start()
    Runner(manager, FastFeedTrigger("g", "b"), 2).start()
    await settle()
    await manager.stop_all()
    assert not manager.has_group(("feed", "f"))
    assert not manager.has_group(("feed", "g"))
    assert feed.closes == 1
    assert other.closes == 1


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_slow_subscriber_overflows_alone_and_still_gets_its_error(
    feed: Feed, trigger_cls: type[FastFeedTrigger], caplog: pytest.LogCaptureFixture
) -> None:
    manager = SharedStreamManager(max_subscriber_queue=4)
    healthy = Runner(manager, trigger_cls("f", "healthy"), 1).start()
    stuck = Runner(manager, trigger_cls("f", "stuck"), 2)
    stuck.gate = asyncio.Event()  # pauses after its first event, never resumes
    stuck.start()
    feed.push(0)
    await eventually(lambda: len(stuck.events) == 1)
    feed.push(*range(1, 10))
    await eventually(lambda: healthy.raws() == list(range(10)))
    assert stuck.failure() is None  # its queue is full, yet the error is waiting for it
    stuck.gate.set()
    await eventually(lambda: stuck.error is not None)
    assert isinstance(stuck.error, SubscriberOverflow)
    assert stuck.raws() == [0]  # nothing stale delivered after the failure
    assert healthy.error is None
    [overflow] = [r for r in caplog.records if r.levelno == logging.WARNING
                  and text_of(r).startswith("trigger fell behind the shared stream")]
    assert fields_of(overflow)["trigger"] == stuck.trigger_id
    feed.push(10)
    await eventually(lambda: healthy.raws()[-1] == 10)
    await manager.stop_all()


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_cohort_grace_period_puts_late_joiners_in_the_first_snapshot(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    manager = SharedStreamManager(cohort_grace_period=0.2)
    feed.push(0, 1)  # already waiting upstream, as after a restart
    first = Runner(manager, trigger_cls("f", "first"), 1).start()
    await asyncio.sleep(0.05)
    second = Runner(manager, trigger_cls("f", "second"), 2).start()
    await eventually(lambda: len(first.events) == 2 and len(second.events) == 2)
    assert second.raws() == [0, 1]
    await manager.stop_all()


async def test_without_grace_a_late_joiner_misses_what_was_already_fanned_out(feed: Feed) -> None:
    manager = SharedStreamManager()
    feed.push(0, 1)
    first = Runner(manager, FeedTrigger("f", "first"), 1).start()
    await eventually(lambda: len(first.events) == 2)
    second = Runner(manager, FeedTrigger("f", "second"), 2).start()
    feed.push(2)
    await eventually(lambda: second.raws() == [2])
    await manager.stop_all()


def test_invalid_manager_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_subscriber_queue"):
        SharedStreamManager(max_subscriber_queue=0)
    with pytest.raises(ValueError, match="ack_timeout"):
        SharedStreamManager(ack_timeout=0)
    with pytest.raises(ValueError, match="cohort_grace_period"):
        SharedStreamManager(cohort_grace_period=-1)


def test_subscribe_outside_a_running_loop_leaves_no_dead_group() -> None:
    manager = SharedStreamManager()
    trigger = FeedTrigger("f", "a")
    with pytest.raises(RuntimeError, match="no running event loop"):
        manager.subscribe(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
    assert not manager.has_group(trigger.shared_stream_key())


@pytest.mark.parametrize("trigger_cls", TRIGGERS)
async def test_stop_all_leaves_attached_subscribers_for_their_owner_to_cancel(
    feed: Feed, trigger_cls: type[FastFeedTrigger]
) -> None:
    """Airflow's shutdown: nothing is raised into the filter; its owner cancels it."""
    manager = SharedStreamManager()
    attached = Runner(manager, trigger_cls("f", "a"), 1).start()
    feed.push(0)
    await eventually(lambda: attached.raws() == [0])
    await manager.stop_all()
    await settle()
    assert attached.task is not None
    assert not attached.task.done()
    assert attached.failure() is None  # no StreamStopped for an `except Exception` to catch
    await attached.stop()
    assert attached.task.cancelled()
    assert attached.failure() is None
