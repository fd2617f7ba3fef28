"""Settling Service Bus messages: turns on a link, failures returned, one report line."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.producers._servicebus_settle import (
    LinkTurns,
    report_failures,
    said,
    settle_each,
)
from sharedstream.producers._servicebus_types import ServiceBusMessage, ServiceBusPayload


def _payload(number: int, receiver: object) -> ServiceBusPayload:
    message = ServiceBusMessage("q", sequence_number=number, body=b"")
    return ServiceBusPayload(("message", number), message, object(), receiver)


class _Settler:
    """Records how many settlements run at once, per receiver and overall; fails some."""

    def __init__(self, failing: set[int]) -> None:
        self.failing = failing
        self.running: dict[int, int] = {}
        self.most: dict[int, int] = {}
        self.most_overall = 0
        self.done: list[int] = []

    async def __call__(self, payload: ServiceBusPayload) -> None:
        key = id(payload.receiver)
        self.running[key] = self.running.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.running[key])
        self.most_overall = max(self.most_overall, sum(self.running.values()))
        try:
            await asyncio.sleep(0.001)
            if payload.message.sequence_number in self.failing:
                raise RuntimeError(f"lock lost for {payload.message.sequence_number}")
            self.done.append(payload.message.sequence_number)
        finally:
            self.running[key] -= 1


async def test_in_turn_settles_one_at_a_time_per_link_and_returns_the_failures() -> None:
    first, second = object(), object()
    payloads = [_payload(n, first if n % 2 else second) for n in range(1, 9)]
    settler, calls, turns = _Settler({3, 6}), BrokerCalls("servicebus"), LinkTurns()
    failed = await settle_each("Complete", payloads, settler, calls=calls, turns=turns,
                               concurrency=4, in_turn=True)
    assert sorted(p.message.sequence_number for p, _ in failed) == [3, 6]
    assert all(isinstance(exc, RuntimeError) for _, exc in failed)
    assert sorted(settler.done) == [1, 2, 4, 5, 7, 8]
    assert set(settler.most.values()) == {1}
    assert calls["Complete"] == 8


async def test_a_settlement_waits_for_the_receive_holding_its_link() -> None:
    receiver, settler, turns = object(), _Settler(set()), LinkTurns()
    async with turns.lock(receiver):  # a receive holds the link
        task = asyncio.create_task(settle_each(
            "Complete", [_payload(1, receiver)], settler, calls=BrokerCalls("servicebus"),
            turns=turns, concurrency=4, in_turn=True))
        await asyncio.sleep(0.01)
        assert settler.done == []
    assert await task == []
    assert settler.done == [1]
    turns.drop(receiver)
    turns.drop(receiver)  # dropping twice, or one never locked, is fine
    assert turns.lock(receiver) is turns.lock(receiver)


async def test_otherwise_concurrency_at_a_time_without_the_link() -> None:
    receiver, settler, turns = object(), _Settler({2}), LinkTurns()
    payloads = [_payload(n, receiver) for n in range(1, 11)]
    async with turns.lock(receiver):  # a pending receive does not hold abandons back
        failed = await settle_each("Abandon", payloads, settler, calls=BrokerCalls("sb"),
                                   turns=turns, concurrency=3)
    assert [p.message.sequence_number for p, _ in failed] == [2]
    assert settler.most_overall == 3
    assert len(settler.done) == 9


async def test_a_cancellation_is_raised_not_returned() -> None:
    async def cancelled(_payload: ServiceBusPayload) -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await settle_each("DeadLetter", [_payload(1, object())], cancelled,
                          calls=BrokerCalls("sb"), turns=LinkTurns(), concurrency=2)


def test_failures_are_reported_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    log = key_value_logger("tests.servicebus_settle")
    failed = [(_payload(n, None), f"boom {n % 2}") for n in range(1, 15)]
    with caplog.at_level(logging.INFO, logger="tests.servicebus_settle"):
        report_failures(log, logging.WARNING, "completing did not take", "q", [])
        assert caplog.records == []
        report_failures(log, logging.WARNING, "completing did not take", "q", failed)
    (record,) = caplog.records
    text = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "completing did not take" in text
    assert "count=14" in text
    assert "other_errors=1" in text
    assert "11" not in text.split("sequence_numbers=")[1].split("error=")[0]  # the first ten


def test_said_is_the_type_and_the_first_line() -> None:
    assert said(RuntimeError("lock lost\nsecond line")) == "RuntimeError: lock lost"
    assert said(TimeoutError()) == "TimeoutError"
    assert said(ValueError("x" * 300)) == "ValueError: " + "x" * 200
