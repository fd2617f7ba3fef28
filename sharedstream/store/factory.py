"""One way to get a metadata store: from its URL, ``[store] url`` of the configuration.

* ``sqlite:///path/to/file.db`` - :class:`~sharedstream.store.sqlite.SqliteStore`
  (a relative path is relative to the working directory);
* ``postgresql://user:password@host:port/database`` (or ``postgres://``) -
  :class:`~sharedstream.store.postgres.PostgresStore`, which needs the
  ``postgres`` extra (psycopg 3); it is imported only when such a URL is
  opened, so an SQLite user never loads a PostgreSQL driver.

Everything outside this package works with the
:class:`~sharedstream.store.base.MetadataStore` protocol that
:func:`open_store` returns and with :func:`triggerer_guard`; the backend
classes are named only here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from sharedstream.store.base import MetadataStore, StoreError, redact_url
from sharedstream.store.sqlite import SqliteStore
from sharedstream.store.sqlite_files import TriggererLock, require_database

__all__ = [
    "POSTGRES_SCHEMES",
    "SQLITE_PREFIX",
    "open_store",
    "serves_one_triggerer",
    "sqlite_path",
    "triggerer_guard",
]

SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (absolute), or ``None`` for another URL."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    return Path.cwd() / url.removeprefix(SQLITE_PREFIX)


def open_store(
    url: str,
    *,
    create: bool = False,
    pool_size: int = 4,
    connect_timeout: float = 10.0,
) -> MetadataStore:
    """Open the metadata store ``url`` names; call ``migrate()`` before using it.

    ``create`` lets an SQLite URL name a file that does not exist yet (only
    ``sharedstream init`` and the demo create one: elsewhere a typo in the
    path must not quietly start an empty store). A PostgreSQL database must
    exist either way; ``pool_size`` and ``connect_timeout`` apply to it only.
    Raises :class:`StoreError` (one line, password hidden) for an unknown
    scheme, a missing SQLite file, a server that does not answer, or a
    missing ``postgres`` extra.
    """
    path = sqlite_path(url)
    if path is not None:
        return SqliteStore(path if create else require_database(path))
    if url.startswith(POSTGRES_SCHEMES):
        try:
            from sharedstream.store.postgres import PostgresStore  # noqa: PLC0415 - the extra
        except ImportError as exc:
            raise StoreError(
                f"{redact_url(url)} needs the PostgreSQL driver: "
                f"pip install 'sharedstream[postgres]' ({exc})"
            ) from exc
        return PostgresStore(url, pool_size=pool_size, connect_timeout=connect_timeout)
    raise StoreError(
        f"unknown store URL {redact_url(url)!r}: expected sqlite:///path or postgresql://..."
    )


def triggerer_guard(url: str) -> contextlib.AbstractContextManager[object]:
    """What a triggerer holds while it runs on ``url``, so that it is alone where it must be.

    SQLite serves one triggerer: an exclusive lock next to the file
    (:class:`~sharedstream.store.sqlite_files.TriggererLock`; entering raises
    :class:`StoreError` naming the holder). PostgreSQL serves several: nothing.
    """
    path = sqlite_path(url)
    if path is None:
        return contextlib.nullcontext()
    return TriggererLock(path)


def serves_one_triggerer(url: str) -> bool:
    """Whether the store ``url`` names serves one triggerer only (SQLite, see the guard below).

    A triggerer on such a store, holding the guard, knows every other
    triggerer recorded in it is dead: it takes their triggers at once.
    """
    return sqlite_path(url) is not None
