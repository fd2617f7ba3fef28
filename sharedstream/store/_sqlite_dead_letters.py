"""How the SQLite store keeps dead letters: the ``dead_letters`` table (schema version 2).

``SqliteStore.add_dead_letter`` and ``SqliteStore.dead_letters`` own the
transaction and the error handling; this module is the SQL and the column
formats:

* ``created_at`` - ISO-8601 text in UTC with microseconds, like every other
  timestamp of the store.
* ``triggers`` - a JSON array of the trigger ids as text, in the producer's
  order (``["3", "7"]``).
* ``payload`` - the first :data:`~sharedstream.store.base.DEAD_LETTER_PAYLOAD_LIMIT`
  bytes of the body; ``payload_size`` - the size of the whole body, so
  ``length(payload) < payload_size`` exactly when the body was truncated.
* ``headers`` - a JSON array of ``[name, base64 of the value]`` pairs, in the
  producer's order (a name may repeat, as Kafka headers can).

Invariants:

1. ``(stream, source, reason)`` is unique and a second insert of it does
   nothing (``ON CONFLICT DO NOTHING``): a letter stored again after a crash
   leaves one row, the first.
2. Ids are ``AUTOINCREMENT``: never reused, so "newest first" is "id
   descending".
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sharedstream.engine.producer import DeadLetter
from sharedstream.store.base import DEAD_LETTER_PAYLOAD_LIMIT, DeadLetterRow

__all__ = ["dead_letter_row", "dead_letters_query", "insert_dead_letter"]

_COLUMNS = "id, created_at, stream, source, reason, triggers, payload, payload_size, headers"
_SELECT = f"SELECT {_COLUMNS} FROM dead_letters"  # noqa: S608 - constant text only
_NEWEST = f"{_SELECT} ORDER BY id DESC LIMIT ?"
_NEWEST_OF_STREAM = f"{_SELECT} WHERE stream = ? ORDER BY id DESC LIMIT ?"


def insert_dead_letter(conn: sqlite3.Connection, letter: DeadLetter, now: str) -> bool:
    """Insert the letter unless its ``(stream, source, reason)`` is kept; True if inserted.

    Call inside a write transaction; ``now`` is the ``created_at`` text.
    """
    cur = conn.execute(
        "INSERT INTO dead_letters (created_at, stream, source, reason, triggers, payload,"
        " payload_size, headers) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (stream, source, reason) DO NOTHING",
        (
            now,
            letter.stream,
            letter.source,
            letter.reason,
            json.dumps([str(trigger) for trigger in letter.triggers]),
            bytes(letter.payload[:DEAD_LETTER_PAYLOAD_LIMIT]),
            len(letter.payload),
            json.dumps(
                [[name, base64.b64encode(value).decode("ascii")] for name, value in letter.headers]
            ),
        ),
    )
    return cur.rowcount == 1


def dead_letters_query(limit: int, stream: str | None) -> tuple[str, list[Any]]:
    """The ``SELECT`` (and its parameters) of the newest ``limit`` rows, of one stream or all."""
    if stream is None:
        return _NEWEST, [limit]
    return _NEWEST_OF_STREAM, [stream, limit]


def dead_letter_row(row: Sequence[Any]) -> DeadLetterRow:
    """A row of :func:`dead_letters_query` as a :class:`DeadLetterRow`."""
    return DeadLetterRow(
        id=int(row[0]),
        created_at=datetime.fromisoformat(row[1]),
        stream=str(row[2]),
        source=str(row[3]),
        reason=str(row[4]),
        triggers=tuple(str(trigger) for trigger in json.loads(row[5])),
        payload=bytes(row[6]),
        payload_size=int(row[7]),
        headers=tuple(
            (str(name), base64.b64decode(value, validate=True))
            for name, value in json.loads(row[8])
        ),
    )
