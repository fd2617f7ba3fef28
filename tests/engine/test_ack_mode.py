"""Ack mode end to end through the manager: what the producer is told, and when."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

import pytest

from sharedstream import (
    AckTimeout,
    AdvanceItem,
    AdvanceOutcome,
    ProducerContractError,
    SharedStreamManager,
    SharedStreamProducer,
    SubscriberOverflow,
    reject_shared_stream_event,
)
from sharedstream.engine.names import stream_name
from tests.engine.conftest import FakeClock
from tests.engine.harness import (
    FastFeedTrigger,
    Feed,
    FeedProducer,
    FeedTrigger,
    Runner,
    eventually,
    settle,
)
from tests.log_lines import fields_of, text_of

KEY = ("feed", "f")
CLEAN = AdvanceOutcome(acked=2, failed=0, rejected=0)


async def test_advance_waits_for_every_subscriber_and_every_persist_confirmation(
    feed: Feed,
) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, FeedTrigger("f", "a"), 1, auto_confirm=False).start()
    Runner(manager, FeedTrigger("f", "b", skip=[0, 1]), 2).start()
    feed.push(0, 1, 2)
    await eventually(lambda: len(a.events) == 3)
    await settle()
    assert feed.advanced() == []  # a moved past 0 and 1, but nothing of a's is stored yet
    a.manager.confirm_persisted(a.unconfirmed[:2])
    await eventually(lambda: len(feed.advanced()) == 2)
    assert feed.advanced() == [(0, CLEAN), (1, CLEAN)]  # 2: a is still on it
    a.confirm_all()  # a already pulled past 2 (it waits for 3), so 2 resolves too
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced()[-1] == (2, CLEAN)
    assert all(item.outcome.is_clean for batch in feed.batches for item in batch)
    await manager.stop_all()


async def test_bind_pending_event_is_none_on_the_fast_path(feed: Feed) -> None:
    manager = SharedStreamManager()
    runner = Runner(manager, FastFeedTrigger("f", "a"), 1, auto_confirm=False).start()
    feed.push(0)
    await eventually(lambda: len(runner.events) == 1)
    assert runner.unconfirmed == []
    assert manager.bind_pending_event(trigger_id=1, key=("nope",)) is None
    manager.confirm_persisted([12345])  # unknown seqs are ignored
    await manager.stop_all()


async def test_reject_is_counted_apart_from_acks(feed: Feed) -> None:
    manager = SharedStreamManager()
    Runner(manager, FeedTrigger("f", "picky", rejects=[1]), 1).start()
    Runner(manager, FeedTrigger("f", "easy"), 2).start()
    feed.push(0, 1, 2)
    await settle()
    feed.push(3)  # moves both past 2
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced() == [(0, CLEAN), (1, AdvanceOutcome(1, 0, 1)), (2, CLEAN)]
    await manager.stop_all()


async def test_reject_outside_an_ack_window_warns_once_and_does_nothing(
    feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sharedstream")
    reject_shared_stream_event()  # no stream at all
    manager = SharedStreamManager()
    fast = Runner(manager, FastFeedTrigger("f", "fast", rejects=[0]), 1).start()
    feed.push(0)
    await settle()
    warnings = [r for r in caplog.records if "outside an ack-mode binding window" in r.message]
    assert len(warnings) == 2
    assert all(r.name == "sharedstream.stream" for r in warnings)
    assert fast.error is None
    await manager.stop_all()


async def test_unsubscribing_before_pulling_an_event_fails_it(feed: Feed) -> None:
    manager = SharedStreamManager()
    stuck = Runner(manager, FeedTrigger("f", "stuck"), 1)
    stuck.gate = asyncio.Event()
    stuck.start()
    Runner(manager, FeedTrigger("f", "ok"), 2).start()
    feed.push(0, 1, 2)
    await eventually(lambda: len(stuck.events) == 1)
    await settle()
    await stuck.stop()  # on 0 (acked: its event was stored), never pulled 1 and 2
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced() == [
        (0, CLEAN),
        (1, AdvanceOutcome(1, 1, 0)),
        (2, AdvanceOutcome(1, 1, 0)),
    ]
    await manager.stop_all()


async def test_ack_timeout_fails_only_the_slow_subscriber(
    feed: Feed, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    manager = SharedStreamManager(ack_timeout=0.5, clock=clock)
    slow = Runner(manager, FeedTrigger("f", "slow"), 1)
    slow.gate = asyncio.Event()
    slow.start()
    quick = Runner(manager, FeedTrigger("f", "quick"), 2).start()
    feed.push(0)
    await eventually(lambda: len(slow.events) == 1 and len(quick.events) == 1)
    clock.advance(0.499)
    await asyncio.sleep(0.12)  # more than one watchdog cadence (50 ms)
    assert feed.advanced() == []
    clock.advance(0.001)  # exactly at the deadline: inclusive
    await eventually(lambda: feed.advanced() == [(0, AdvanceOutcome(1, 1, 0))])
    slow.gate.set()
    await eventually(lambda: slow.error is not None)
    assert isinstance(slow.error, AckTimeout)
    assert "ack timeout" in caplog.text
    feed.push(1, 2)  # the failed subscriber is out of later snapshots
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced()[1:] == [(1, AdvanceOutcome(1, 0, 0)), (2, AdvanceOutcome(1, 0, 0))]
    assert quick.error is None
    await manager.stop_all()


async def test_unconfirmed_persistence_times_out_and_is_not_advanced_as_clean(
    feed: Feed, clock: FakeClock
) -> None:
    manager = SharedStreamManager(ack_timeout=0.5, clock=clock)
    writer = Runner(manager, FeedTrigger("f", "w"), 1, auto_confirm=False).start()
    feed.push(0, 1)
    await eventually(lambda: len(writer.events) == 2)
    clock.advance(0.5)
    await eventually(lambda: writer.error is not None)
    assert isinstance(writer.error, AckTimeout)
    assert feed.advanced() == [(0, AdvanceOutcome(0, 1, 0)), (1, AdvanceOutcome(0, 1, 0))]
    writer.confirm_all()  # a late confirmation changes nothing
    feed.push(2)  # nobody is subscribed for it now: advanced, but not clean
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced()[2] == (2, AdvanceOutcome(0, 0, 0))
    assert not feed.advanced()[2][1].is_clean
    await manager.stop_all()


async def test_advance_that_raises_terminates_the_group(feed: Feed) -> None:
    boom = RuntimeError("commit refused")

    async def refuse(batch: Sequence[AdvanceItem]) -> None:
        if batch[0].broker_payload == 1:
            raise boom

    feed.advance_hook = refuse
    manager = SharedStreamManager()
    a = Runner(manager, FeedTrigger("f", "a"), 1).start()
    b = Runner(manager, FeedTrigger("f", "b"), 2).start()
    feed.push(0)
    await settle()
    feed.push(1)
    await eventually(lambda: a.error is not None and b.error is not None)
    assert a.error is boom
    assert b.error is boom
    assert not manager.has_group(KEY)
    feed.push(2, 3)
    await settle()
    assert [payload for payload, _ in feed.advanced()] == [0]
    assert feed.closes == 1
    await a.stop()
    await b.stop()


async def test_stop_advances_resolved_events_then_closes_once(
    feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()

    async def slow_commit(batch: Sequence[AdvanceItem]) -> None:
        await release.wait()

    feed.advance_hook = slow_commit
    feed.close_error = OSError("socket already closed")
    manager = SharedStreamManager()
    a = Runner(manager, FeedTrigger("f", "a"), 1).start()
    feed.push(0, 1, 2)
    await eventually(lambda: len(a.events) == 3)
    await eventually(lambda: feed.in_flight == 1)  # 0 and 1 are being committed...
    stopping = asyncio.create_task(a.stop())  # ...2 resolves as a leaves
    await settle()
    assert not stopping.done()
    release.set()
    await stopping
    assert [p for p, _ in feed.advanced()] == [0, 1, 2]
    assert feed.events[-1] == "aclose"
    assert feed.closes == 1
    [failed] = [r for r in caplog.records if text_of(r).startswith("producer.aclose() of")]
    assert fields_of(failed)["stream"] == stream_name(KEY)  # best-effort: logged, not raised
    assert "OSError: socket already closed" in caplog.text  # with its traceback


async def test_factory_once_per_group_and_connection_opened_lazily(feed: Feed) -> None:
    manager = SharedStreamManager(cohort_grace_period=0.05)
    for i in range(3):
        Runner(manager, FeedTrigger("f", f"t{i}"), i).start()
    assert feed.factory_calls == 0  # nothing is built during the grace period
    await eventually(lambda: feed.opens == 1)
    assert feed.factory_calls == 1
    await manager.stop_all()
    assert feed.closes == 1


async def test_lanes_do_not_wait_for_each_other_and_one_advance_is_in_flight(
    feed: Feed,
) -> None:
    feed.lane_of = lambda payload: payload["lane"]

    async def slow(batch: Sequence[AdvanceItem]) -> None:
        await asyncio.sleep(0.005)

    feed.advance_hook = slow
    manager = SharedStreamManager()
    gated = Runner(manager, FeedTrigger("f", "gated"), 1, auto_confirm=False).start()
    raws = [{"lane": lane, "n": n} for n in range(6) for lane in ("x", "y")]
    feed.push(*raws)
    await eventually(lambda: len(gated.events) == 12)
    first_x = gated.unconfirmed[0]
    manager.confirm_persisted(gated.unconfirmed[1:])  # all but the first x
    feed.push({"lane": "z", "n": 0})
    await eventually(lambda: len(feed.advanced()) == 6)
    assert [p["lane"] for p, _ in feed.advanced()] == ["y"] * 6  # x waits on its head
    manager.confirm_persisted([first_x])
    await eventually(lambda: len(feed.advanced()) == 12)
    xs = [p["n"] for p, _ in feed.advanced() if p["lane"] == "x"]
    assert xs == list(range(6))
    assert feed.max_in_flight == 1
    assert all(len({item.broker_payload["lane"] for item in b}) == 1 for b in feed.batches)
    await manager.stop_all()


async def test_a_producer_that_advances_lanes_together_gets_every_ready_lane_at_once(
    feed: Feed, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(FeedProducer, "advances_lanes_together", True)
    feed.lane_of = lambda payload: payload["lane"]
    manager = SharedStreamManager()
    gated = Runner(manager, FeedTrigger("f", "gated"), 1, auto_confirm=False).start()
    feed.push(*[{"lane": lane, "n": n} for n in range(3) for lane in ("x", "y", "z")])
    await eventually(lambda: len(gated.events) == 9)
    held = gated.unconfirmed[:1]  # x0's event: lane x is not ready until it is confirmed
    manager.confirm_persisted(gated.unconfirmed[1:])
    await eventually(lambda: len(feed.advanced()) == 6)
    assert len(feed.batches) == 1, "y and z in one call"
    [batch] = feed.batches
    lanes = [item.broker_payload["lane"] for item in batch]
    assert sorted(lanes) == ["y"] * 3 + ["z"] * 3
    for lane in ("y", "z"):  # each lane contiguous and in order
        mine = [i for i, name in enumerate(lanes) if name == lane]
        assert mine == list(range(mine[0], mine[0] + 3))
        assert [batch[i].broker_payload["n"] for i in mine] == [0, 1, 2]
    manager.confirm_persisted(held)
    await eventually(lambda: len(feed.advanced()) == 9)
    assert [p["n"] for p, _ in feed.advanced() if p["lane"] == "x"] == [0, 1, 2]
    await manager.stop_all()


class _LaneTrouble(FeedTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        assert isinstance(producer, FeedProducer)
        producer.feed.lane_of = cls.lane
        return producer

    @staticmethod
    def lane(payload: Any) -> Hashable:
        raise LookupError("no partition in payload")


class _UnhashableLane(_LaneTrouble):
    @staticmethod
    def lane(payload: Any) -> Hashable:
        return ["not", "hashable"]  # type: ignore[return-value]


async def test_get_advance_lane_raising_fails_the_poll(feed: Feed) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, _LaneTrouble("f", "a"), 1).start()
    feed.push(0)
    await eventually(lambda: a.error is not None)
    assert isinstance(a.error, LookupError)
    assert not manager.has_group(KEY)


async def test_unhashable_lane_fails_the_poll_with_a_clear_error(feed: Feed) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, _UnhashableLane("f", "a"), 1).start()
    feed.push(0)
    await eventually(lambda: a.error is not None)
    assert isinstance(a.error, ProducerContractError)
    assert "unhashable list" in str(a.error)


async def test_open_stream_must_yield_pairs(feed: Feed) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, FeedTrigger("f", "a"), 1).start()
    feed.items.put_nowait("not a pair of two")
    await eventually(lambda: a.error is not None)
    assert isinstance(a.error, ProducerContractError)
    assert "(raw_event, broker_payload) pairs" in str(a.error)


class _NotAProducer(FeedTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return object()  # type: ignore[return-value]


async def test_factory_must_return_a_producer(feed: Feed) -> None:
    manager = SharedStreamManager()
    a = Runner(manager, _NotAProducer("f", "a"), 1).start()
    await eventually(lambda: a.error is not None)
    assert isinstance(a.error, ProducerContractError)
    assert "not a SharedStreamProducer" in str(a.error)


async def test_overflowed_subscriber_does_not_hold_back_the_others(feed: Feed) -> None:
    manager = SharedStreamManager(max_subscriber_queue=2)
    stuck = Runner(manager, FeedTrigger("f", "stuck"), 1)
    stuck.gate = asyncio.Event()
    stuck.start()
    Runner(manager, FeedTrigger("f", "ok"), 2).start()
    feed.push(0)
    await eventually(lambda: len(stuck.events) == 1)
    feed.push(1, 2, 3, 4)  # 1 and 2 fill stuck's queue; 3 overflows it
    await eventually(lambda: len(feed.advanced()) == 5)
    outcomes = [outcome for _, outcome in feed.advanced()]
    assert outcomes == [AdvanceOutcome(1, 1, 0)] * 4 + [AdvanceOutcome(1, 0, 0)]
    assert stuck.failure() is None  # still paused; the error waits for it
    stuck.gate.set()
    await eventually(lambda: isinstance(stuck.error, SubscriberOverflow))
    await manager.stop_all()


class _Loud(FeedTrigger):
    """A filter that yields several events per raw event, all gated."""

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for event in super().filter_shared_stream(shared_stream):
            yield event


async def test_every_derived_event_gates_its_raw_event(feed: Feed) -> None:
    manager = SharedStreamManager()
    r = Runner(manager, _Loud("f", "loud", emit=3), 1, auto_confirm=False).start()
    feed.push(0, 1)
    await eventually(lambda: len(r.unconfirmed) == 6)
    manager.confirm_persisted(r.unconfirmed[:2])
    await settle()
    assert feed.advanced() == []
    manager.confirm_persisted(r.unconfirmed[2:3])
    await eventually(lambda: feed.advanced() == [(0, AdvanceOutcome(1, 0, 0))])
    await manager.stop_all()


class _Crashy(FeedTrigger):
    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for raw in shared_stream:
            if raw == 1:
                raise ValueError("cannot parse message 1")
            yield {"raw": raw}


async def test_filter_that_raises_fails_the_event_it_was_on(feed: Feed) -> None:
    manager = SharedStreamManager()
    crashy = Runner(manager, _Crashy("f", "crashy"), 1).start()
    Runner(manager, FeedTrigger("f", "ok"), 2).start()
    feed.push(0, 1, 2)
    await eventually(lambda: crashy.error is not None)
    error = crashy.failure()
    assert isinstance(error, ValueError)
    manager.fail_subscriber(trigger_id=1, key=KEY, error=error)  # as the runtime does
    await manager.unsubscribe(1, KEY)
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced() == [
        (0, CLEAN),
        (1, AdvanceOutcome(1, 1, 0)),  # redelivered, not committed as done
        (2, AdvanceOutcome(1, 1, 0)),
    ]
    await manager.stop_all()


class _NamedProducer(FeedProducer):
    def raw_event_name(self, broker_payload: Any) -> str | None:
        return f"log/{broker_payload}"


class _Named(FeedTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return _NamedProducer(super().create_shared_stream_producer(kwargs).feed)  # type: ignore[attr-defined]


async def test_raw_event_key_names_the_raw_event_and_the_index_within_it(feed: Feed) -> None:
    manager = SharedStreamManager()
    keys: list[str | None] = []
    trigger = _Named("f", "n", emit=2)
    stream = manager.subscribe(trigger_id=1, trigger=trigger, key=KEY)
    assert manager.raw_event_key(trigger_id=1, key=KEY) is None  # no window yet
    feed.push(7, 7, 8)  # 7 is delivered twice in a row, as after a seek back
    async for _event in trigger.filter_shared_stream(stream):
        manager.bind_pending_event(trigger_id=1, key=KEY)
        keys.append(manager.raw_event_key(trigger_id=1, key=KEY))
        if len(keys) == 6:
            break
    assert keys == ["log/7#0", "log/7#1", "log/7#0", "log/7#1", "log/8#0", "log/8#1"]
    assert manager.raw_event_key(trigger_id=1, key=("other",)) is None
    await manager.stop_all()
