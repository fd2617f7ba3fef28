"""What the dead-letter replay tests of SQS and Service Bus share: reading the store, the CLI.

Both run two watchers (``orders/all``, ``audit/all``) of one queue through a
real triggerer and a SQLite store, and replay ``audit/all``'s dead letters
with ``sharedstream watchers replay audit/all --dead-letters``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from sharedstream import TriggerEvent, reject_shared_stream_event
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.runtime.serde import unpack_event_payload
from tests.cli import TriggererCli

__all__ = ["PickyFilter", "counts", "events", "replay", "trigger_of", "watched"]


def watched(orders_trigger: Any, audit_trigger: Any) -> tuple[Asset, Dag, Asset, Dag]:
    """``orders`` and ``audit``, each watched (``all``) by its trigger, and a DAG on each."""
    orders = Asset("orders", watchers=[AssetWatcher("all", trigger=orders_trigger)])
    audit = Asset("audit", watchers=[AssetWatcher("all", trigger=audit_trigger)])
    return orders, Dag("on_orders", schedule=orders), audit, Dag("on_audit", schedule=audit)


class PickyFilter:
    """A watcher's filter (mixed into a broker's trigger) that rejects the ids a variable lists.

    Fires one event per JSON message ``{"id": n}``: the id and what
    :meth:`described` says of the message; rejects the messages whose ``id``
    the environment variable :attr:`REJECT` lists (comma-separated; empty:
    none), read when the filter starts.
    """

    REJECT: ClassVar[str] = ""

    def described(self, message: Any) -> dict[str, Any]:
        """What the event holds of ``message`` besides its id (the broker's test says)."""
        raise NotImplementedError

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        refused = {int(i) for i in os.environ.get(self.REJECT, "").split(",") if i}
        async for message in shared_stream:
            value = json.loads(message.body)
            if value["id"] in refused:
                reject_shared_stream_event(f"{self.REJECT} lists id {value['id']}")
                continue
            yield TriggerEvent({"id": value["id"], **self.described(message)})


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
