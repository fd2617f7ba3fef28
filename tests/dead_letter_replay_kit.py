"""What the dead-letter replay tests of SQS and Service Bus share: reading the store, the CLI.

Both run two watchers (``orders/all``, ``audit/all``) of one queue through a
real triggerer and a SQLite store, and replay ``audit/all``'s dead letters
with ``sharedstream watchers replay audit/all --dead-letters``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from sharedstream.runtime.serde import unpack_event_payload
from tests.cli import TriggererCli

__all__ = ["counts", "events", "replay", "trigger_of"]


def _read(database: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)


def events(database: Path) -> dict[str, dict[str, Any]]:
    """Stored events by asset, then idempotency key: their payloads."""
    found: dict[str, dict[str, Any]] = {}
    with _read(database) as db:
        for asset, key, payload in db.execute(
                "SELECT a.name, t.idem_key, t.payload FROM trigger_events t"
                " JOIN asset_events e ON e.trigger_event_id = t.id"
                " JOIN assets a ON a.id = e.asset_id"):
            found.setdefault(asset, {})[key] = unpack_event_payload(payload)
    return found


def counts(database: Path) -> tuple[dict[str, int], dict[str, int], int]:
    """Events per asset, DAG runs per DAG, dead letters kept in the store."""
    with _read(database) as db:
        per_asset = dict(db.execute(
            "SELECT a.name, count(*) FROM asset_events e JOIN assets a ON a.id = e.asset_id"
            " GROUP BY a.name").fetchall())
        runs = dict(db.execute("SELECT dag_id, count(*) FROM dag_runs GROUP BY dag_id"))
        letters = db.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    return per_asset, runs, int(letters)


def trigger_of(database: Path, asset: str) -> int:
    """The trigger id of ``asset``'s (one) watcher."""
    with _read(database) as db:
        (trigger_id,) = db.execute(
            "SELECT w.trigger_id FROM watchers w JOIN assets a ON a.id = w.asset_id"
            " WHERE a.name = ?", (asset,)).fetchone()
    return int(trigger_id)


def replay(cli: TriggererCli, *args: str) -> subprocess.CompletedProcess[str]:
    """``sharedstream watchers replay ...``, followed to its end."""
    return subprocess.run(
        [sys.executable, "-m", "sharedstream", "--config", str(cli.config), "watchers",
         "replay", *args], cwd=cli.dir, env=cli.env, capture_output=True, text=True,
        timeout=90, check=False)
