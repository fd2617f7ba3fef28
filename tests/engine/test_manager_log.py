"""The manager's own lines are key-value lines, on its default logger or on one it is given.

Airflow's triggerer passes its logger (``SharedStreamManager(log=...)``); a
plain ``logging.Logger`` must still work, though the lines pass key-values.
"""

from __future__ import annotations

import logging

import pytest

from sharedstream import SharedStreamManager
from tests.engine.harness import Feed, FeedTrigger, Runner, eventually
from tests.log_lines import fields_of, text_of


@pytest.mark.parametrize("given", [None, "triggerer.shared_streams"])
async def test_the_manager_logs_a_streams_start_and_stop_as_key_values(
    feed: Feed, caplog: pytest.LogCaptureFixture, given: str | None,
) -> None:
    log = logging.getLogger(given) if given else None
    manager = SharedStreamManager(log=log)
    with caplog.at_level(logging.DEBUG, logger=given or "sharedstream.stream"):
        runner = Runner(manager, FeedTrigger("f", "one"), 7).start()
        feed.push(1)
        await eventually(lambda: len(feed.advanced()) == 1)
        await runner.stop()
    lines = [r for r in caplog.records if r.name == (given or "sharedstream.stream")
             and text_of(r).startswith("shared stream ")]
    assert [text_of(r) for r in lines] == [
        "shared stream started", "shared stream stopped: last subscriber left"]
    key = FeedTrigger("f", "one").shared_stream_key()
    assert all(fields_of(r)["stream"] == manager.stream_name(key) for r in lines)
    assert fields_of(lines[0])["ack_mode"] is True
    await manager.stop_all()
