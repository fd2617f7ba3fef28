"""WAL checkpoints of the SQLite store on a thread of their own, off the writer's commits.

In WAL mode SQLite copies the log back into the database file (a
*checkpoint*) inside the ``COMMIT`` that takes the log past
``wal_autocheckpoint`` pages: the writing thread pays for it, and with it
every event of that batch waits. :class:`Checkpointer` takes that work
away: the writer pokes it after each commit, and a daemon thread with its
own connection runs ``PRAGMA wal_checkpoint(PASSIVE)``, which copies what
no reader still needs and never blocks the writer (nor waits for it).

Durability does not change: a commit is durable once its log frames are
synced, which the writer still does in ``COMMIT`` (``synchronous=FULL``);
a checkpoint only moves already durable pages.

Invariants:

1. The writer's own automatic checkpoint stays on, at :data:`BACKSTOP_PAGES`:
   if this thread falls behind, fails or is stopped, the log is still
   bounded, as it was before, just at a larger size.
2. Pokes coalesce: one checkpoint runs at a time, and every poke made before
   it starts is served by it.
3. :meth:`Checkpointer.close` stops the thread and waits for it; after
   close, pokes do nothing.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["BACKSTOP_PAGES", "Checkpointer"]

log = key_value_logger("sharedstream.store")

BACKSTOP_PAGES = 10_000
"""The writer's own ``wal_autocheckpoint`` while a :class:`Checkpointer` runs (40 MB
at 4 KiB pages): reached only when the thread does not keep up."""


class Checkpointer:
    """A daemon thread running passive WAL checkpoints of one database when poked."""

    def __init__(self, path: Path) -> None:
        """Open the thread's connection to ``path`` and start it.

        Raises ``sqlite3.Error`` when the database cannot be opened.
        """
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._wanted = threading.Event()
        self._stopping = False
        self.checkpoints = 0
        """Checkpoints run (for tests and benchmarks)."""
        self._thread = threading.Thread(
            target=self._run, name=f"sqlite-checkpoints {path.name}", daemon=True
        )
        self._thread.start()

    def poke(self) -> None:
        """Ask for a checkpoint soon (after a commit); cheap, never blocks."""
        self._wanted.set()

    def close(self) -> None:
        """Stop the thread (after a checkpoint it is running) and close its connection."""
        if self._stopping:
            return
        self._stopping = True
        self._wanted.set()
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        failed = False
        while True:
            self._wanted.wait()
            if self._stopping:
                return
            self._wanted.clear()
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.checkpoints += 1
                failed = False
            except sqlite3.Error as exc:
                if not failed:  # once per run of failures: the writer's backstop still holds
                    log.warning("background WAL checkpoint failed", error=str(exc))
                failed = True
