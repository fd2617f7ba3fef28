"""The SQLite store's WAL checkpoints run on their own thread, not in the writer's commits."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import patch

import pytest

from sharedstream.store import SqliteStore
from sharedstream.store import sqlite as sqlite_store
from sharedstream.store._sqlite_checkpoints import BACKSTOP_PAGES, Checkpointer
from tests.store.test_store import asset, define, ev

BATCH = 500


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "meta.db") as s:
        s.migrate()
        yield s


def _write(store: SqliteStore, trigger_id: int, first: int) -> None:
    store.write_events([ev(trigger_id, f"k{first + n}", b'{"n": 1}') for n in range(BATCH)])


def _checkpointer(store: SqliteStore) -> Checkpointer:
    checkpointer = store._checkpointer
    assert checkpointer is not None, "write_events did not start the checkpoint thread"
    return checkpointer


def _wait_for_checkpoints(checkpointer: Checkpointer, count: int) -> None:
    deadline = time.monotonic() + 10
    while checkpointer.checkpoints < count:
        assert time.monotonic() < deadline, f"{checkpointer.checkpoints} checkpoints, not {count}"
        time.sleep(0.005)


def _writer_autocheckpoint(store: SqliteStore) -> int:
    (row,) = store._read("PRAGMA wal_autocheckpoint")
    return int(row[0])


def test_the_thread_keeps_the_log_short(store: SqliteStore, tmp_path: Path) -> None:
    """Each batch's frames are copied back, so the log restarts instead of growing.

    The writer's own checkpoint waits for BACKSTOP_PAGES (40 MB), so without
    the thread twenty batches would leave a log twenty batches long.
    """
    ids = define(store, {"t": ["a"]}, {"d": asset("a")})
    wal = tmp_path / "meta.db-wal"
    _write(store, ids["t"], 0)
    checkpointer = _checkpointer(store)
    assert _writer_autocheckpoint(store) == BACKSTOP_PAGES
    _wait_for_checkpoints(checkpointer, 1)
    one_batch = wal.stat().st_size
    for n in range(1, 20):
        _write(store, ids["t"], n * BATCH)
        _wait_for_checkpoints(checkpointer, n + 1)
    assert wal.stat().st_size < 3 * one_batch
    assert store.counts()["trigger_events"] == 20 * BATCH


def test_close_stops_the_thread(store: SqliteStore) -> None:
    ids = define(store, {"t": ["a"]}, {})
    _write(store, ids["t"], 0)
    thread = _checkpointer(store)._thread
    assert thread.daemon
    assert thread.is_alive()
    store.close()
    assert not thread.is_alive()
    store.close()  # idempotent


@pytest.mark.parametrize("refused", [
    sqlite3.OperationalError("unable to open database file"),
    RuntimeError("can't start new thread"),
])
def test_without_the_thread_the_writer_checkpoints_as_before(
    store: SqliteStore, caplog: pytest.LogCaptureFixture, refused: Exception
) -> None:
    """A thread that cannot start costs nothing but the speed: the batch is stored, once."""
    ids = define(store, {"t": ["a"]}, {})
    with patch.object(sqlite_store, "Checkpointer", side_effect=refused) as started, \
            caplog.at_level(logging.WARNING, logger="sharedstream.store"):
        _write(store, ids["t"], 0)
        _write(store, ids["t"], BATCH)
    assert started.call_count == 1  # tried once, not per batch
    assert store.counts()["trigger_events"] == 2 * BATCH
    assert store._checkpointer is None
    assert _writer_autocheckpoint(store) == 1000  # SQLite's default, untouched
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "WAL checkpoints stay in the writer's commits" in warnings[0]
    assert str(refused) in warnings[0]


def test_the_thread_opens_the_writer_s_file_wherever_the_process_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened by a relative path keeps checkpointing its own file after a chdir."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    with SqliteStore(Path("meta.db")) as relative:
        relative.migrate()
        ids = define(relative, {"t": ["a"]}, {})
        monkeypatch.chdir(tmp_path / "elsewhere")
        _write(relative, ids["t"], 0)
        checkpointer = _checkpointer(relative)
        _wait_for_checkpoints(checkpointer, 1)
        files = [row[2] for row in checkpointer._conn.execute("PRAGMA database_list")]
        assert files == [str(tmp_path / "meta.db")]
    assert not (tmp_path / "elsewhere" / "meta.db").exists()
