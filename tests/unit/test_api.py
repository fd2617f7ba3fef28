"""The public trigger API: cheap events, outcome arithmetic, ack-mode detection, porting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Hashable
from typing import Any

import pytest

import sharedstream
from sharedstream import (
    AckTimeout,
    AdvanceItem,
    AdvanceOutcome,
    BaseEventTrigger,
    BaseTrigger,
    PollTerminated,
    SharedStreamError,
    SharedStreamProducer,
    SubscriberOverflow,
    TriggerEvent,
)
from sharedstream.engine.trigger import uses_ack_mode


def test_trigger_event_is_slotted_with_value_equality_and_repr() -> None:
    event = TriggerEvent({"a": 1})
    assert event == TriggerEvent({"a": 1})
    assert event != TriggerEvent({"a": 2})
    assert repr(event) == "TriggerEvent<{'a': 1}>"
    assert not hasattr(event, "__dict__")
    with pytest.raises(TypeError):
        hash(event)


@pytest.mark.parametrize(
    ("outcome", "clean"),
    [
        (AdvanceOutcome(1, 0, 0), True),
        (AdvanceOutcome(3, 0), True),
        (AdvanceOutcome(0, 0, 0), False),  # broadcast to nobody
        (AdvanceOutcome(2, 1, 0), False),
        (AdvanceOutcome(2, 0, 1), False),
    ],
)
def test_is_clean_needs_an_ack_and_no_failure_or_reject(
    outcome: AdvanceOutcome, clean: bool
) -> None:
    assert outcome.is_clean is clean


def test_advance_item_unpacks_like_the_airflow_examples() -> None:
    payload, outcome = AdvanceItem("offset-7", AdvanceOutcome(1, 0, 0))
    assert payload == "offset-7"
    assert outcome.is_clean


def test_errors_share_one_base_and_say_whether_retrying_helps() -> None:
    assert issubclass(AckTimeout, SharedStreamError)
    assert AckTimeout.retryable
    assert SubscriberOverflow.retryable
    assert PollTerminated.retryable
    assert not sharedstream.ProducerContractError.retryable


class _Producer(SharedStreamProducer):
    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        yield 1, 1

    async def advance(self, batch: Any) -> None:
        return None


class _Fast(BaseEventTrigger):
    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("x._Fast", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(None)


class _Acking(_Fast):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return _Producer()


class _InheritsAck(_Acking):
    pass


def test_ack_mode_is_switched_on_by_an_override_anywhere_in_the_hierarchy() -> None:
    assert not uses_ack_mode(_Fast)
    assert uses_ack_mode(_Acking)
    assert uses_ack_mode(_InheritsAck)


def test_default_hooks_fail_with_messages_naming_the_class() -> None:
    trigger = _Fast()
    assert trigger.shared_stream_key() is None
    assert trigger.trigger_id is None
    assert repr(trigger) == "<x._Fast >"
    with pytest.raises(NotImplementedError, match="_Fast does not create"):
        _Fast.create_shared_stream_producer({})

    async def first(iterator: AsyncIterator[Any]) -> Any:
        return await anext(iterator)

    with pytest.raises(NotImplementedError, match="implements neither"):
        asyncio.run(first(_Fast.open_shared_stream({})))
    with pytest.raises(NotImplementedError, match="does not implement filter_shared_stream"):
        asyncio.run(first(trigger.filter_shared_stream(_Fast.open_shared_stream({}))))
    assert trigger.log.name.endswith("_Fast")
    assert isinstance(trigger.log, logging.LoggerAdapter)  # over the class's stdlib logger
    assert trigger.log.logger is logging.getLogger(trigger.log.name)


# The class below is written exactly as for Airflow 3.3; only the imports at
# the top of this module differ (airflow.triggers.base / .shared_stream).
class PortedAirflowTrigger(BaseEventTrigger):
    def __init__(self, directory: str, pattern: str = "*") -> None:
        super().__init__()
        self.directory = directory
        self.pattern = pattern

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"directory": self.directory, "pattern": self.pattern},
        )

    def shared_stream_key(self) -> Hashable:
        return ("dir", self.directory)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        for name in ["a.csv", "b.txt", "c.csv"]:
            yield {"directory": kwargs["directory"], "name": name}
        await asyncio.Event().wait()

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            if self.pattern == "*" or raw["name"].endswith(self.pattern.lstrip("*")):
                yield TriggerEvent(raw)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({})

    async def cleanup(self) -> None:
        self.log.info("cleaned up")


async def test_ported_airflow_trigger_runs_unchanged() -> None:
    manager = sharedstream.SharedStreamManager()
    csv, everything = PortedAirflowTrigger("/in", "*.csv"), PortedAirflowTrigger("/in")
    assert isinstance(csv, BaseTrigger)

    async def collect(trigger_id: int, trigger: PortedAirflowTrigger, n: int) -> list[str]:
        stream = manager.subscribe(
            trigger_id=trigger_id, trigger=trigger, key=trigger.shared_stream_key()
        )
        names: list[str] = []
        async for event in trigger.filter_shared_stream(stream):
            names.append(event.payload["name"])
            if len(names) == n:
                break
        return names

    results = await asyncio.gather(collect(1, csv, 2), collect(2, everything, 3))
    assert list(results) == [["a.csv", "c.csv"], ["a.csv", "b.txt", "c.csv"]]
    await manager.stop_all()
