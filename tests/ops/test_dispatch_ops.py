"""Dispatching seen from the operations endpoint: a target that is down fails ``/readyz``,
shows in ``/status`` and ``/metrics`` with its runs waiting, and ingestion goes on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sharedstream.testing.brokers import free_port
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.held import BROKER, STREAM
from tests.ops.test_endpoint import samples, value

DEFS = Path(__file__).with_name("dispatch_defs.py")
HOOKS = """
[targets.hooks]
type = "webhook"
conn_id = "hooks"
max_attempts = 1000
retry_backoff_initial = 0.05
retry_backoff_max = 0.1
timeout = 2
"""


async def test_a_target_that_is_down_shows_everywhere_and_ingestion_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = free_port()  # nothing listens there: every delivery is refused
    monkeypatch.setenv("SHAREDSTREAM_CONN_HOOKS", f"http://127.0.0.1:{closed}")
    MemoryBroker.forget(BROKER)
    triggerer, task = await start_triggerer(
        tmp_path, environ={"SHAREDSTREAM__DISPATCH__FOLLOW_INTERVAL": "0.2",
                           "SHAREDSTREAM__DISPATCH__POLL_INTERVAL": "0.1"},
        definitions=DEFS, extra_toml=HOOKS)
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    host, port = triggerer.api.address
    client = OpsClient(f"http://{host}:{port}")
    broker = MemoryBroker.named(BROKER)
    try:
        broker.produce(STREAM, [b"1", b"2", b"3"])

        async def readiness() -> str:
            answer = await client.get("/readyz")
            return f"{answer.status} {answer.text}"

        async def down() -> bool:
            return "dispatch: FAILED - hooks: " in await readiness()

        await eventually_async(down, True, within=20, what="the dispatch check failing")
        text = await readiness()
        assert text.startswith("503 ")
        assert f"POST http://127.0.0.1:{closed}" in text
        assert text.rstrip().endswith("(runs wait in the store)")

        async def waiting() -> tuple[float, int]:  # hooks' runs (queued or between attempts)
            found = samples((await client.get("/metrics")).text)
            counted = sum(s.value for s in found.get("sharedstream_dag_runs", [])
                          if s.labels["target"] == "hooks")
            status = json.loads((await client.get("/status")).text)
            hooks: dict[str, int] = next(
                (t for t in status["dispatch"] if t["target"] == "hooks"), {})
            return counted, hooks.get("queued", 0) + hooks.get("dispatching", 0)

        await eventually_async(waiting, (3.0, 3), within=20, what="hooks' runs counted")
        found = samples((await client.get("/metrics")).text)
        assert value(found, "sharedstream_dispatch_attempts_total", target="local",
                     outcome="succeeded") == 3
        assert value(found, "sharedstream_dispatch_target_failing", target="hooks") == 1
        assert value(found, "sharedstream_dispatch_target_failing", target="local") == 0
        assert value(found, "sharedstream_dispatch_latency_seconds_count", target="local") == 3
        assert value(found, "sharedstream_dispatch_errors_total", target="hooks") >= 3

        status = json.loads((await client.get("/status")).text)
        by_target = {t["target"]: t for t in status["dispatch"]}
        assert by_target["hooks"]["failing"] is True
        assert by_target["hooks"]["last_error"].startswith(f"POST http://127.0.0.1:{closed}")
        assert by_target["local"]["succeeded"] == 3
        assert status["ready"]["dispatch"]["ok"] is False

        broker.produce(STREAM, [b"4", b"5"])  # the broker's work goes on while hooks is down
        await eventually_async(lambda: asyncio.sleep(0, triggerer.gate.stored), 5,
                               within=20, what="new events stored")
    finally:
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        MemoryBroker.forget(BROKER)
