"""Why a watcher fired or not: raw events seen and skipped, events emitted, rejections."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sharedstream.runtime.cli_output import time_text
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.held import BROKER
from tests.ops.test_endpoint import samples, value

WHY_DEFS = Path(__file__).with_name("why_defs.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def why_triggerer(tmp_path: Path) -> AsyncIterator[tuple[Triggerer, OpsClient]]:
    MemoryBroker.forget(BROKER)
    triggerer, task = await start_triggerer(tmp_path, definitions=WHY_DEFS)
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    try:
        yield triggerer, OpsClient("http://{}:{}".format(*triggerer.api.address))
    finally:
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        MemoryBroker.forget(BROKER)


async def test_counts_say_why_each_watcher_fired_or_not(
    why_triggerer: tuple[Triggerer, OpsClient],
) -> None:
    triggerer, client = why_triggerer
    records = [b'{"kind": "order"}', b'{"kind": "refund"}', b"not json", b'{"kind": "order"}']
    MemoryBroker.named(BROKER).produce("mixed", records)

    async def settled() -> int:
        return triggerer.manager.totals.advanced
    await eventually_async(settled, 4, what="every record advanced")
    found = samples((await client.get("/metrics")).text)

    def count(name: str, watcher: str) -> float:
        return value(found, f"sharedstream_watcher_{name}_total", watchers=watcher)

    # The refund never reaches the orders filter: its prefilter (from match) declines it; the
    # value that is not JSON passes every prefilter, and the filter rejects it.
    assert [count(n, "orders/json")
            for n in ("raw_events", "skipped", "emitted", "rejected", "failed")] == [4, 1, 2, 1, 0]
    assert [count(n, "everything/raw")
            for n in ("raw_events", "skipped", "emitted", "rejected")] == [4, 0, 4, 0]
    status = json.loads((await client.get("/status")).text)
    (stream,) = status["streams"]
    json_watcher = next(w for w in stream["watchers"] if w["names"] == ["orders/json"])
    assert (json_watcher["skipped"], json_watcher["rejected"]) == (1, 1)
    assert json_watcher["last_reject"].startswith("undecodable json value: ")
    (letter,) = status["dead_letters"]  # no dead-letter stream: kept in the store
    assert letter["reason"].endswith(json_watcher["last_reject"])
    assert set(letter) == {"id", "at", "stream", "source", "reason", "triggers", "size"}
    assert value(found, "sharedstream_dead_letter_fallbacks_total") == 1
    stored = {tuple(w["names"]): w["events_stored"] for w in status["watchers"]}
    assert stored == {("orders/json",): 2, ("everything/raw",): 4}


async def sharedstream(workdir: Path, *args: str, env: dict[str, str] | None = None
                       ) -> tuple[int, str, str]:
    """Run the real CLI without blocking this loop (the triggerer under test runs on it)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sharedstream", "--config", str(workdir / "sharedstream.toml"),
        *args, cwd=workdir, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_status_command_reads_the_endpoint_or_else_the_store(
    why_triggerer: tuple[Triggerer, OpsClient], tmp_path: Path,
) -> None:
    triggerer, client = why_triggerer
    MemoryBroker.named(BROKER).produce("mixed", [b'{"kind": "order"}', b"not json"])

    async def settled() -> int:
        return triggerer.manager.totals.advanced
    await eventually_async(settled, 2, what="every record advanced")
    code, out, err = await sharedstream(tmp_path, "status", "--url", client.base, "--json")
    assert (code, err) == (0, "")
    live = json.loads(out)
    assert live["source"] == f"endpoint {client.base}"
    assert live["ready"]["store"]["ok"] is True
    (stream,) = live["streams"]
    assert {tuple(w["names"]): (w["seen"], w["skipped"], w["emitted"], w["rejected"])
            for w in stream["watchers"]} == {("orders/json",): (2, 0, 1, 1),
                                             ("everything/raw",): (2, 0, 2, 0)}
    code, out, err = await sharedstream(tmp_path, "status", "--url", client.base)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"source: endpoint {client.base}"
    assert lines[1] == "ready: yes"
    assert "LIVE WATCHERS" in lines
    json_row = next(line for line in lines if "orders/json" in line and "undecodable" in line)
    # stream (its name: "memory mixed"), watchers, queued seen skipped emitted rejected failed
    assert json_row.startswith("  " + stream["stream"] + " ")
    assert json_row.removeprefix("  " + stream["stream"]).split()[1:7] == [
        "0", "2", "0", "1", "1", "0"]
    (letter,) = live["dead_letters"]
    letter_row = next(line for line in lines if letter["source"] in line)
    assert time_text(letter["at"]) in letter_row  # "2026-11-28 12:42:44 UTC", as the CLI's tables

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = await sharedstream(
        tmp_path, "status", "--json",
        env={"SHAREDSTREAM__API__ENABLED": "true", "SHAREDSTREAM__API__PORT": str(port)})
    assert code == 0
    assert err.startswith(f"sharedstream: the endpoint http://127.0.0.1:{port} did not answer (")
    assert err.rstrip().endswith("reading the store instead")
    stored = json.loads(out)
    assert stored["source"].startswith("store sqlite:///")
    assert "ready" not in stored
    assert stored["streams"] == []
    assert {tuple(w["names"]): w["events_stored"] for w in stored["watchers"]} == {
        ("orders/json",): 1, ("everything/raw",): 2}
    (me,) = stored["triggerers"]
    assert me["id"] == triggerer.triggerer_id
    assert me["alive"] is True
