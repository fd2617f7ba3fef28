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
repeats for ``REPEAT_WINDOW`` seconds. Our own retry lines repeat the same
way while a broker is away (``broker call failed; retrying``, five a
connection attempt): a ``sharedstream`` line logged with
``extra={REPEAT_KEY: key}`` is held back by the same filter, once per
logger, message and ``key`` in the window, and the next one shown says how
many were hidden (``held_back``). Every other ``sharedstream`` line, and
trigger code's, always passes.
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

__all__ = ["LOG_FORMATS", "REPEAT_KEY", "REPEAT_WINDOW", "JsonFormatter", "QuietRepeats",
           "configure_logging"]

LOG_FORMATS = ("text", "json")
"""The values of ``[logging] format``."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

REPEAT_WINDOW = 60.0
"""Seconds during which a client library's repeated message is shown once."""

REPEAT_KEY = "repeat_key"
"""The record attribute (``extra={REPEAT_KEY: ...}``) marking one of our lines as a repeat."""


class QuietRepeats(logging.Filter):
    """Pass a repeating record once per kind and ``window``; every other record always.

    Repeating records: a client library's (not ``sharedstream`` nor trigger
    code's), of one kind per logger and message template; and our own lines
    that carry a :data:`REPEAT_KEY` attribute, of one kind per logger,
    message and that key. The first of a kind in the window passes (a
    library's warning says it comes from the library; ours gets
    ``repeats_hidden_s`` and, when some were hidden since the last one
    shown, ``held_back``); the rest are dropped. Attached to the handlers:
    it runs on the logging caller's thread, costs a dict look-up per
    repeating record, and never raises.
    """

    MAX_KINDS = 1024
    """Kinds remembered before those outside the window are forgotten (a repeat key may
    name an offset, so the kinds seen over days are not a fixed set)."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._last: dict[tuple[str, object], float] = {}
        self._hidden: dict[tuple[str, object], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is shown (a first of its kind in the window is annotated)."""
        ours = record.name == "sharedstream" or record.name.startswith("sharedstream.")
        repeat_key = getattr(record, REPEAT_KEY, None)
        if ours and repeat_key is None:
            return True
        if not ours and hasattr(record, "key_values"):  # trigger code's self.log: never a library's
            return True
        key = (record.name, (_text(record), repeat_key) if ours else record.msg)
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            self._hidden[key] = self._hidden.get(key, 0) + 1
            return False
        self._last[key] = now
        if len(self._last) > self.MAX_KINDS:
            self._forget_before(now - self.window)
        if ours:
            _annotate(record, window=self.window, held_back=self._hidden.pop(key, 0))
        elif record.levelno >= logging.WARNING:
            record.msg = (f"{record.msg} (from the client library: the broker may be "
                          f"unreachable, and it keeps retrying; repeats hidden for "
                          f"{self.window:.0f}s)")
        return True


    def _forget_before(self, cutoff: float) -> None:
        """Forget the kinds last shown before ``cutoff`` (their next one is shown anyway)."""
        for key in [key for key, shown in self._last.items() if shown < cutoff]:
            del self._last[key]
            self._hidden.pop(key, None)


def _text(record: logging.LogRecord) -> str:
    """The record's message without its key-values (its kind, for our own lines)."""
    msg = record.msg
    return msg.text if isinstance(msg, KeyValueMessage) else str(msg)


def _annotate(record: logging.LogRecord, *, window: float, held_back: int) -> None:
    """Add ``repeats_hidden_s`` (and ``held_back`` when some were) to one of our records."""
    fields = dict(getattr(record, "key_values", None) or {})
    fields["repeats_hidden_s"] = round(window)
    if held_back:
        fields["held_back"] = held_back
    text = _text(record) % record.args if record.args else _text(record)
    record.msg, record.args = KeyValueMessage(text, fields), ()
    record.key_values = fields


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
