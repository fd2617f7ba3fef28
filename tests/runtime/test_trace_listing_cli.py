"""``events list`` and ``runs list`` carry the stored trace context in their ``--json``
records (key ``trace_parent``), in process, on a real SQLite file; the tables do not show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharedstream.runtime.cli import main
from sharedstream.runtime.serde import pack_event_payload
from sharedstream.store import DagSpec, PendingEvent, SqliteStore, TriggerSpec, WatcherSpec

TRACED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "meta.db"
    with SqliteStore(db) as store:
        store.migrate()
        (trigger_id,) = store.sync_definitions(
            [TriggerSpec("fp", "pkg.T", b"kw")], [WatcherSpec("orders", "w", "fp")],
            [DagSpec("ship", {"asset": "orders"})]).values()
        payload = pack_event_payload({"id": 1})
        store.write_events([PendingEvent(trigger_id, "k1", payload, TRACED),
                            PendingEvent(trigger_id, "k2", payload)])
    monkeypatch.setenv("SHAREDSTREAM__STORE__URL", f"sqlite:///{db}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def listed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.usefixtures("workdir")
def test_json_records_have_the_trace_parent(capsys: pytest.CaptureFixture[str]) -> None:
    events = json.loads(listed(capsys, "events", "list", "--json"))
    assert [(e["key"], e["trace_parent"]) for e in events] == [("k2", None), ("k1", TRACED)]
    runs = json.loads(listed(capsys, "runs", "list", "--json"))
    assert [(r["run_id"], r["trace_parent"]) for r in runs] == [
        ("asset_triggered__000000000002", None), ("asset_triggered__000000000001", TRACED)]
    assert "TRACE" not in listed(capsys, "events", "list") + listed(capsys, "runs", "list")
