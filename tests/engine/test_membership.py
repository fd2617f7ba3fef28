"""Durable membership: a watcher that fails, hangs, lags or restarts never lets an event by.

Each test drives real groups through ``SharedStreamManager.join`` with the
in-memory feed, and checks what the producer was asked to advance: an event
may be advanced clean only once every member stored what it derived from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from sharedstream import AckTimeout, AdvanceOutcome, SharedStreamManager
from sharedstream.engine.errors import DuplicateSubscription
from tests.engine.conftest import FakeClock
from tests.engine.harness import (
    Feed,
    FeedProducer,
    FeedTrigger,
    MemberRunner,
    eventually,
    settle,
)


def members(manager: SharedStreamManager, *names: str, **kwargs: bool) -> list[MemberRunner]:
    return [MemberRunner(manager, FeedTrigger("f", name), i, **kwargs).start()
            for i, name in enumerate(names, start=1)]


def outcomes(feed: Feed) -> dict[int, AdvanceOutcome]:
    return dict(feed.advanced())


async def test_a_failed_attempt_fails_only_the_event_it_was_on(feed: Feed) -> None:
    feed.lane_of = lambda payload: payload  # no order between raw events
    manager = SharedStreamManager()
    _plain, raising = members(manager, "plain", "raising")
    raising.raise_on = 3
    raising.raise_times = 1
    feed.push(*range(10))
    await eventually(lambda: not raising.running())
    assert [str(e) for e in raising.errors] == ["boom on 3"]
    raising.restart()
    await eventually(lambda: len(feed.advanced()) == 10)
    advanced = outcomes(feed)
    failed = advanced.pop(3)
    assert (failed.acked, failed.failed, failed.unseen) == (1, 1, 0)  # its own failure
    [verdict] = failed.verdicts
    assert (verdict.trigger_id, verdict.resolution) == (2, "failed")
    assert verdict.reason == "RuntimeError: boom on 3"
    # Everything fanned out while it was away waited for it and was stored by it.
    assert all(outcome == (2, 0, 0) for outcome in advanced.values())
    assert sorted(raising.raws()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    await manager.stop_all()


async def test_events_fanned_out_while_a_member_is_away_are_not_advanced(feed: Feed) -> None:
    feed.lane_of = lambda payload: payload
    manager = SharedStreamManager()
    _plain, raising = members(manager, "plain", "raising")
    raising.raise_on = 0
    raising.raise_times = 1
    feed.push(0)
    await eventually(lambda: not raising.running())
    feed.push(1, 2, 3)  # fanned out while it is away (between attempts)
    await eventually(lambda: len(feed.advanced()) == 1)
    await settle()
    assert [raw for raw, _ in feed.advanced()] == [0]  # 1..3 wait for it
    raising.restart()
    await eventually(lambda: len(feed.advanced()) == 4)
    assert [outcome for _, outcome in feed.advanced()][1:] == [(2, 0, 0)] * 3
    assert raising.raws() == [1, 2, 3]
    await manager.stop_all()


async def test_events_it_moved_past_resolve_with_their_confirmations(feed: Feed) -> None:
    """A filter that raises does not fail what it already handed to the store (issue 11, B)."""
    manager = SharedStreamManager()
    [raising] = members(manager, "raising", auto_confirm=False)
    raising.raise_on = 2
    raising.raise_times = 1
    feed.push(0, 1, 2)
    await eventually(lambda: not raising.running())
    raising.confirm_all()  # the events of 0 and 1 commit after the failure
    await eventually(lambda: len(feed.advanced()) == 3)
    assert [outcome for _, outcome in feed.advanced()] == [(1, 0, 0), (1, 0, 0), (0, 1, 0)]
    await manager.stop_all()


async def test_a_failure_fences_the_rest_of_its_lane_until_it_is_advanced(feed: Feed) -> None:
    """The member must not see its lane out of order: what follows the failed event in
    that lane fails for it too (the broker redelivers it after the failed one)."""
    feed.lane_of = lambda payload: payload % 2
    manager = SharedStreamManager()
    _plain, raising = members(manager, "plain", "raising")
    raising.raise_on = 2
    raising.raise_times = 1
    raising.gate = asyncio.Event()  # 0..7 are all queued for it when it fails on 2
    feed.push(*range(8))
    await eventually(lambda: manager.lag() == [(("feed", "f"), 2, 7)])
    raising.gate.set()
    await eventually(lambda: not raising.running())
    raising.gate = None
    raising.restart()
    await eventually(lambda: len(feed.advanced()) == 8)
    advanced = outcomes(feed)
    assert (advanced[2].failed, advanced[2].unseen) == (1, 0)  # its own failure
    assert [(advanced[n].failed, advanced[n].unseen) for n in (4, 6)] == [(1, 1), (1, 1)]
    assert all(advanced[n] == (2, 0, 0) for n in (0, 1, 3, 5, 7))  # the other lane waited
    assert sorted(raising.raws()) == [0, 1, 3, 5, 7]
    feed.push(8)  # lane 0 again, after 2 was advanced: the fence is down
    await eventually(lambda: 8 in raising.raws())
    await manager.stop_all()


async def test_a_slow_member_pauses_the_poll_instead_of_overflowing(feed: Feed) -> None:
    manager = SharedStreamManager(max_subscriber_queue=4)
    _fast, slow = members(manager, "fast", "slow")
    slow.gate = asyncio.Event()
    feed.push(*range(40))
    await eventually(slow.pulls.is_set)
    await settle(50)
    # One raw event out with the filter, four queued: the poll took no more than that.
    assert feed.items.qsize() == 40 - 5
    assert manager.lag() == [(("feed", "f"), 2, 4)]
    slow.gate.set()
    await eventually(lambda: len(feed.advanced()) == 40)
    assert all(outcome == (2, 0, 0) for _, outcome in feed.advanced())
    assert slow.errors == []  # never failed for being slow
    assert slow.raws() == list(range(40))
    await manager.stop_all()


async def test_ack_timeout_interrupts_a_hung_attempt_and_keeps_the_member(
    feed: Feed, clock: FakeClock,
) -> None:
    manager = SharedStreamManager(ack_timeout=5, clock=clock)
    _plain, hung = members(manager, "plain", "hung")
    hung.hang_on = 1
    feed.push(0, 1)
    await eventually(lambda: len(feed.advanced()) == 1)
    clock.advance(5)
    await eventually(lambda: not hung.running())
    [interrupt] = hung.interrupted
    assert isinstance(interrupt, AckTimeout)
    await eventually(lambda: len(feed.advanced()) == 2)
    overdue = feed.advanced()[1][1]
    assert (overdue.acked, overdue.failed, overdue.unseen) == (1, 1, 0)
    assert overdue.verdicts[0].trigger_id == 2
    feed.push(2)
    await settle()
    assert len(feed.advanced()) == 2  # 2 is queued for it: not done without it
    hung.hang_on = None
    hung.restart()
    await eventually(lambda: len(feed.advanced()) == 3)
    assert feed.advanced()[2] == (2, (2, 0, 0))
    await manager.stop_all()


async def test_an_event_queued_for_an_absent_member_times_out_as_unseen(
    feed: Feed, clock: FakeClock,
) -> None:
    manager = SharedStreamManager(ack_timeout=5, clock=clock)
    _plain, away = members(manager, "plain", "away")
    away.raise_on = 0
    away.raise_times = 1
    feed.push(0, 1)
    await eventually(lambda: not away.running())
    clock.advance(5)
    await eventually(lambda: len(feed.advanced()) == 2)
    late = feed.advanced()[1][1]
    assert (late.acked, late.failed, late.unseen) == (1, 1, 1)  # redelivered, not its fault
    assert manager.lag() == []  # it left the member's queue
    feed.push(2)  # the member is still in the snapshot
    await settle()
    assert len(feed.advanced()) == 2
    away.restart()
    await eventually(lambda: len(feed.advanced()) == 3)
    assert away.raws() == [2]
    await manager.stop_all()


async def test_a_new_group_starts_with_every_member(feed: Feed) -> None:
    manager = SharedStreamManager()
    first, second = members(manager, "first", "second")
    second.gate = asyncio.Event()
    feed.push(0)
    await eventually(lambda: first.raws() == [0] and second.pulls.is_set())
    feed.fail(RuntimeError("broker gone"))
    await eventually(lambda: not first.running())
    first.restart()  # starts a new group; `second` is still busy in the old one
    await eventually(lambda: feed.opens == 2)
    feed.push(1, 2)
    await eventually(lambda: first.raws() == [0, 1, 2])
    await settle()
    assert [raw for raw, _ in feed.advanced()] == []  # 1 and 2 are queued for `second`
    second.gate.set()
    await eventually(lambda: not second.running())
    assert "broker gone" in str(second.errors[0])
    second.restart()
    await eventually(lambda: [raw for raw, _ in feed.advanced()] == [1, 2])
    assert [outcome for _, outcome in feed.advanced()] == [(2, 0, 0), (2, 0, 0)]
    await manager.stop_all()


async def test_a_refused_event_rejects_its_raw_event(feed: Feed) -> None:
    manager = SharedStreamManager()
    [member] = members(manager, "member", auto_confirm=False)
    feed.push(0, 1)
    await eventually(lambda: len(member.unconfirmed) == 2)
    first, second = member.unconfirmed
    manager.refuse_persisted(first, "the trigger event cannot be stored: too deep")
    manager.confirm_persisted([second])
    await eventually(lambda: len(feed.advanced()) == 2)
    refused = feed.advanced()[0][1]
    assert refused == (0, 0, 1)
    assert refused.verdicts[0].reason == "the trigger event cannot be stored: too deep"
    assert feed.advanced()[1][1] == (1, 0, 0)
    await manager.stop_all()


async def test_a_closed_intake_valve_holds_every_poll(feed: Feed) -> None:
    manager = SharedStreamManager()
    [member] = members(manager, "member")
    feed.push(0)
    await eventually(lambda: member.raws() == [0])
    manager.intake.close("store")
    feed.push(1, 2, 3)
    await settle(50)
    assert member.raws() in ([0], [0, 1])  # at most the event already taken
    manager.intake.close("other")
    manager.intake.open("store")
    await settle(50)
    assert member.raws() in ([0], [0, 1])  # another reason still holds it
    manager.intake.open("other")
    await eventually(lambda: member.raws() == [0, 1, 2, 3])
    await manager.stop_all()


async def test_leaving_keeps_the_plain_unsubscribe_semantics(feed: Feed) -> None:
    manager = SharedStreamManager()
    _stay, leaving = members(manager, "stay", "leaving")
    leaving.gate = asyncio.Event()
    feed.push(0, 1)
    await eventually(leaving.pulls.is_set)
    await leaving.stop()
    feed.push(2)
    await eventually(lambda: len(feed.advanced()) == 3)
    assert [outcome for _, outcome in feed.advanced()] == [(2, 0, 0), (1, 1, 0), (1, 0, 0)]
    with pytest.raises(Exception, match="left"):
        leaving.member.stream()
    await manager.stop_all()


async def test_one_trigger_id_is_one_member(feed: Feed) -> None:
    manager = SharedStreamManager()
    trigger = FeedTrigger("f", "one")
    manager.join(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
    with pytest.raises(DuplicateSubscription):
        manager.join(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
    with pytest.raises(DuplicateSubscription):
        manager.subscribe(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
    await manager.stop_all()


class _Ledger:
    """A failure ledger that writes down what it was asked to count, in the feed's events."""

    def __init__(self, feed: Feed, error: Exception | None = None) -> None:
        self.feed, self.error = feed, error
        self.counted: list[list[str]] = []

    async def add(self, names: Sequence[str]) -> None:
        if self.error is not None:
            raise self.error
        self.counted.append(list(names))
        self.feed.events.append("count")

    async def counts(self, names: Sequence[str]) -> Mapping[str, int]:
        return {}


def _counting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FeedProducer, "counts_deliveries", True)
    monkeypatch.setattr(FeedProducer, "raw_event_name", lambda self, payload: f"f/{payload}")


async def test_a_member_s_own_failure_is_counted_in_the_ledger_before_it_is_advanced(
    feed: Feed, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29, part 3: a producer that counts deliveries gets each raw event a member
    failed on itself counted durably before ``advance`` hands it back; the events it only
    failed because they were queued behind that one are not counted against them."""
    _counting(monkeypatch)
    feed.lane_of = lambda payload: payload % 2
    manager = SharedStreamManager()
    ledger = manager.failure_ledger = _Ledger(feed)
    _plain, raising = members(manager, "plain", "raising")
    raising.raise_on = 2
    raising.raise_times = 1
    raising.gate = asyncio.Event()  # 0..7 are all queued for it when it fails on 2
    feed.push(*range(8))
    await eventually(lambda: manager.lag() == [(("feed", "f"), 2, 7)])
    raising.gate.set()
    await eventually(lambda: not raising.running())
    raising.gate = None
    raising.restart()
    await eventually(lambda: len(feed.advanced()) == 8)
    assert ledger.counted == [["f/2"]]  # 4 and 6 failed unseen
    counted_at = feed.events.index("count")
    batch = feed.batches[feed.events[:counted_at].count("advance")]  # the next advance
    assert 2 in [item.broker_payload for item in batch]
    await manager.stop_all()


async def test_a_ledger_that_cannot_count_does_not_hold_the_failure_back(
    feed: Feed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    _counting(monkeypatch)
    manager = SharedStreamManager()
    manager.failure_ledger = _Ledger(feed, error=OSError("the store is away"))
    [raising] = members(manager, "raising")
    raising.raise_on = 1
    raising.raise_times = 1
    feed.push(0, 1)
    await eventually(lambda: len(feed.advanced()) == 2)
    assert [outcome for _, outcome in feed.advanced()] == [(1, 0, 0), (0, 1, 0)]
    assert "could not count raw events' failures in the store" in caplog.text
    assert "the store is away" in caplog.text
    await manager.stop_all()
