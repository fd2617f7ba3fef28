"""``airflow.sdk``'s ``BaseHook`` and ``Variable``, over our connections and variables.

Trigger code written for Airflow reads its connection through a hook
(``BaseHook.get_connection(conn_id)``) and its settings through
``Variable.get(key)``; both port by the import rule
(:mod:`sharedstream.airflow.sdk` re-exports them):

* :meth:`BaseHook.get_connection` is
  :func:`sharedstream.connections.get_connection`: ``SHAREDSTREAM_CONN_<ID>``,
  ``AIRFLOW_CONN_<ID>``, then the config file's ``[connections.<id>]``;
  missing is :class:`~sharedstream.connections.ConnectionNotFound`;
* :meth:`Variable.get` is :func:`sharedstream.runtime.variables.get_variable`
  (``SHAREDSTREAM_VAR_<KEY>``, then ``AIRFLOW_VAR_<KEY>``), with Airflow 3's
  ``default`` and ``deserialize_json`` and Airflow 2's ``default_var``.

Both read at each call, so a hook built where a trigger is declared reads
nothing until it is asked; call them in the triggerer (when the stream
opens, in ``run()``), not in a definitions file's top level, if the
values are only set there.
"""

from __future__ import annotations

import json
from typing import Any

from sharedstream.connections import Connection, get_connection
from sharedstream.engine.keyvalue_log import KeyValueLogger, key_value_logger
from sharedstream.runtime.variables import VariableNotFound, get_variable

__all__ = ["BaseHook", "Variable"]

_NOTSET: Any = object()


class BaseHook:
    """Airflow's hook base class: connection lookup and a logger; subclass for your system.

    A subclass implements :meth:`get_conn` (the client of the system it
    talks to) from :meth:`get_connection`'s fields. ``logger_name`` names
    ``self.log`` (default: the class's module and name).
    """

    def __init__(self, logger_name: str | None = None) -> None:
        self._logger_name = logger_name

    @property
    def log(self) -> KeyValueLogger:
        """The hook's logger (key-values as with a trigger's ``self.log``)."""
        cls = type(self)
        return key_value_logger(self._logger_name or f"{cls.__module__}.{cls.__qualname__}")

    @classmethod
    def get_connection(cls, conn_id: str) -> Connection:
        """Connection ``conn_id``, read now (see :func:`sharedstream.connections.get_connection`).

        Raises :class:`~sharedstream.connections.ConnectionNotFound` when no
        place defines it and
        :class:`~sharedstream.connections.InvalidConnection` when the first
        place that does holds a malformed value.
        """
        return get_connection(conn_id)

    def get_conn(self) -> Any:
        """The client of the hook's system; a subclass implements it."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement get_conn()")


class Variable:
    """Airflow's ``Variable``, read-only: :meth:`get` reads the environment at each call."""

    @classmethod
    def get(cls, key: str, default: Any = _NOTSET, deserialize_json: bool = False, *,
            default_var: Any = _NOTSET) -> Any:
        """The value of variable ``key``, or ``default`` when it is not defined.

        ``deserialize_json=True`` parses the value as JSON (a value that is
        not JSON raises ``ValueError`` naming the key); ``default`` is given
        back as is. ``default_var`` is Airflow 2's name for ``default``.
        Raises :class:`~sharedstream.runtime.variables.VariableNotFound` (a
        ``KeyError``) when the variable is not defined and no default is given.
        """
        if default is _NOTSET:
            default = default_var
        try:
            value = get_variable(key)
        except VariableNotFound:
            if default is _NOTSET:
                raise
            return default
        if not deserialize_json:
            return value
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"variable {key!r} is not JSON: {exc}") from exc
