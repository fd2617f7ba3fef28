"""The lease keeper against a fake renew function and a fake clock (no broker, no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import pytest

from sharedstream.brokerkit.lease import LeaseKeeper


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Broker:
    """Renews what it is asked to, except ids it refuses; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.refuse: set[str] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate: asyncio.Event | None = None
        self.called = asyncio.Event()

    async def renew(self, batch: Sequence[str]) -> Collection[str]:
        self.calls.append(list(batch))
        self.called.set()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)
            if self.gate is not None:
                await self.gate.wait()
            return [key for key in batch if key not in self.refuse]
        finally:
            self.in_flight -= 1


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker() -> Broker:
    return Broker()


def keeper(broker: Broker, clock: Clock, lost: list[str] | None = None,
           batch_size: int = 10, concurrency: int = 2) -> LeaseKeeper[str]:
    return LeaseKeeper(broker.renew, lease=30.0, batch_size=batch_size, concurrency=concurrency,
                       clock=clock, on_lost=None if lost is None else lost.extend)


async def test_renews_only_once_a_lease_is_due_and_before_it_expires(
    broker: Broker, clock: Clock,
) -> None:
    leases = keeper(broker, clock)
    leases.hold("m1", 30.0)
    clock.now = 10.0  # expires in 20 s: more than half the lease left
    assert await leases.renew_due() == []
    assert broker.calls == []
    clock.now = 16.0  # expires in 14 s: due
    assert await leases.renew_due() == ["m1"]
    assert leases.held() == {"m1": 46.0}, "renewed for a full lease from the round's start"


async def test_renews_in_batches_with_bounded_concurrency(broker: Broker, clock: Clock) -> None:
    leases = keeper(broker, clock, batch_size=3, concurrency=2)
    ids = [f"m{i}" for i in range(8)]
    for key in ids:
        leases.hold(key, 10.0)
    assert sorted(await leases.renew_due()) == sorted(ids)
    assert [len(call) for call in broker.calls] == [3, 3, 2]
    assert broker.most_in_flight == 2


async def test_settled_leases_are_not_renewed(broker: Broker, clock: Clock) -> None:
    leases = keeper(broker, clock)
    leases.hold("done", 10.0)
    leases.hold("open", 10.0)
    leases.settle("done")
    leases.settle("done")  # idempotent
    await leases.renew_due()
    assert broker.calls == [["open"]]


async def test_a_lease_settled_during_its_renewal_stays_settled(
    broker: Broker, clock: Clock,
) -> None:
    leases = keeper(broker, clock)
    leases.hold("m1", 10.0)
    broker.gate = asyncio.Event()
    renewal = asyncio.create_task(leases.renew_due())
    await broker.called.wait()
    leases.settle("m1")  # advanced while the renewal call is in flight
    broker.gate.set()
    assert await renewal == ["m1"]
    assert leases.held() == {}, "the renewal did not bring it back"


async def test_a_lease_the_broker_keeps_refusing_is_reported_lost_once(
    broker: Broker, clock: Clock,
) -> None:
    lost: list[str] = []
    leases = keeper(broker, clock, lost)
    leases.hold("gone", 20.0)
    leases.hold("fine", 20.0)
    broker.refuse = {"gone"}
    clock.now = 10.0
    assert await leases.renew_due() == ["fine"]
    assert lost == [], "refused once: still held, tried again next round"
    clock.now = 15.0
    await leases.renew_due()
    assert broker.calls[-1] == ["gone"]
    clock.now = 20.0  # expired unrenewed
    await leases.renew_due()
    assert lost == ["gone"]
    assert set(leases.held()) == {"fine"}
    clock.now = 21.0
    await leases.renew_due()
    assert lost == ["gone"], "reported once"


async def test_a_renew_call_that_raises_is_retried_next_round(
    broker: Broker, clock: Clock,
) -> None:
    calls = 0

    async def flaky(batch: Sequence[str]) -> Collection[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("broker went away")
        return batch

    leases = LeaseKeeper(flaky, lease=30.0, batch_size=10, clock=clock)
    leases.hold("m1", 10.0)
    assert await leases.renew_due() == []
    assert await leases.renew_due() == ["m1"]
    assert leases.held() == {"m1": 30.0}


async def test_run_renews_every_tick_under_the_guard(broker: Broker, clock: Clock) -> None:
    guard = asyncio.Lock()
    ticks: list[float] = []

    async def sleep(seconds: float) -> None:
        ticks.append(seconds)
        clock.now += seconds
        if len(ticks) > 6:
            raise asyncio.CancelledError

    leases = LeaseKeeper(broker.renew, lease=8.0, batch_size=10, clock=clock, sleep=sleep,
                         guard=guard)
    leases.hold("m1", 8.0)
    async with guard:  # the owner is re-showing: the round waits for it
        task = asyncio.create_task(leases.run())
        for _ in range(5):
            await asyncio.sleep(0)
        assert broker.calls == []
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ticks == [2.0] * 7  # a quarter of the lease; rounds at t = 2, 4, ..., 12
    # Due once less than half the lease is left: at t=6 (expires at 8) and t=12 (at 14).
    assert len(broker.calls) == 2, "renewed when due, not every tick"


def test_a_shorter_lease_replans_renewal_and_a_longer_one_changes_nothing() -> None:
    async def renew(keys: object) -> list[str]:
        return []

    keeper: LeaseKeeper[str] = LeaseKeeper(renew, lease=60, batch_size=10, tick=1.0)
    assert not keeper.shorten(90)
    assert (keeper.lease, keeper.renew_within, keeper.tick) == (60, 30, 1.0)
    assert keeper.shorten(2.0)
    assert (keeper.lease, keeper.renew_within, keeper.tick) == (2.0, 1.0, 0.5)
    assert keeper.shorten(0.4)
    assert keeper.tick == 0.2


class SlowBroker(Broker):
    """Each renew call takes ``took`` seconds of the fake clock."""

    def __init__(self, clock: Clock, took: float) -> None:
        super().__init__()
        self.clock, self.took = clock, took

    async def renew(self, batch: Sequence[str]) -> Collection[str]:
        self.clock.now += self.took
        return await super().renew(batch)


async def test_a_slow_round_trip_makes_renewals_start_earlier(clock: Clock) -> None:
    """Due at half the lease, or once only ``margin_round_trips`` round trips are left."""
    broker = SlowBroker(clock, took=4.0)
    leases = LeaseKeeper(broker.renew, lease=30.0, batch_size=10, margin_round_trips=5,
                         clock=clock)
    assert (leases.round_trip, leases.margin) == (0.0, 15.0)  # nothing observed: half
    leases.hold("m1", 14.0)
    assert await leases.renew_due() == ["m1"]  # 14 s left at 0 s: due; the call took 4 s
    assert leases.round_trip == 4.0
    assert leases.margin == 20.0  # five round trips of 4 s: more than half the lease
    broker.took = 10.0
    leases.hold("m2", clock.now + 19.0)  # 19 s left: not due by half, due by round trips
    assert await leases.renew_due() == ["m2"]
    assert leases.round_trip == 10.0  # the slowest of the last calls
    assert leases.margin == 30.0  # never more than a lease: then every lease is always due


async def test_a_round_renews_the_soonest_expiring_first(broker: Broker, clock: Clock) -> None:
    leases = keeper(broker, clock, batch_size=2, concurrency=1)
    for key, expires in (("late", 12.0), ("soon", 3.0), ("middle", 8.0)):
        leases.hold(key, expires)
    await leases.renew_due()
    assert broker.calls == [["soon", "middle"], ["late"]]
