"""An SDK close that never returns is given up after ``CLOSE_TIMEOUT``; what it awaited ends.

azure-servicebus 7.15 can wait forever on a receiver's keep-alive task in
``close()`` (see ``CLOSE_TIMEOUT``); a stopping stream must not wait with it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from sharedstream.producers import servicebus
from sharedstream.producers.servicebus import ServiceBusSettings, ServiceBusSharedStreamProducer

pytest.importorskip("azure.servicebus")


async def test_a_close_that_never_returns_is_given_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(servicebus, "CLOSE_TIMEOUT", 0.2)
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string="Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;"
                          "SharedAccessKey=v;UseDevelopmentEmulator=true", queue="q"))
    keep_alive = asyncio.create_task(asyncio.sleep(3600))  # the SDK's task, awaited by its close

    async def close() -> None:
        await keep_alive

    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="sharedstream"):
        await producer._close("session receiver", close)
    assert time.monotonic() - began < 2
    assert keep_alive.cancelled()
    assert "closing the SDK's handle did not finish; given up" in caplog.text
    assert "session receiver" in caplog.text


async def test_a_close_that_returns_is_awaited() -> None:
    producer = ServiceBusSharedStreamProducer(ServiceBusSettings(
        connection_string="Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;"
                          "SharedAccessKey=v;UseDevelopmentEmulator=true", queue="q"))
    closed: list[str] = []

    async def close() -> None:
        await asyncio.sleep(0.05)
        closed.append("done")

    await producer._close("receiver", close)
    assert closed == ["done"]
