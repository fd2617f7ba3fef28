"""The persistence gate's queue: what waits for room and what never does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sharedstream.runtime.persist import PersistGate
from sharedstream.store.base import PendingEvent, WriteResult


def event(n: int) -> PendingEvent:
    return PendingEvent(1, f"k{n}", b"payload")


class Store:
    """Writes only when allowed to, and records what it wrote."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.batches: list[list[str | None]] = []

    async def write(self, batch: Sequence[PendingEvent]) -> WriteResult:
        await self.open.wait()
        self.batches.append([e.idem_key for e in batch])
        return WriteResult(stored=len(batch), duplicates=0, asset_events=0, dag_runs=())


async def test_gated_events_are_queued_past_capacity_ungated_ones_wait() -> None:
    store = Store()
    confirmed: list[int] = []
    gate = PersistGate(write=store.write, confirm=confirmed.extend, batch_max=100, linger=0,
                       capacity=2)
    # Ack-mode events (with a seq) never wait: a filter held here would let its
    # trigger's queue overflow while its producer's read-ahead bounds them anyway.
    assert all(gate.offer(event(n), n) for n in range(5))
    # The rest (fast path, standalone triggers) is bounded by the capacity.
    assert not gate.offer(event(5), None)
    waiting = asyncio.create_task(gate.put(event(6), None))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    runner = asyncio.create_task(gate.run())
    store.open.set()
    await asyncio.wait_for(waiting, 1)
    await asyncio.wait_for(gate.flush(), 1)
    assert confirmed == [0, 1, 2, 3, 4]
    written = [key for batch in store.batches for key in batch]
    assert written == [f"k{n}" for n in (0, 1, 2, 3, 4, 6)]
    gate.stop()
    await runner


class FailingStore:
    """Refuses the first ``failures`` writes (a locked or full database), then stores."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.batches: list[list[str | None]] = []

    async def write(self, batch: Sequence[PendingEvent]) -> WriteResult:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise RuntimeError("database is locked")
        self.batches.append([e.idem_key for e in batch])
        return WriteResult(stored=len(batch), duplicates=0, asset_events=0, dag_runs=())


async def test_a_failing_store_is_retried_until_it_takes_the_batch_never_dropped() -> None:
    store = FailingStore(failures=8)
    confirmed: list[int] = []
    pressure: list[bool] = []
    gate = PersistGate(write=store.write, confirm=confirmed.extend, batch_max=100, linger=0,
                       retry_delay=0.001, on_pressure=pressure.append)
    runner = asyncio.create_task(gate.run())
    assert all(gate.offer(event(n), n) for n in range(3))
    await asyncio.wait_for(gate.flush(), 5)
    assert store.batches == [["k0", "k1", "k2"]]  # one batch, stored whole, late
    assert confirmed == [0, 1, 2]  # confirmed only after the commit
    assert gate.failed_writes == 8
    assert pressure == [True, False]  # intake held while the store failed, then released
    assert not gate.store_failing
    gate.stop()
    await runner


async def test_a_long_queue_puts_pressure_on_until_it_is_down_to_half() -> None:
    store = Store()
    pressure: list[bool] = []
    gate = PersistGate(write=store.write, confirm=lambda seqs: None, batch_max=2, linger=0,
                       capacity=4, on_pressure=pressure.append)
    for n in range(6):
        gate.offer(event(n), n)  # gated events are queued past the capacity...
    assert pressure == [True]  # ...and hold the streams' intake instead
    runner = asyncio.create_task(gate.run())
    store.open.set()
    await asyncio.wait_for(gate.flush(), 1)
    assert pressure == [True, False]
    gate.stop()
    await runner
