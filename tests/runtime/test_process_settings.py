"""Process-wide settings a triggerer changes while it runs, then restores.

Python's thread switch interval (``[store] switch_interval_ms``) and the
garbage collector's young-generation threshold
(``[triggerer] gc_gen0_threshold``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.config import load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.definitions import load_definitions
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.store.sqlite import SqliteStore
from tests.engine.harness import eventually

DEFINITIONS = """
from datetime import datetime, timedelta, timezone
from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.temporal import DateTimeTrigger

later = datetime.now(timezone.utc) + timedelta(days=1)
tomorrow = Asset("tomorrow", watchers=[AssetWatcher("w", trigger=DateTimeTrigger(moment=later))])
"""


async def run_and_watch(
    tmp_path: Path, environ: Mapping[str, str], read: Callable[[], Any], while_running: Any,
) -> Any:
    """Start a triggerer with ``environ``; check ``read()`` while it runs; what it was before."""
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///ss.db")
    config = load_config(path, environ={**os.environ, **environ})
    with SqliteStore(config.sqlite_path()) as store:  # what `sharedstream init` does
        store.migrate()
    (tmp_path / "defs.py").write_text(DEFINITIONS)
    triggerer = Triggerer(config, load_definitions(tmp_path / "defs.py"))
    before = read()
    expected = before if while_running is None else while_running
    task = asyncio.create_task(triggerer.run())
    try:
        await eventually(lambda: read() == expected)
        await asyncio.sleep(0.1)  # running: registered, supervising its trigger
        assert not task.done()
        assert read() == expected
    finally:
        triggerer.request_stop()
        await task
    return before


@pytest.mark.parametrize(("option", "while_running"), [("0.5", 0.0005), ("0", None)])
async def test_the_switch_interval_is_set_while_running_and_restored(
    tmp_path: Path, option: str, while_running: float | None
) -> None:
    before = await run_and_watch(
        tmp_path, {"SHAREDSTREAM__STORE__SWITCH_INTERVAL_MS": option},
        lambda: round(sys.getswitchinterval(), 7), while_running)
    assert round(sys.getswitchinterval(), 7) == before


@pytest.mark.parametrize(("option", "while_running"), [("7000", 7000), ("0", None)])
async def test_the_collector_is_tuned_while_running_and_restored(
    tmp_path: Path, option: str, while_running: int | None
) -> None:
    before = await run_and_watch(
        tmp_path, {"SHAREDSTREAM__TRIGGERER__GC_GEN0_THRESHOLD": option},
        lambda: gc.get_threshold()[0], while_running)
    assert gc.get_threshold()[0] == before
