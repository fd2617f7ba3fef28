"""One name per stream, in a real triggerer's log lines, metrics, status and dead letters.

Real parts: a triggerer in this process (its endpoint over HTTP, its SQLite
store) on ``names_defs.py``: the topic ``orders`` on two memory brokers
(two "clusters"), and the real CLI reading the dead letter back.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sharedstream.engine.names import stream_digest
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.log_lines import fields_of, text_of
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.names_defs import EAST, TOPIC, WEST
from tests.ops.test_endpoint import samples
from tests.ops.test_why import sharedstream

NAMES_DEFS = Path(__file__).with_name("names_defs.py")


class Lines(logging.Handler):
    """Every record of the ``sharedstream`` loggers from the triggerer's start on."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
async def two_clusters(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[tuple[Triggerer, OpsClient, Lines]]:
    for broker in (EAST, WEST):
        MemoryBroker.forget(broker)
    caplog.set_level(logging.DEBUG, "sharedstream.stream")
    lines = Lines()
    logging.getLogger("sharedstream").addHandler(lines)
    triggerer, task = await start_triggerer(tmp_path, definitions=NAMES_DEFS)
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    try:
        yield triggerer, OpsClient("http://{}:{}".format(*triggerer.api.address)), lines
    finally:
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        logging.getLogger("sharedstream").removeHandler(lines)
        for broker in (EAST, WEST):
            MemoryBroker.forget(broker)


async def test_logs_metrics_status_and_dead_letters_name_a_stream_alike(
    two_clusters: tuple[Triggerer, OpsClient, Lines], tmp_path: Path,
) -> None:
    triggerer, client, lines = two_clusters
    MemoryBroker.named(EAST).produce(TOPIC, [b"not json", b'{"ok": 1}'])
    MemoryBroker.named(WEST).produce(TOPIC, [b"anything"])

    async def settled() -> int:
        return triggerer.manager.totals.advanced
    await eventually_async(settled, 3, what="every record advanced")

    # The same topic on two clusters: two names, told apart by their keys' digests only.
    keys = {key[1]: key for key, _group, _members in triggerer.manager.streams()}  # type: ignore[index]
    names = {broker: f"memory {TOPIC} [{stream_digest(keys[broker])}]" for broker in (EAST, WEST)}
    assert len(set(names.values())) == 2

    started = {fields_of(r)["stream"] for r in lines.records
               if r.name == "sharedstream.stream" and text_of(r) == "shared stream started"}
    assert started == set(names.values())

    status = json.loads((await client.get("/status")).text)
    assert {s["stream"] for s in status["streams"]} == set(names.values())
    assert {s["broker"] for s in status["streams"]} == {"memory"}
    found = samples((await client.get("/metrics")).text)
    assert {s.labels["stream"] for s in found["sharedstream_stream_up"]} == set(names.values())
    assert {s.labels["stream"] for s in found["sharedstream_watcher_raw_events_total"]} == set(
        names.values())

    # The east watcher rejected "not json"; with no dead-letter stream it is kept in the store.
    (letter,) = status["dead_letters"]
    assert letter["stream"] == names[EAST]
    (kept,) = [r for r in lines.records if text_of(r).startswith("kept a dead letter")]
    assert fields_of(kept)["stream"] == names[EAST]
    code, out, err = await sharedstream(tmp_path, "deadletters", "list", "--json",
                                        "--stream", names[EAST])
    assert (code, err) == (0, "")
    assert [row["stream"] for row in json.loads(out)] == [names[EAST]]

    # Nothing of the key itself (the broker's name stands in for a cluster's address).
    for name in names.values():
        assert EAST not in name
        assert WEST not in name
