"""A trigger that works again stops showing its old error.

A real triggerer (in this process, so the test can shorten how long
"running cleanly" must last) on a real SQLite store runs one standalone
trigger whose first run fails, like a broker that was away; the second
run keeps going. Once it has run ``stable_after`` seconds the store no
longer holds the error's text (``LAST_ERROR`` of ``triggers list``); the
count and the time of the last error stay.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sharedstream.runtime.config import load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.definitions import load_definitions
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.store import TriggerRow
from sharedstream.store.sqlite import SqliteStore
from tests.engine.harness import eventually

DEFINITIONS = '''
import asyncio
from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher


class FailsFirst(BaseEventTrigger):
    runs = 0

    def serialize(self):
        return (f"{type(self).__module__}.{type(self).__qualname__}", {})

    async def run(self):
        type(self).runs += 1
        if type(self).runs == 1:
            raise ConnectionError("broker away")
        await asyncio.sleep(3600)
        yield TriggerEvent(None)


Asset("flaky", watchers=[AssetWatcher("w", trigger=FailsFirst())])
'''


async def test_an_error_is_cleared_once_the_trigger_ran_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///ss.db")
    config = load_config(path, environ={
        **os.environ, "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.1",
        "SHAREDSTREAM__TRIGGERER__JOB_HEARTBEAT_SEC": "0.2"})
    with SqliteStore(config.sqlite_path()) as store:
        store.migrate()
    (tmp_path / "defs.py").write_text(DEFINITIONS)
    triggerer = Triggerer(config, load_definitions(tmp_path / "defs.py"))
    triggerer.supervisor.stable_after = 0.5

    def trigger() -> TriggerRow | None:
        with SqliteStore(config.sqlite_path()) as store:
            rows = store.list_triggers()
        return rows[0] if rows else None

    def errors() -> tuple[int, str | None] | None:
        row = trigger()
        return None if row is None else (row.error_count, row.last_error)

    task = asyncio.create_task(triggerer.run())
    try:
        await eventually(lambda: errors() == (1, "ConnectionError: broker away"), within=10)
        await eventually(lambda: errors() == (1, None), within=10)
    finally:
        triggerer.request_stop()
        await task
    row = trigger()
    assert row is not None
    assert (row.state, row.error_count, row.last_traceback) == ("active", 1, None)
    assert row.last_error_at is not None
