"""Structlog-style logging over the standard library: ``log.info("msg", key=value)``.

Airflow's triggers log through structlog, so trigger code passes key-value
pairs as keyword arguments. :class:`KeyValueLogger` (what ``self.log``
returns on a trigger) accepts them on top of everything a
``logging.Logger`` accepts (``%``-style args, ``exc_info``, ``stack_info``,
``stacklevel``, ``extra``), and emits an ordinary ``logging.LogRecord``:

* its message renders as ``msg key=value ...`` wherever it goes (any
  handler, any formatter: ``record.getMessage()`` includes the pairs);
* ``record.key_values`` holds the pairs as a dict (empty without any), for
  structured output (the runtime's JSON format writes them as fields, see
  :mod:`sharedstream.runtime.logs`); ``record.msg.text`` the message alone.
  Its presence also tells a record of trigger code from a client library's.

Cost model: a call whose level is disabled costs one ``isEnabledFor``; a
enabled call without key-values goes to the standard logger as it is (with
an empty ``key_values``). Only an enabled call with key-values formats its
``%`` args at once and builds one small :class:`KeyValueMessage`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["KeyValueLogger", "KeyValueMessage", "key_value_logger", "render_value"]

_BARE_UNSAFE = frozenset(" \t\n\r=\"'")


def render_value(value: object) -> str:
    """One value as text: a plain word bare (``orders``), anything else as its ``repr``."""
    if isinstance(value, str) and value and not _BARE_UNSAFE.intersection(value):
        return value
    return repr(value)


class KeyValueMessage:
    """A log record's message with its key-values: ``str()`` renders ``text key=value ...``.

    ``text`` is the message with its ``%`` args already applied; ``fields``
    the key-values in call order. Equal (and hashing) by text and fields'
    rendering, so a filter keyed on ``record.msg`` still works.
    """

    __slots__ = ("fields", "text")

    def __init__(self, text: str, fields: Mapping[str, Any]) -> None:
        self.text = text
        self.fields = fields

    def __str__(self) -> str:
        pairs = " ".join(f"{key}={render_value(value)}" for key, value in self.fields.items())
        return f"{self.text} {pairs}" if self.text else pairs

    def __repr__(self) -> str:
        return f"KeyValueMessage({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyValueMessage) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))


class KeyValueLogger(logging.LoggerAdapter[logging.Logger]):
    """A ``logging.Logger`` that also takes structlog-style key-values as keyword arguments.

    ``log.info("matched", topic="orders", offset=42)`` logs
    ``matched topic=orders offset=42`` with ``record.key_values ==
    {"topic": "orders", "offset": 42}``; ``log.info("took %.1fs", 0.5)``
    and ``log.warning("failed", exc_info=True)`` behave as on the standard
    logger. :meth:`bind` returns a logger whose lines all carry some
    key-values (structlog's ``bind``). Thread-safe as the standard logger
    is; never raises for a key-value (a value is rendered with ``repr``).
    """

    def __init__(self, logger: logging.Logger, context: Mapping[str, Any] | None = None) -> None:
        super().__init__(logger, None)
        self.context: dict[str, Any] = dict(context or {})
        """Key-values added to every line (see :meth:`bind`)."""

    def bind(self, **key_values: Any) -> KeyValueLogger:
        """A logger of the same name whose every line also carries ``key_values``."""
        return KeyValueLogger(self.logger, {**self.context, **key_values})

    def _emit(self, level: int, msg: object, args: tuple[Any, ...], kwargs: dict[str, Any],
              stacklevel: int = 1) -> None:
        exc_info = kwargs.pop("exc_info", None)
        stack_info = kwargs.pop("stack_info", False)
        stacklevel = kwargs.pop("stacklevel", 1) + stacklevel + 1  # the caller, not us
        extra = kwargs.pop("extra", None)
        fields = {**self.context, **kwargs} if self.context else kwargs
        if fields:
            text = str(msg) % args if args else str(msg)
            msg, args = KeyValueMessage(text, fields), ()
        extra = {**extra, "key_values": fields} if extra else {"key_values": fields}
        self.logger.log(level, msg, *args, exc_info=exc_info, stack_info=stack_info,
                        stacklevel=stacklevel, extra=extra)

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level``; keyword arguments other than the stdlib's are key-values."""
        if self.logger.isEnabledFor(level):
            self._emit(level, msg, args, kwargs)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at DEBUG (see :meth:`log`)."""
        if self.logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at INFO (see :meth:`log`)."""
        if self.logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at WARNING (see :meth:`log`)."""
        if self.logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR (see :meth:`log`)."""
        if self.logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR with the exception being handled (``exc_info=True`` by default)."""
        if self.logger.isEnabledFor(logging.ERROR):
            kwargs.setdefault("exc_info", True)
            self._emit(logging.ERROR, msg, args, kwargs)

    def critical(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at CRITICAL (see :meth:`log`)."""
        if self.logger.isEnabledFor(logging.CRITICAL):
            self._emit(logging.CRITICAL, msg, args, kwargs)

    warn = warning
    fatal = critical


@functools.cache
def key_value_logger(name: str) -> KeyValueLogger:
    """The :class:`KeyValueLogger` over ``logging.getLogger(name)`` (one per name, cached)."""
    return KeyValueLogger(logging.getLogger(name))
