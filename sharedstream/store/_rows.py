"""The rows both stores read and write alike: columns, formats, and the row types they build.

The SQLite and PostgreSQL stores keep the same tables with the same column
formats; only times differ on disk (ISO-8601 text in SQLite, ``TIMESTAMPTZ``
in PostgreSQL), so every builder here takes ``when``, the store's reader of
a stored time. The SQL text that is the same in both dialects (no bound
parameters) is here too. Pure functions; no driver is imported.

Dead-letter columns: ``triggers`` is a JSON array of the trigger ids as
text, in the producer's order; ``payload`` the first
:data:`~sharedstream.store.base.DEAD_LETTER_PAYLOAD_LIMIT` bytes of the body
and ``payload_size`` the whole body's size; ``headers`` a JSON array of
``[name, base64 of the value]`` pairs, in the producer's order. ``stream``,
``source`` and ``reason`` are text as given, except that a NUL or a lone
surrogate (which PostgreSQL's text, or UTF-8 at all, cannot hold) becomes
U+FFFD (:func:`storable_text`): a letter is kept whatever its text, never
refused and redelivered for it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sharedstream.engine.producer import DeadLetter
from sharedstream.store.base import (
    DEAD_LETTER_PAYLOAD_LIMIT,
    DeadLetterRow,
    TriggererRow,
    TriggerRow,
)

__all__ = [
    "COUNTS_SQL",
    "DEAD_LETTER_COLUMNS",
    "TRIGGERERS_SQL",
    "TRIGGER_COLUMNS",
    "WATCHERS_SQL",
    "When",
    "check_limit",
    "counts_of",
    "dead_letter_row",
    "dead_letter_values",
    "storable_text",
    "trigger_row",
    "triggerer_row",
    "watcher_names",
]

When = Callable[[Any], datetime]
"""A store's reader of a stored time (ISO text, or the driver's datetime) as UTC."""

TRIGGER_COLUMNS = (
    "id, fingerprint, classpath, kwargs_blob, state, error_count, last_error,"
    " last_traceback, last_error_at, created_at, events_stored, queue"
)
DEAD_LETTER_COLUMNS = (
    "id, created_at, stream, source, reason, triggers, payload, payload_size, headers,"
    " redriven_at, redrives"
)
TRIGGERERS_SQL = (
    "SELECT id, hostname, pid, started_at, heartbeat_at, running FROM triggerers ORDER BY id"
)
WATCHERS_SQL = (
    "SELECT w.trigger_id, a.name, w.name FROM watchers w JOIN assets a ON a.id = w.asset_id"
    " ORDER BY a.name, w.name"
)
COUNTS_SQL = (
    "SELECT (SELECT count(*) FROM triggers), (SELECT count(*) FROM trigger_events),"
    " (SELECT count(*) FROM asset_events), (SELECT count(*) FROM dag_runs)"
)


def check_limit(limit: int) -> None:
    """``ValueError`` for a negative ``limit`` of a listing."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def trigger_row(row: Sequence[Any], when: When, watchers: tuple[str, ...] = ()) -> TriggerRow:
    """A row of :data:`TRIGGER_COLUMNS` as a :class:`TriggerRow`."""
    return TriggerRow(
        id=int(row[0]),
        fingerprint=str(row[1]),
        classpath=str(row[2]),
        kwargs_blob=bytes(row[3]),
        state=str(row[4]),
        error_count=int(row[5]),
        last_error=row[6],
        last_traceback=row[7],
        last_error_at=None if row[8] is None else when(row[8]),
        created_at=when(row[9]),
        events_stored=int(row[10]),
        watchers=watchers,
        queue=row[11],
    )


def watcher_names(rows: Iterable[Sequence[Any]]) -> dict[int, tuple[str, ...]]:
    """Rows of :data:`WATCHERS_SQL` as ``trigger id -> ("asset/watcher", ...)``."""
    names: dict[int, list[str]] = {}
    for trigger_id, asset, name in rows:
        names.setdefault(int(trigger_id), []).append(f"{asset}/{name}")
    return {trigger_id: tuple(found) for trigger_id, found in names.items()}


def triggerer_row(row: Sequence[Any], when: When) -> TriggererRow:
    """A row of :data:`TRIGGERERS_SQL` as a :class:`TriggererRow`."""
    return TriggererRow(
        id=str(row[0]),
        hostname=str(row[1]),
        pid=int(row[2]),
        started_at=when(row[3]),
        heartbeat_at=when(row[4]),
        running=tuple(int(i) for i in json.loads(row[5])),
    )


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD (both stores hold it)."""
    return _UNSTORABLE.sub("\ufffd", text)


def dead_letter_values(letter: DeadLetter, created_at: object) -> tuple[Any, ...]:
    """The values to insert for ``letter``: :data:`DEAD_LETTER_COLUMNS` up to ``headers``.

    ``created_at`` is given as the store writes times.
    """
    return (
        created_at,
        storable_text(letter.stream),
        storable_text(letter.source),
        storable_text(letter.reason),
        json.dumps([str(trigger) for trigger in letter.triggers]),
        bytes(letter.payload[:DEAD_LETTER_PAYLOAD_LIMIT]),
        len(letter.payload),
        json.dumps([[name, base64.b64encode(value).decode("ascii")]
                    for name, value in letter.headers]),
    )


def dead_letter_row(row: Sequence[Any], when: When) -> DeadLetterRow:
    """A row of :data:`DEAD_LETTER_COLUMNS` as a :class:`DeadLetterRow`."""
    return DeadLetterRow(
        id=int(row[0]),
        created_at=when(row[1]),
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
        redriven_at=None if row[9] is None else when(row[9]),
        redrives=int(row[10]),
    )


def counts_of(row: Sequence[Any]) -> dict[str, int]:
    """The row of :data:`COUNTS_SQL` under the keys the store contract names."""
    return {"triggers": int(row[0]), "trigger_events": int(row[1]),
            "asset_events": int(row[2]), "dag_runs": int(row[3])}
