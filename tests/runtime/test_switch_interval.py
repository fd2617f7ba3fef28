"""The triggerer lowers Python's thread switch interval while it runs, then restores it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

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


@pytest.mark.parametrize(("option", "while_running"), [("0.5", 0.0005), ("0", None)])
async def test_the_switch_interval_is_set_while_running_and_restored(
    tmp_path: Path, option: str, while_running: float | None
) -> None:
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///ss.db")
    config = load_config(path, environ={**os.environ,
                                        "SHAREDSTREAM__STORE__SWITCH_INTERVAL_MS": option})
    with SqliteStore(config.sqlite_path()) as store:  # what `sharedstream init` does
        store.migrate()
    (tmp_path / "defs.py").write_text(DEFINITIONS)
    triggerer = Triggerer(config, load_definitions(tmp_path / "defs.py"))
    before = sys.getswitchinterval()
    expected = before if while_running is None else while_running
    task = asyncio.create_task(triggerer.run())
    try:
        await eventually(lambda: sys.getswitchinterval() == pytest.approx(expected))
        await asyncio.sleep(0.1)  # running: registered, supervising its trigger
        assert not task.done()
        assert sys.getswitchinterval() == pytest.approx(expected)
    finally:
        triggerer.request_stop()
        await task
    assert sys.getswitchinterval() == before
