"""Quickstart: three triggers share one upstream, and the broker advances only when all agree.

Run it with ``python examples/quickstart.py``. It builds an in-memory
"broker" of 12 messages, three watchers with different filters on one
shared-stream key (ack mode), a store that persists their events, and
prints what the producer is told for every message: the outcome counts and
whether it may be committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from sharedstream import (
    AdvanceItem,
    BaseEventTrigger,
    SharedStreamManager,
    SharedStreamProducer,
    TriggerEvent,
    reject_shared_stream_event,
)

MESSAGES = [
    {"offset": n, "kind": kind, "amount": n * 10}
    for n, kind in enumerate(["order", "refund", "order", "junk"] * 3)
]


class ListProducer(SharedStreamProducer):
    """A pretend broker: yields its messages, then waits; prints each advance."""

    def __init__(self) -> None:
        self.committed: list[int] = []
        self.done = asyncio.Event()

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        for message in MESSAGES:
            yield message, message["offset"]
        await asyncio.Event().wait()  # a real poll never returns

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        for offset, outcome in batch:
            if outcome.is_clean:
                verdict = "commit"
            else:
                verdict = "dead-letter" if outcome.rejected else "redeliver"
            print(f"  offset {offset:2}: {outcome} -> {verdict}")
            self.committed.append(offset)
        if len(self.committed) == len(MESSAGES):
            self.done.set()


PRODUCER = ListProducer()


class WatchKind(BaseEventTrigger):
    """Fires for messages of one kind, from ``min_amount`` up; rejects what it cannot understand."""

    def __init__(self, kind: str, min_amount: int = 0) -> None:
        super().__init__()
        self.kind = kind
        self.min_amount = min_amount

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.WatchKind", {"kind": self.kind, "min_amount": self.min_amount})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError("this trigger only runs on a shared stream")
        yield  # type: ignore[unreachable]  # makes this an async generator

    def shared_stream_key(self) -> Hashable:
        return ("demo-topic",)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return PRODUCER

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            if message["kind"] == "junk":
                reject_shared_stream_event()
            elif message["kind"] == self.kind and message["amount"] >= self.min_amount:
                yield TriggerEvent({"watcher": self.kind, "offset": message["offset"]})


async def run_watcher(manager: SharedStreamManager, trigger_id: int, trigger: WatchKind,
                      store: list[Any]) -> None:
    key = trigger.shared_stream_key()
    stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
    async for event in trigger.filter_shared_stream(stream):
        seq = manager.bind_pending_event(trigger_id=trigger_id, key=key)
        store.append(event.payload)  # "durably stored"
        if seq is not None:
            manager.confirm_persisted([seq])


async def main() -> None:
    manager = SharedStreamManager()
    store: list[Any] = []
    print("3 watchers (orders, refunds, orders of 50 or more) share one consumer "
          "of 12 messages:")
    triggers = [WatchKind("order"), WatchKind("refund"), WatchKind("order", min_amount=50)]
    watchers = [
        asyncio.create_task(run_watcher(manager, i, trigger, store))
        for i, trigger in enumerate(triggers)
    ]
    await asyncio.wait_for(PRODUCER.done.wait(), timeout=10)
    for task in watchers:
        task.cancel()
    await asyncio.wait(watchers)
    await manager.stop_all()
    print(f"{len(store)} trigger events stored, {len(PRODUCER.committed)} offsets advanced")


if __name__ == "__main__":
    asyncio.run(main())
