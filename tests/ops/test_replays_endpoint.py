"""Replays through the operations endpoint: asked for, refused, listed, in /status and /metrics.

The triggerer here reads the testing kit's in-memory broker, which cannot
replay: an asked-for replay is claimed at once (the POST wakes the replay
loop) and fails with the one line saying so - the path every broker without
replay takes. Kafka's replays themselves are in ``tests/kafka/test_replay.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, Running, start_triggerer
from tests.ops.held import BROKER, HELD


async def test_posting_a_replay_is_refused_unless_the_option_is_on(ops_triggerer: Running) -> None:
    client = ops_triggerer.client
    answer = await client.request("POST", "/replays", json={"watcher": "free/fast", "from": "1h"})
    assert (answer.status, answer.text) == (
        403, "replays through the endpoint are off: set [api] replays = true\n")
    assert (await client.request("POST", "/replays/1/cancel")).status == 403
    listed = await client.get("/replays")
    assert (listed.status, json.loads(listed.text)) == (200, [])


async def test_a_replay_asked_for_over_http_runs_and_a_broker_without_replay_says_so(
    tmp_path: Path,
) -> None:
    MemoryBroker.forget(BROKER)
    HELD.set()
    triggerer, task = await start_triggerer(tmp_path, {"SHAREDSTREAM__API__REPLAYS": "true"})
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    host, port = triggerer.api.address
    client = OpsClient(f"http://{host}:{port}")
    try:
        bad = await client.request("POST", "/replays", json={"watcher": "free/fast"})
        assert bad.status == 400
        assert bad.text.startswith("expected {"), bad.text
        unknown = await client.request("POST", "/replays",
                                       json={"watcher": "free/fats", "from": "1h"})
        assert (unknown.status, unknown.text) == (
            400, "no watcher 'free/fats'; did you mean 'free/fast'?\n")
        when = await client.request("POST", "/replays", json={"watcher": "fast", "from": "soon"})
        assert when.status == 400
        assert "--from 'soon' is not a time" in when.text

        asked = await client.request("POST", "/replays",
                                     json={"watcher": "fast", "from": "0:0", "to": "1h"})
        assert asked.status == 201, asked.text
        replay = json.loads(asked.text)
        assert (replay["id"], replay["watcher"], replay["request"]) == (
            1, "free/fast", {"offsets": {"0": 0}, "to": replay["request"]["to"]})

        async def ended() -> bool:
            rows = json.loads((await client.get("/replays")).text)
            return bool(rows[0]["state"] == "failed")
        await eventually_async(ended, True, within=10, what="the replay ended")
        (row,) = json.loads((await client.get("/replays")).text)
        assert row["error"].startswith("ReplayError: memory "), row["error"]
        assert row["error"].endswith(
            "this broker cannot replay a watcher (Kafka can; for SQS and Service Bus, replay "
            "the dead letters the watcher caused: --dead-letters)"), row["error"]
        status = json.loads((await client.get("/status")).text)
        assert [r["id"] for r in status["replays"]] == [1]
        again = await client.request("POST", "/replays/1/cancel")
        assert (again.status, again.text) == (409, "replay 1 already ended: failed\n")
        assert (await client.request("POST", "/replays/7/cancel")).status == 404
        metrics = (await client.get("/metrics")).text
        assert "# TYPE sharedstream_replay_messages gauge" in metrics

        mixed = await client.request("POST", "/replays", json={
            "watcher": "fast", "dead_letters": True, "from": "1h"})
        assert mixed.status == 400, mixed.text
        letters = await client.request("POST", "/replays",
                                       json={"watcher": "fast", "dead_letters": True})
        assert letters.status == 201, letters.text
        assert json.loads(letters.text)["request"] == {"dead_letters": True}

        async def second_ended() -> bool:
            rows = json.loads((await client.get("/replays")).text)
            return bool(rows[0]["state"] == "failed")
        await eventually_async(second_ended, True, within=10, what="the second replay ended")
        latest = json.loads((await client.get("/replays")).text)[0]
        assert latest["error"].startswith("ReplayError: memory "), latest["error"]
        assert latest["error"].endswith(
            "this broker cannot rebuild a dead letter as a message (SQS and Service Bus can; "
            "Kafka replays --from a time or offsets)"), latest["error"]
    finally:
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        MemoryBroker.forget(BROKER)
