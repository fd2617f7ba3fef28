"""Turning a connection into a broker trigger's settings, strictly.

A broker trigger given ``conn_id`` resolves it when its producer is built
(in the triggerer, never where the definitions are loaded, so no secret
reaches the stored kwargs) and reads the connection with a
:class:`ConnectionReader`: each field and extra key it maps is *taken*;
what is left at :meth:`~ConnectionReader.finish` is either refused, naming
the key - a setting silently ignored (a security protocol, a certificate, a
role to assume) would connect differently from what the connection says -
or, for keys the broker says are harmless (tuning it has no equivalent
for), ignored with one warning per connection. :func:`merge_inline` then
lets the settings given inline win over the connection's.

Invariants:

- Every error is an :class:`~sharedstream.connections.InvalidConnection`
  (a broker configuration error: the stream is marked failed, not
  restarted), one line naming the connection, its source and the key; a
  value is never echoed (it may be a secret).
- :func:`merge_inline` never lets a connection override a setting given
  inline; mappings (security options, credentials) merge key by key.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from sharedstream.connections.lookup import Connection, InvalidConnection, get_connection
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["ConnectionReader", "merge_inline", "resolve_inline"]

_FIELDS = ("host", "port", "login", "password", "schema")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

log = key_value_logger("sharedstream.connections")
_warned: set[tuple[str, str, tuple[str, ...]]] = set()  # (conn id, source, keys) said once


class ConnectionReader:
    """Read one connection for one broker; refuse what is not read.

    ``broker`` names the trigger in messages (``"the Kafka trigger"``);
    ``conn_types`` are the connection types it takes (a connection without
    a type is taken too).
    """

    def __init__(self, conn: Connection, *, broker: str, conn_types: Collection[str]) -> None:
        self.conn = conn
        self.broker = broker
        if conn.conn_type is not None and conn.conn_type not in conn_types:
            raise self.error(f"its conn_type is {conn.conn_type!r}; {broker} takes "
                      + " or ".join(repr(t) for t in sorted(conn_types)), key="conn_type")
        self._extra = conn.extra_dejson
        self._fields = {name: getattr(conn, name) for name in _FIELDS
                        if getattr(conn, name) is not None}

    def error(self, problem: str, *, key: str | None = None) -> InvalidConnection:
        """An :class:`InvalidConnection` about this connection, to raise."""
        return InvalidConnection(self.conn.conn_id, self.conn.source, problem, key=key)

    def field(self, name: str) -> Any:
        """Take a connection field (``host``, ``login``...): its value, or ``None``."""
        return self._fields.pop(name, None)

    def take(self, *names: str) -> Any:
        """Take extra keys ``names`` (aliases: the first one present wins); ``None`` if none is."""
        found = None
        for name in reversed(names):
            if name in self._extra:
                found = self._extra.pop(name)
        return found

    def text(self, *names: str) -> str | None:
        """Like :meth:`take`, as text: a number or a boolean is written as text, not refused."""
        value = self.take(*names)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bool | int | float):
            return str(value).lower() if isinstance(value, bool) else str(value)
        raise self.error(f"extra {names[0]} must be text", key=names[0])

    def integer(self, name: str) -> int | None:
        """Like :meth:`take`, as an ``int`` (a string of digits is accepted)."""
        value = self.take(name)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.error(f"extra {name} must be an integer", key=name)
        return value

    def flag(self, name: str) -> bool | None:
        """Like :meth:`take`, as a boolean (``true``/``false``, ``1``/``0``... as text too)."""
        value = self.take(name)
        if isinstance(value, str | int) and not isinstance(value, bool):
            text = str(value).strip().lower()
            if text in (*_TRUE, *_FALSE):
                return text in _TRUE
        if value is not None and not isinstance(value, bool):
            raise self.error(f"extra {name} must be true or false", key=name)
        return value

    def refuse(self, names: Collection[str], why: str) -> None:
        """Refuse extra keys or fields this broker cannot honour, saying why, if any is set."""
        for name in names:
            if name in self._extra or name in self._fields:
                raise self.error(f"{name} is not supported by {self.broker}: {why}", key=name)

    def finish(
        self, supported: Collection[str], *, refuse: Callable[[str], bool] = lambda _: True
    ) -> None:
        """Deal with every field and extra key not taken.

        A field is refused. An extra key is refused when ``refuse(key)`` (by
        default every key; the message lists ``supported``), else ignored:
        the ignored keys are logged in one warning, once per connection and
        process.
        """
        for name in self._fields:
            raise self.error(f"{self.broker} does not use the connection's {name}", key=name)
        for name in sorted(self._extra):
            if refuse(name):
                raise self.error(f"extra key {name!r} is not supported by {self.broker} "
                                 f"(supported: {', '.join(sorted(supported))})", key=name)
        ignored = tuple(sorted(self._extra))
        said = (self.conn.conn_id, self.conn.source, ignored)
        if ignored and said not in _warned:
            _warned.add(said)
            log.warning("connection extra keys have no effect on this broker; ignored",
                        conn_id=self.conn.conn_id, source=self.conn.source or "code",
                        keys=list(ignored), broker=self.broker)


def merge_inline(
    inline: Mapping[str, Any], from_connection: Mapping[str, Any], *, mappings: Collection[str] = ()
) -> dict[str, Any]:
    """The trigger's kwargs completed by the connection: inline settings win.

    A setting is given inline when its value is not ``None``; the names in
    ``mappings`` (dict settings: ``security``, ``credentials``...) merge key
    by key, the inline keys winning.
    """
    merged = dict(inline)
    for name, value in from_connection.items():
        if name in mappings:
            merged[name] = {**dict(value or {}), **dict(inline.get(name) or {})}
        elif inline.get(name) is None:
            merged[name] = value
    return merged


def resolve_inline(
    kwargs: Mapping[str, Any],
    read: Callable[[Connection], Mapping[str, Any]],
    *,
    mappings: Collection[str] = (),
) -> dict[str, Any]:
    """``kwargs`` completed from the connection ``kwargs["conn_id"]``, if there is one.

    ``read`` maps a :class:`Connection` to settings (a broker's mapping,
    built on :class:`ConnectionReader`). Raises
    :class:`~sharedstream.connections.ConnectionNotFound` or
    :class:`InvalidConnection` (both broker configuration errors).
    """
    conn_id = kwargs.get("conn_id")
    if conn_id is None:
        return dict(kwargs)
    return merge_inline(kwargs, read(get_connection(conn_id)), mappings=mappings)
