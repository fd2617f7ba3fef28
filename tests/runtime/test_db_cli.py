"""``sharedstream db upgrade`` and ``db check`` on SQLite and PostgreSQL, and the triggerer on
PostgreSQL end to end (``[store] url = postgresql://...`` through the environment)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from unittest.mock import patch

import pytest

from sharedstream.runtime.cli import main
from sharedstream.store import open_store
from sharedstream.store import sqlite as sqlite_store
from sharedstream.testing.brokers import free_port
from sharedstream.testing.fixtures import postgres_database, postgres_url
from tests.runtime.conftest import Deployment, wait_for
from tests.runtime.test_triggerer_e2e import EXPECTED_RUNS, MESSAGES, run_counts
from tests.store.conftest import LATEST

__all__ = ["postgres_database", "postgres_url"]

URL_ENV = "SHAREDSTREAM__STORE__URL"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty database's URL, also set as ``[store] url`` through the environment."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'meta.db'}"
        open_store(url, create=True).close()  # an empty file, as a new install has
    else:
        url = request.getfixturevalue("postgres_database")
    monkeypatch.setenv(URL_ENV, url)
    monkeypatch.chdir(tmp_path)
    return url


def test_upgrade_then_check(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "db", "check")
    assert code == 2
    assert err.count("\n") == 1
    assert (f"is at schema v0, this sharedstream needs v{LATEST}; run `sharedstream db upgrade`"
            in err)
    code, out, _ = cli(capsys, "db", "upgrade")
    assert (code, out) == (0, f"database {_shown(store_url)}: schema v0 -> v{LATEST}\n")
    code, out, _ = cli(capsys, "db", "upgrade")
    assert (code, out) == (
        0, f"database {_shown(store_url)}: schema v{LATEST}, already up to date\n")
    code, out, _ = cli(capsys, "db", "check")
    assert (code, out) == (
        0, f"database {_shown(store_url)}: reachable, schema v{LATEST} (up to date)\n")


def insert_v1_trigger(store_url: str) -> None:
    """Trigger ``fp`` as version 1 wrote it (``sync_definitions`` writes later columns)."""
    values = ("fp", "pkg.Trigger", b"kw", "2026-01-01T00:00:00+00:00")
    if store_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(store_url.removeprefix("sqlite:///"))) as lite:
            lite.execute("INSERT INTO triggers (fingerprint, classpath, kwargs_blob, created_at)"
                         " VALUES (?, ?, ?, ?)", values)
            lite.commit()
        return
    import psycopg  # noqa: PLC0415 - the postgres extra

    with psycopg.connect(store_url) as pg:
        pg.execute("INSERT INTO triggers (fingerprint, classpath, kwargs_blob, created_at)"
                   " VALUES (%s, %s, %s, %s)", values)


def test_upgrade_from_version_1_keeps_the_data(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with contextlib.ExitStack() as stack:
        if store_url.startswith("sqlite"):
            stack.enter_context(patch.object(sqlite_store, "MIGRATIONS",
                                             sqlite_store.MIGRATIONS[:1]))
        else:
            from sharedstream.store import postgres  # noqa: PLC0415 - the extra
            stack.enter_context(patch.object(postgres, "MIGRATIONS", postgres.MIGRATIONS[:1]))
        with open_store(store_url) as old:
            assert old.migrate() == 1
        insert_v1_trigger(store_url)
    code, _, err = cli(capsys, "db", "check")
    assert (code, err.count("\n")) == (2, 1)
    assert "at schema v1" in err
    assert cli(capsys, "db", "upgrade")[1].endswith(f": schema v1 -> v{LATEST}\n")
    assert cli(capsys, "db", "check")[0] == 0
    with open_store(store_url) as store:
        assert [t.fingerprint for t in store.list_triggers()] == ["fp"]


def test_a_newer_database_is_refused(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with open_store(store_url) as store:
        store.migrate()
    with patch.object(sqlite_store, "MIGRATIONS", sqlite_store.MIGRATIONS[:1]), \
            contextlib.ExitStack() as stack:
        if not store_url.startswith("sqlite"):
            from sharedstream.store import postgres  # noqa: PLC0415 - the extra
            stack.enter_context(patch.object(postgres, "MIGRATIONS", postgres.MIGRATIONS[:1]))
        for command in ("check", "upgrade"):
            code, _, err = cli(capsys, "db", command)
            assert (code, err.count("\n")) == (2, 1)
            assert "newer than the 1 this sharedstream supports" in err


def test_check_says_in_one_line_that_a_server_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(URL_ENV, f"postgresql://app:hunter2@127.0.0.1:{free_port()}/meta")
    code, out, err = cli(capsys, "db", "check")
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert err.startswith("sharedstream: error: cannot connect to postgresql://app:********@")
    assert "hunter2" not in err
    monkeypatch.setenv(URL_ENV, f"sqlite:///{tmp_path / 'missing.db'}")
    code, _, err = cli(capsys, "db", "check")
    assert code == 2
    assert "no database at" in err


def _shown(url: str) -> str:
    return url.removeprefix("sqlite:///")


def test_the_triggerer_stores_events_and_queues_runs_on_postgres(
    deployment: Deployment, postgres_database: str
) -> None:
    d = deployment
    d.env[URL_ENV] = postgres_database
    assert f"schema v0 -> v{LATEST}" in d.cli("db", "upgrade").stdout
    d.append(*MESSAGES)
    first = d.start()
    wait_for(lambda: d.committed() == 3, what="all four offsets committed")
    assert d.stop(first) == 0
    assert run_counts(d) == EXPECTED_RUNS
    assert sorted(e["payload"]["id"] for e in d.json("events", "list")) == [0, 1, 2, 2]
    assert f"store={postgres_database}" in d.stderr()
    # redelivered from the start: stored once, no second run
    Path(f"{d.log}.offsets").unlink()
    second = d.start()  # PostgreSQL takes no one-triggerer lock, so this one may run too
    wait_for(lambda: d.committed() == 3, what="redelivered and committed again")
    assert d.stop(second) == 0
    assert run_counts(d) == EXPECTED_RUNS
    assert "stopped stored=0 duplicates=4 dag_runs=0 " in d.stderr()
    assert not (d.dir / "sharedstream.db.triggerer.lock").exists()
