"""Shutdown reaches trigger code as cancellation, as in Airflow, and leaves no reader waiting.

A filter written the way Airflow trigger code often is - its loop wrapped in
``except Exception`` to log and carry on - must see shutdown as
``asyncio.CancelledError`` (which it does not catch), never as an exception
it would swallow. The owners of filter tasks (here the testing kit's
``SupervisedRunner``, in ``tests/runtime`` the triggerer) cancel them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sharedstream import SharedStreamManager, TriggerEvent
from sharedstream.testing.runner import SupervisedRunner
from tests.engine.harness import FastFeedTrigger, Feed, FeedTrigger, FeedTriggerBase, eventually

SEEN: dict[str, list[str]] = {}
"""Per trigger name, what its filter saw: ``caught <Error>`` or ``cancelled``."""


class Guarded(FeedTriggerBase):
    """A filter whose loop catches ``Exception`` (logs and carries on, Airflow-style)."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        seen = SEEN.setdefault(self.name, [])
        try:
            while True:
                try:
                    async for raw in shared_stream:
                        yield TriggerEvent({"raw": raw, "by": self.name, "n": 0})
                except Exception as exc:  # noqa: BLE001 - the habit under test
                    seen.append(f"caught {type(exc).__name__}")
                    return
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise


class GuardedAck(Guarded, FeedTrigger):
    """Ack mode."""


class GuardedFast(Guarded, FastFeedTrigger):
    """The fast path."""


@pytest.fixture(autouse=True)
def _fresh_seen() -> None:
    SEEN.clear()


@pytest.mark.parametrize("trigger_cls", [GuardedAck, GuardedFast])
@pytest.mark.parametrize("order", ["runners first", "manager first"])
async def test_a_filter_catching_exception_sees_cancellation_at_shutdown(
    feed: Feed, trigger_cls: type[Guarded], order: str
) -> None:
    manager = SharedStreamManager()
    runner = SupervisedRunner(manager, trigger_cls("f", "guarded"), 1).start()
    feed.push(0, 1)
    await eventually(lambda: len(runner.events) == 2)
    async with asyncio.timeout(2):  # nobody is left waiting, in either order
        if order == "manager first":
            await manager.stop_all()
            await asyncio.sleep(0.05)
            assert runner.task is not None
            assert not runner.task.done()  # parked, not failed: its owner decides
        await runner.stop()
        await manager.stop_all()
    assert SEEN["guarded"] == ["cancelled"]  # never "caught StreamStopped"
    assert runner.task is not None
    assert runner.task.cancelled()  # the filter did not swallow the cancellation


async def test_a_stopped_stream_never_raises_into_the_filter(feed: Feed) -> None:
    """After ``stop_all`` a pull waits for cancellation, however long the filter was away."""
    manager = SharedStreamManager()
    trigger = GuardedAck("f", "late")
    stream = manager.subscribe(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
    events = trigger.filter_shared_stream(stream)
    feed.push(0)
    assert await anext(events) == TriggerEvent({"raw": 0, "by": "late", "n": 0})
    await manager.stop_all()  # the filter is away (between two pulls) when it happens
    pull = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert not pull.done()
    pull.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pull
    assert SEEN["late"] == ["cancelled"]
