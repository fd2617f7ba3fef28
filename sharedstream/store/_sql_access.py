"""What the SQL mixins of a store need from the store: its dialect, reads, writes, clock.

:class:`~sharedstream.store._outbox_sql.OutboxSql`,
:class:`~sharedstream.store._replays_sql.ReplaySql` and
:class:`~sharedstream.store._shared_sql.SharedSql` are written once for
SQLite and PostgreSQL against this; each store class gives ``_dialect``,
``_read`` and ``_write`` (and PostgreSQL its own ``_clock``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, ClassVar

from sharedstream.store._dag_schedules import Dialect

__all__ = ["SqlAccess"]


class SqlAccess:
    """The store's own access to its database, as the shared SQL uses it."""

    _dialect: ClassVar[Dialect]

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one ``SELECT`` with its parameters and return every row (the store's own)."""
        raise NotImplementedError

    def _write(self, what: str) -> AbstractContextManager[Any]:
        """One write transaction, its connection yielded (the store's own; see its module)."""
        raise NotImplementedError

    def _clock(self, conn: Any) -> datetime:
        """Now, as the transaction on ``conn`` compares times (overridden by PostgreSQL)."""
        return datetime.now(UTC)

    def _q(self, sql: str) -> str:
        """``sql`` (``?`` placeholders) in the store's dialect."""
        return self._dialect.sql(sql)
