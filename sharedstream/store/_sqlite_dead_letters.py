"""How the SQLite store keeps dead letters: the ``dead_letters`` table (schema version 2).

``SqliteStore.add_dead_letter`` and ``SqliteStore.dead_letters`` own the
transaction and the error handling; this module is the SQL and the column
formats:

* ``created_at`` - ISO-8601 text in UTC with microseconds, like every other
  timestamp of the store.
* the other columns as in the PostgreSQL store (:mod:`sharedstream.store._rows`):
  ``length(payload) < payload_size`` exactly when the body was truncated, and
  a header name may repeat, as Kafka headers can.

Invariants:

1. ``(stream, source, reason)`` is unique and a second insert of it does
   nothing (``ON CONFLICT DO NOTHING``): a letter stored again after a crash
   leaves one row, the first.
2. Ids are ``AUTOINCREMENT``: never reused, so "newest first" is "id
   descending".
"""

from __future__ import annotations

import sqlite3

from sharedstream.engine.producer import DeadLetter
from sharedstream.store._rows import dead_letter_values

__all__ = ["insert_dead_letter"]

def insert_dead_letter(conn: sqlite3.Connection, letter: DeadLetter, now: str) -> bool:
    """Insert the letter unless its ``(stream, source, reason)`` is kept; True if inserted.

    Call inside a write transaction; ``now`` is the ``created_at`` text.
    """
    cur = conn.execute(
        "INSERT INTO dead_letters (created_at, stream, source, reason, triggers, payload,"
        " payload_size, headers) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (stream, source, reason) DO NOTHING",
        dead_letter_values(letter, now),
    )
    return cur.rowcount == 1

