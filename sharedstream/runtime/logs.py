"""Logging set-up of the ``sharedstream`` commands: text or JSON lines, client libraries quiet.

Two formats (``[logging] format``): ``text``, one human line per record
(``time LEVEL logger: message key=value ...``), and ``json``, one JSON
object per line (:class:`JsonFormatter`: ``timestamp``, ``level``,
``logger``, ``message``, then the record's key-values as fields). Key-values
come from structlog-style calls (``self.log.info("msg", key=value)``, see
:mod:`sharedstream.engine.keyvalue_log`); plain ``%``-style records work
the same in both formats.

A broker that goes away makes its client library log the same error many
times a second (aiokafka: "Unable connect to node ..."). Those lines say
one thing: the broker is unreachable and the client keeps retrying. The
commands let the first of each through with that said, and hide its
repeats for ``REPEAT_WINDOW`` seconds; ``sharedstream`` loggers are never
filtered.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from typing import Any

from sharedstream.engine.keyvalue_log import KeyValueMessage
from sharedstream.engine.payload_json import jsonable

__all__ = ["LOG_FORMATS", "REPEAT_WINDOW", "JsonFormatter", "QuietRepeats", "configure_logging"]

LOG_FORMATS = ("text", "json")
"""The values of ``[logging] format``."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

REPEAT_WINDOW = 60.0
"""Seconds during which a client library's repeated message is shown once."""


class QuietRepeats(logging.Filter):
    """Pass a library's record once per template and ``window``; ours and triggers' always."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._last: dict[tuple[str, object], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is shown (a first of its kind in the window is annotated)."""
        if record.name == "sharedstream" or record.name.startswith("sharedstream."):
            return True
        if hasattr(record, "key_values"):  # trigger code's self.log: its lines, never a library's
            return True
        key = (record.name, record.msg)
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        self._last[key] = now
        if record.levelno >= logging.WARNING:
            record.msg = (f"{record.msg} (from the client library: the broker may be "
                          f"unreachable, and it keeps retrying; repeats hidden for "
                          f"{self.window:.0f}s)")
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line.

    Fields, in order: ``timestamp`` (UTC, ISO 8601 with milliseconds, ``Z``),
    ``level`` (lower case, as structlog writes it), ``logger``, ``message``
    (without the key-values), then each key-value of the record; last
    ``exception`` (the formatted traceback) and ``stack``, when present. A
    key-value named like one of those fields is written with a trailing
    ``_`` (``level_``), so it never hides one. Values JSON has no type for
    are written as their ISO or text form when there is one
    (:func:`~sharedstream.engine.payload_json.jsonable`), else their
    ``repr``. Never raises for a value.
    """

    RESERVED = frozenset({"timestamp", "level", "logger", "message", "exception", "stack"})

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (no newline inside: tracebacks are escaped)."""
        msg = record.msg
        message = msg.text if isinstance(msg, KeyValueMessage) else record.getMessage()
        created = dt.datetime.fromtimestamp(record.created, dt.UTC)
        line: dict[str, Any] = {
            "timestamp": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        fields = getattr(record, "key_values", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                name = str(key)
                line[f"{name}_" if name in self.RESERVED else name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=_json_fallback)


def _json_fallback(value: object) -> object:
    try:
        return jsonable(value)
    except (TypeError, ValueError):  # no JSON form (or bytes that are not UTF-8): say what it is
        return repr(value)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level`` (a name) in ``fmt`` (``LOG_FORMATS``), library repeats quieted.

    Raises ``ValueError`` for an unknown format. Call once, at start-up.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(LOG_FORMATS)}")
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=TEXT_FORMAT)
    for handler in logging.getLogger().handlers:
        if fmt == "json":
            handler.setFormatter(JsonFormatter())
        handler.addFilter(QuietRepeats())
