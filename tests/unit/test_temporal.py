"""DateTimeTrigger and TimeDeltaTrigger: validation, serialization, and firing on time."""

from __future__ import annotations

import asyncio
import importlib
import time
import zoneinfo
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from sharedstream import BaseEventTrigger, BaseTrigger, TriggerEvent
from sharedstream.runtime.serde import pack_kwargs, unpack_kwargs
from sharedstream.triggers import temporal

DateTimeTrigger = temporal.DateTimeTrigger
TimeDeltaTrigger = temporal.TimeDeltaTrigger


def rehydrate(trigger: BaseTrigger) -> temporal.DateTimeTrigger:
    """What the runtime does: store (classpath, packed kwargs), then ``cls(**kwargs)``."""
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    rebuilt = cls(**unpack_kwargs(pack_kwargs(kwargs)))
    assert isinstance(rebuilt, DateTimeTrigger)
    return rebuilt


async def collect(trigger: BaseTrigger, limit: float = 5.0) -> list[TriggerEvent]:
    async with asyncio.timeout(limit):
        return [event async for event in trigger.run()]


def test_they_are_standalone_triggers() -> None:
    # Event triggers (usable as asset watchers) that run standalone: no shared key.
    assert issubclass(DateTimeTrigger, BaseEventTrigger)
    assert issubclass(TimeDeltaTrigger, BaseEventTrigger)
    assert DateTimeTrigger(datetime.now(UTC)).shared_stream_key() is None


def test_naive_moment_is_rejected_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="`moment` must be timezone-aware"):
        DateTimeTrigger(datetime(2030, 1, 1))


def test_non_datetime_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="`moment` must be a datetime"):
        DateTimeTrigger("2030-01-01T00:00:00Z")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`delta` must be a timedelta"):
        TimeDeltaTrigger(5)  # type: ignore[arg-type]


def test_out_of_range_delta_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="`delta`"):
        TimeDeltaTrigger(timedelta.max)


@pytest.mark.parametrize(
    "tz",
    [UTC, timezone(timedelta(hours=-7)), zoneinfo.ZoneInfo("Europe/Paris")],
    ids=repr,
)
def test_serialize_and_rehydrate_round_trip(tz: Any) -> None:
    moment = datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=tz)
    trigger = DateTimeTrigger(moment)
    assert trigger.serialize() == (
        "sharedstream.triggers.temporal.DateTimeTrigger",
        {"moment": moment},
    )
    rebuilt = rehydrate(trigger)
    assert type(rebuilt) is DateTimeTrigger
    assert rebuilt.moment == moment
    assert rebuilt.moment.tzinfo == moment.tzinfo
    assert rebuilt.serialize() == trigger.serialize()


def test_time_delta_trigger_serializes_as_a_date_time_trigger() -> None:
    before = datetime.now(UTC)
    trigger = TimeDeltaTrigger(timedelta(hours=1))
    after = datetime.now(UTC)
    classpath, kwargs = trigger.serialize()
    assert classpath == "sharedstream.triggers.temporal.DateTimeTrigger"
    assert list(kwargs) == ["moment"]
    assert before + timedelta(hours=1) <= kwargs["moment"] <= after + timedelta(hours=1)
    assert kwargs["moment"] == trigger.moment
    assert trigger.delta == timedelta(hours=1)
    # Rebuilding keeps the deadline instead of restarting the countdown.
    rebuilt = rehydrate(trigger)
    assert type(rebuilt) is DateTimeTrigger
    assert rebuilt.moment == trigger.moment
    assert trigger.serialize() == (classpath, kwargs)


async def test_a_moment_in_the_past_fires_at_once() -> None:
    moment = datetime(2001, 1, 1, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo"))
    started = time.monotonic()
    events = await collect(DateTimeTrigger(moment), limit=1.0)
    assert events == [TriggerEvent(moment)]
    assert events[0].payload.tzinfo is moment.tzinfo
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("delta", [timedelta(0), timedelta(seconds=-30)])
async def test_zero_or_negative_delta_fires_at_once(delta: timedelta) -> None:
    trigger = TimeDeltaTrigger(delta)
    started = time.monotonic()
    events = await collect(trigger, limit=1.0)
    assert events == [TriggerEvent(trigger.moment)]
    assert time.monotonic() - started < 0.5


async def test_a_moment_shortly_ahead_fires_after_roughly_that_long() -> None:
    moment = datetime.now(UTC) + timedelta(seconds=0.2)
    started = time.monotonic()
    events = await collect(DateTimeTrigger(moment))
    elapsed = time.monotonic() - started
    assert events == [TriggerEvent(moment)]
    assert datetime.now(UTC) >= moment
    assert 0.15 <= elapsed < 2.0


async def test_time_delta_trigger_fires_after_its_delta() -> None:
    started = time.monotonic()
    trigger = TimeDeltaTrigger(timedelta(seconds=0.1))
    events = await collect(trigger)
    assert events == [TriggerEvent(trigger.moment)]
    assert 0.05 <= time.monotonic() - started < 2.0


async def test_sleeps_in_chunks_so_a_clock_jump_is_noticed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(DateTimeTrigger, "max_sleep_seconds", 0.02)
    jump = timedelta(0)
    monkeypatch.setattr(temporal, "_utcnow", lambda: datetime.now(UTC) + jump)
    moment = datetime.now(UTC) + timedelta(hours=1)
    task = asyncio.create_task(collect(DateTimeTrigger(moment)))
    await asyncio.sleep(0.05)
    assert not task.done()  # still an hour to go
    started = time.monotonic()
    jump = timedelta(hours=1, seconds=1)  # the wall clock steps forward
    events = await task
    assert events == [TriggerEvent(moment)]
    assert time.monotonic() - started < 1.0


async def test_cancellation_while_waiting_propagates() -> None:
    trigger = DateTimeTrigger(datetime.now(UTC) + timedelta(hours=1))
    task = asyncio.create_task(collect(trigger))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_repr_shows_the_moment() -> None:
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    assert repr(DateTimeTrigger(moment)) == (
        f"<sharedstream.triggers.temporal.DateTimeTrigger moment={moment!r}>"
    )
