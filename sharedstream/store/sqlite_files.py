"""Guards around the SQLite file: it must exist, and one triggerer at a time may use it.

Only ``sharedstream init`` creates a database. Every other command opens an
existing one, so a typo in ``[store] url`` is an error naming the path, not
a fresh, empty store that the triggerer quietly fills.

SQLite serves one triggerer process: a second one on the same file would
run every watcher twice and fight over the write lock. The triggerer holds
an exclusive ``flock`` on ``<database>.triggerer.lock`` while it runs (the
kernel drops it when the process dies, however it dies), and a second one
refuses to start with one line. Several triggerers need PostgreSQL.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from sharedstream.store.base import StoreError

__all__ = ["TriggererLock", "require_database"]

def require_database(path: Path) -> Path:
    """``path`` if it holds an SQLite database; :class:`StoreError` naming the problem otherwise.

    The file is looked at through SQLite itself (a read-only connection),
    never with a plain ``open()``: closing any descriptor of a file drops
    every POSIX lock the process holds on it, including those of its open
    SQLite connections, and another process could then take itself for the
    last user of the database, checkpoint and delete the write-ahead log
    under them. SQLite's own files know about each other within a process.
    """
    if not path.exists():
        raise StoreError(f"no database at {path}; run `sharedstream init` first "
                         "(or check [store] url)")
    try:
        empty = path.stat().st_size == 0
    except OSError as exc:
        raise StoreError(f"cannot read the database {path}: {exc}") from exc
    if empty:
        raise StoreError(f"{path} is empty; run `sharedstream init` to create a database")
    try:
        probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            probe.close()
    except sqlite3.DatabaseError as exc:
        what = ("is not an SQLite database" if "not a database" in str(exc)
                else f"cannot be read ({exc})")
        raise StoreError(f"{path} {what}; run `sharedstream init` to create a database") from exc
    return path


class TriggererLock:
    """An exclusive lock on ``<database>.triggerer.lock`` for the life of one triggerer.

    ``acquire`` raises :class:`StoreError` (naming the holder's pid) when
    another process holds it. Use as a context manager.
    """

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = database.with_name(database.name + ".triggerer.lock")
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or refuse; writes this process's pid into the file."""
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise StoreError(
                f"another triggerer (pid {holder}) is already running on "
                f"{self.database}; an SQLite store serves one "
                "triggerer (several need PostgreSQL)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays."""
        handle, self._handle = self._handle, None
        if handle is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
