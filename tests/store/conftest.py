"""The store suite runs on every backend: ``backend`` is parametrized over SQLite and PostgreSQL.

A test takes ``store`` (a migrated :class:`MetadataStore` on a fresh
database) or ``backend`` (to open more stores on that database, make other
fresh ones, or reach the database directly, as a fault injector would).
PostgreSQL comes from the testing kit's ``postgres_url`` fixture: one
throwaway server for the session (or ``$SHAREDSTREAM_TEST_POSTGRES_URL``),
a new database per test.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest

from sharedstream.store import MetadataStore, open_store
from sharedstream.store._postgres_schema import MIGRATIONS as POSTGRES_MIGRATIONS
from sharedstream.store._sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from sharedstream.testing.brokers.postgres import fresh_database
from sharedstream.testing.fixtures import postgres_database, postgres_url

LATEST = len(SQLITE_MIGRATIONS)
"""The schema version this code migrates to (the same for both stores)."""
assert len(POSTGRES_MIGRATIONS) == LATEST, "the stores' migrations must stay in step"

ALL_VERSIONS = [(version,) for version in range(1, LATEST + 1)]
"""``schema_version``'s rows once a store is at :data:`LATEST`."""

__all__ = ["Backend", "postgres_database", "postgres_url"]


class Backend:
    """One backend under test: fresh databases, stores on them, and raw SQL."""

    def __init__(
        self, name: str, tmp_path: Path, stack: contextlib.ExitStack,
        request: pytest.FixtureRequest,
    ) -> None:
        self.name = name
        self._tmp_path = tmp_path
        self._stack = stack
        self._request = request
        self._databases = 0
        self.url = self.fresh_url()

    @property
    def integrity_error(self) -> type[Exception]:
        """What the driver raises for a violated constraint (a foreign key, say)."""
        if self.name == "sqlite":
            return sqlite3.IntegrityError
        import psycopg  # noqa: PLC0415 - only with the postgres extra

        return psycopg.IntegrityError

    @property
    def driver_error(self) -> type[Exception]:
        """The base class of the driver's errors."""
        if self.name == "sqlite":
            return sqlite3.Error
        import psycopg  # noqa: PLC0415 - only with the postgres extra

        return psycopg.Error

    def fresh_url(self) -> str:
        """The URL of another new, empty database (dropped after the test)."""
        self._databases += 1
        if self.name == "sqlite":
            return f"sqlite:///{self._tmp_path / f'db{self._databases}' / 'meta.db'}"
        admin: str = self._request.getfixturevalue("postgres_url")
        return self._stack.enter_context(fresh_database(admin))

    def open(self, url: str | None = None) -> MetadataStore:
        """A new store on ``url`` (default: this test's database), closed after the test."""
        store = open_store(url or self.url, create=True)
        self._stack.callback(store.close)
        return store

    @contextlib.contextmanager
    def at_version(self, version: int) -> Iterator[MetadataStore]:
        """A store that knows only the first ``version`` migrations, migrated to that version.

        What an older release made: write its rows as that release wrote
        them (:meth:`execute`), then open the database with today's code.
        """
        if self.name == "sqlite":
            from sharedstream.store import sqlite as module  # noqa: PLC0415
        else:
            from sharedstream.store import postgres as module  # type: ignore[no-redef]  # noqa: PLC0415
        with patch.object(module, "MIGRATIONS", module.MIGRATIONS[:version]), self.open() as old:
            assert old.migrate() == version
            yield old

    def query(self, sql: str, url: str | None = None) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` run on a connection of its own (outside any store)."""
        return self._raw(sql, url, fetch=True)

    def execute(self, sql: str, url: str | None = None) -> None:
        """Run ``sql`` and commit, on a connection of its own."""
        self._raw(sql, url, fetch=False)

    def insert_old_event(self, trigger_id: int, idem_key: str) -> None:
        """A trigger event (payload ``{}``) as schema versions 1 to 4 wrote it: no trace_parent.

        For a database left at an old version, which this code's ``write_events`` cannot write.
        """
        if not idem_key.isalnum():
            raise ValueError(f"idem_key must be letters and digits here, got {idem_key!r}")
        blob = "X'7b7d'" if self.name == "sqlite" else "'{}'::bytea"
        self.execute("INSERT INTO trigger_events (trigger_id, idem_key, payload, created_at)"  # noqa: S608 - checked above
                     f" VALUES ({int(trigger_id)}, '{idem_key}', {blob},"
                     " '2026-01-01T00:00:00+00:00')")

    def insert_old_trigger(self, asset: str | None = None) -> int:
        """Trigger ``fp`` (``pkg.Trigger``), as versions 1 to 8 wrote it: no queue; its id.

        With ``asset``, that asset too, watching it as ``w``. For a database
        left at an old version, which this code's ``sync_definitions`` cannot write.
        """
        blob = "X'6b77'" if self.name == "sqlite" else "'kw'::bytea"
        self.execute("INSERT INTO triggers (fingerprint, classpath, kwargs_blob, created_at)"  # noqa: S608 - constants
                     f" VALUES ('fp', 'pkg.Trigger', {blob}, '2026-01-01T00:00:00+00:00')")
        ((trigger_id,),) = self.query("SELECT id FROM triggers WHERE fingerprint = 'fp'")
        if asset is not None:
            if not asset.isalnum():
                raise ValueError(f"asset must be letters and digits here, got {asset!r}")
            self.execute(f"INSERT INTO assets (name, created_at) VALUES ('{asset}',"  # noqa: S608 - checked above
                         " '2026-01-01T00:00:00+00:00')")
            self.execute("INSERT INTO watchers (asset_id, name, trigger_id)"  # noqa: S608 - checked above
                         f" SELECT id, 'w', {int(trigger_id)} FROM assets WHERE name = '{asset}'")
        return int(trigger_id)

    def _raw(self, sql: str, url: str | None, *, fetch: bool) -> list[tuple[Any, ...]]:
        target = url or self.url
        if self.name == "sqlite":
            lite = sqlite3.connect(target.removeprefix("sqlite:///"))
            try:
                with lite:
                    rows = lite.execute(sql).fetchall()
                return [tuple(row) for row in rows] if fetch else []
            finally:
                lite.close()
        import psycopg  # noqa: PLC0415 - only with the postgres extra

        with psycopg.connect(target, autocommit=True) as conn:
            cursor = conn.execute(sql)
            return [tuple(row) for row in cursor.fetchall()] if fetch and cursor.description else []


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with contextlib.ExitStack() as stack:
        yield Backend(request.param, tmp_path, stack, request)


@pytest.fixture
def store(backend: Backend) -> MetadataStore:
    s = backend.open()
    s.migrate()
    return s
