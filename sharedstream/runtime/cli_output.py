"""How the CLI opens the store, reads counts and prints: tables for people, JSON for machines.

Every listing command builds records (dicts) and hands them to :func:`emit`
with the columns a table shows: ``--json`` prints every field of every
record as one JSON document (times ISO 8601 with their offset,
``2026-11-28T12:42:44.123456+00:00``; bytes base64); otherwise a table of
the columns, each cell one line of at most 60 characters (times as
:func:`time_text` writes them, bytes as their text, lists and dicts as JSON).

Times for people have one format everywhere: :func:`time_text`,
``2026-11-28 12:42:44 UTC`` - the CLI's tables and ``key: value`` lines,
``sharedstream status`` and the status page (whose script writes the same
format; ``tests/ops/test_status_page.py`` holds them together).
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sharedstream.runtime.config import Config
from sharedstream.store import MetadataStore

__all__ = ["TIME_FORMAT", "cell", "emit", "open_migrated_store", "plain", "positive", "preview",
           "time_text", "to_base64"]

TIME_FORMAT = "%Y-%m-%d %H:%M:%S UTC"
"""How a time is shown to people (``strftime``): in UTC, to the second, saying so."""


def time_text(value: datetime | str) -> str:
    """``2026-11-28 12:42:44 UTC``: ``value`` in UTC, to the second (cut, not rounded).

    ``value`` is a datetime (a naive one is taken as UTC, as the store
    writes them) or its ISO 8601 text (what ``/status`` carries); text that
    is not a time is returned as it is.
    """
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime(TIME_FORMAT)


def positive(text: str) -> int:
    """A ``--limit`` or count (an ``argparse`` type): a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def open_migrated_store(config: Config) -> MetadataStore:
    """The configured store, migrated (the listing commands bring an old schema up to date)."""
    store = config.store.open_store()
    try:
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store


def plain(value: Any) -> Any:
    """JSON for what ``json`` cannot write: times as ISO 8601, bytes as base64."""
    if isinstance(value, datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, bytes):
        return to_base64(value)
    return str(value)


def _readable(value: Any) -> Any:
    """Like :func:`plain`, for a table cell: bytes as text (see :func:`preview`)."""
    return preview(value) if isinstance(value, bytes) else plain(value)


def emit(args: argparse.Namespace, records: list[dict[str, Any]], columns: Sequence[str]) -> int:
    """Print ``records`` (``--json``: all of them; else a table of ``columns``); returns 0."""
    if args.json:
        print(json.dumps(records, indent=2, default=plain))
        return 0
    if not records:
        print("(none)")
        return 0
    cells = [[cell(record[column]) for column in columns] for record in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def to_base64(data: bytes) -> str:
    """``data`` as base64 text."""
    return base64.b64encode(data).decode("ascii")


def preview(payload: bytes) -> str:
    """The payload's start as text; bytes that are not UTF-8 and control characters as ``.``.

    Decodes enough bytes for :func:`cell` to fill its width and mark the cut.
    """
    text = payload[:256].decode("utf-8", errors="replace")
    return "".join(
        " " if char.isspace() else char if char.isprintable() and char != "\ufffd" else "."
        for char in text
    )


def cell(value: Any, limit: int = 60) -> str:
    """One table cell: ``-`` for nothing, one line, at most ``limit`` characters."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        text = time_text(value)
    elif isinstance(value, (list, dict)):
        text = json.dumps(value, default=_readable)
    else:
        text = str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
