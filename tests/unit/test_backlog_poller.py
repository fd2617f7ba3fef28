"""The backlog poller: readings per stream, ``n/a`` apart from ``unknown``, failures logged once.

Pure logic over stand-in groups (the real thing runs in tests/ops/test_backlog.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Any

import pytest

from sharedstream.engine.errors import BacklogUnavailable
from sharedstream.engine.producer import BrokerBacklog
from sharedstream.runtime.ops_backlog import BacklogPoller, BacklogReading
from sharedstream.runtime.ops_view import backlog_record


class Group:
    """A live group whose backlog answer the test sets."""

    def __init__(self, answer: BrokerBacklog | BaseException | None = None) -> None:
        self.answer: BrokerBacklog | BaseException | None = answer
        self.asked = 0

    async def broker_backlog(self) -> BrokerBacklog:
        self.asked += 1
        if self.answer is None:
            await asyncio.Event().wait()  # never answers
        if isinstance(self.answer, BaseException):
            raise self.answer
        assert self.answer is not None
        return self.answer


class Streams:
    """What ``SharedStreamManager.streams()`` returns, settable."""

    def __init__(self) -> None:
        self.groups: dict[Hashable, Group | None] = {}

    def streams(self) -> list[tuple[Hashable, Any, list[Hashable]]]:
        return [(key, group, []) for key, group in self.groups.items()]


def poller(streams: Streams, **kwargs: Any) -> BacklogPoller:
    return BacklogPoller(streams, interval=60, **kwargs)  # type: ignore[arg-type]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "sharedstream.runtime.backlog" and r.levelno == logging.WARNING]


async def test_an_answer_is_kept_per_stream_and_a_stream_not_asked_is_pending() -> None:
    streams = Streams()
    streams.groups["a"] = Group({"orders/0": {"lag": 3}})
    p = poller(streams, clock=lambda: 100.0)
    assert p.reading("a").state == "pending"
    await p.poll_once()
    assert p.reading("a") == BacklogReading("ok", {"orders/0": {"lag": 3}}, at=100.0)
    assert backlog_record(p.reading("a"), 102.5) == {
        "state": "ok", "lanes": [{"lane": "orders/0", "lag": 3}], "detail": "",
        "age_seconds": 2.5}
    assert backlog_record(p.reading("other"), 102.5)["age_seconds"] is None


async def test_a_broker_that_cannot_tell_is_na_never_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "sharedstream.runtime.backlog")
    streams = Streams()
    streams.groups["p"] = Group(BacklogUnavailable("the Pub/Sub API gives no backlog"))
    p = poller(streams)
    for _ in range(3):
        await p.poll_once()
    reading = p.reading("p")
    assert (reading.state, dict(reading.lanes), reading.detail) == (
        "n/a", {}, "the Pub/Sub API gives no backlog")
    assert warnings(caplog) == []
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert infos[0].startswith("broker backlog not available")


async def test_failures_show_unknown_and_are_logged_once_until_they_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "sharedstream.runtime.backlog")
    streams = Streams()
    group = Group({"q": {"visible": 2}})
    streams.groups["s"] = group
    p = poller(streams, label=lambda key: f"sqs:{key}")
    await p.poll_once()
    group.answer = ConnectionError("refused")
    for _ in range(5):
        await p.poll_once()
    reading = p.reading("s")
    assert (reading.state, dict(reading.lanes)) == ("unknown", {})  # not the old numbers
    assert reading.detail == "ConnectionError: refused"
    assert len(warnings(caplog)) == 1
    assert "stream=sqs:s" in warnings(caplog)[0]
    group.answer = TimeoutError()  # another kind of failure: said once more
    await p.poll_once()
    await p.poll_once()
    assert len(warnings(caplog)) == 2
    group.answer = {"q": {"visible": 0}}
    await p.poll_once()
    assert p.reading("s").state == "ok"
    assert caplog.records[-1].getMessage().startswith("broker backlog answers again")


async def test_a_call_that_hangs_is_bounded_and_a_restarting_stream_is_unknown() -> None:
    streams = Streams()
    streams.groups["slow"] = Group(None)
    streams.groups["down"] = None
    streams.groups["fine"] = Group({"t/0": {"lag": 0}})
    p = poller(streams, timeout=0.05)
    async with asyncio.timeout(5):
        await p.poll_once()
    assert p.reading("slow").detail == "no answer within 0.05s"
    assert (p.reading("down").state, p.reading("down").detail) == (
        "unknown", "the stream's poll is restarting")
    assert p.reading("fine").state == "ok"  # the hung one held nobody up


async def test_streams_no_longer_in_use_are_forgotten() -> None:
    streams = Streams()
    streams.groups["gone"] = Group({"x": {"lag": 1}})
    p = poller(streams)
    await p.poll_once()
    del streams.groups["gone"]
    await p.poll_once()
    assert p.reading("gone").state == "pending"
    assert p.polls == 2
