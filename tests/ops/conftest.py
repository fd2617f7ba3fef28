"""A real triggerer, in this process, with its operations endpoint on a free loopback port.

``ops_triggerer`` starts :class:`~sharedstream.runtime.triggerer.Triggerer`
on ``tests/ops/held_defs.py`` (two watchers of one in-memory stream, one
holdable) with a real SQLite store, and hands the test an
:class:`OpsClient` that speaks HTTP to it through aiohttp's client.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from opentelemetry.trace import TracerProvider

from sharedstream.runtime.config import load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.definitions import load_definitions
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.store.sqlite import SqliteStore
from sharedstream.testing.fixtures import postgres_database, postgres_url
from sharedstream.testing.memory_broker import MemoryBroker
from tests.ops.held import BROKER, HELD

DEFS = Path(__file__).with_name("held_defs.py")

__all__ = ["postgres_database", "postgres_url"]  # the kit's PostgreSQL fixtures, for these tests


@dataclass
class Answer:
    status: int
    text: str
    headers: Mapping[str, str]


class OpsClient:
    """HTTP to one endpoint; each call is one request on a fresh connection."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def request(self, method: str, path: str, **kwargs: object) -> Answer:
        async with aiohttp.ClientSession() as session, session.request(
            method, self.base + path, timeout=aiohttp.ClientTimeout(total=10), **kwargs  # type: ignore[arg-type]
        ) as response:
            return Answer(response.status, await response.text(), dict(response.headers))

    async def get(self, path: str) -> Answer:
        return await self.request("GET", path)


@dataclass
class Running:
    triggerer: Triggerer
    client: OpsClient
    broker: MemoryBroker


async def start_triggerer(
    workdir: Path, environ: Mapping[str, str] | None = None, store_url: str = "sqlite:///ss.db",
    definitions: Path = DEFS, tracer_provider: TracerProvider | None = None, *,
    extra_toml: str = "",
) -> tuple[Triggerer, asyncio.Task[int]]:
    """Write a config (plus ``extra_toml``), migrate the store, start a triggerer with ``[api]``
    on; wait for it."""
    path = workdir / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url=store_url)
    with path.open("a") as handle:
        handle.write(extra_toml)
    env = {**os.environ, "SHAREDSTREAM__API__ENABLED": "true", "SHAREDSTREAM__API__PORT": "0",
           "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "30",
           "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.2",
           "SHAREDSTREAM__TRIGGERER__JOB_HEARTBEAT_SEC": "0.5", **(environ or {})}
    config = load_config(path, environ=env)
    if store_url.startswith("sqlite"):
        with SqliteStore(config.sqlite_path()) as store:
            store.migrate()
    triggerer = Triggerer(config, load_definitions(definitions), tracer_provider=tracer_provider)
    task = asyncio.create_task(triggerer.run())
    assert triggerer.api is not None
    serving = asyncio.create_task(triggerer.api.serving.wait())
    await asyncio.wait({task, serving}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        serving.cancel()
        raise AssertionError(f"the endpoint did not start: {task.result() if task.done() else ''}")
    return triggerer, task


@pytest.fixture
async def ops_triggerer(tmp_path: Path) -> AsyncIterator[Running]:
    MemoryBroker.forget(BROKER)
    HELD.set()
    triggerer, task = await start_triggerer(tmp_path)
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    host, port = triggerer.api.address
    try:
        yield Running(triggerer, OpsClient(f"http://{host}:{port}"), MemoryBroker.named(BROKER))
    finally:
        HELD.set()
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        MemoryBroker.forget(BROKER)
