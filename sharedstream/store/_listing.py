"""The read-only listings behind the CLI and the status views: the same SQL for both stores.

``list_events``, ``list_runs`` and ``dead_letters`` of
:class:`~sharedstream.store.sqlite.SqliteStore` and
:class:`~sharedstream.store.postgres.PostgresStore` are these functions
given the store's reader and its :class:`~sharedstream.store._dag_schedules.Dialect`.
The stores differ in parameter style, stored times and how a subquery
becomes a list: SQLite aggregates it into a JSON array text
(``json_group_array``), PostgreSQL into an ``ARRAY``.

Contracts: newest first (ids descending: ids are never reused); ``limit``
checked first (:func:`~sharedstream.store._rows.check_limit`); every value
is a bound parameter, only constant fragments are concatenated; asset names
come back sorted and distinct, asset event ids ascending.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sharedstream.store._dag_schedules import RUN_COLUMNS, Dialect, timed_fields
from sharedstream.store._rows import DEAD_LETTER_COLUMNS, check_limit, dead_letter_row
from sharedstream.store.base import DeadLetterRow, EventRow, RunRow

__all__ = ["Reader", "dead_letters", "list_events", "list_runs"]

Reader = Callable[[str, Sequence[Any]], list[Any]]
"""A store's ``_read``: run one ``SELECT`` with its parameters, return every row."""

_ASSETS_OF_EVENT = ("a.name", "FROM asset_events ae JOIN assets a ON a.id = ae.asset_id"
                             " WHERE ae.trigger_event_id = te.id")
_EVENTS_OF_RUN = ("l.asset_event_id", "FROM dag_run_asset_events l WHERE l.dag_run_id = r.id")
_ASSETS_OF_RUN = ("a.name", "FROM dag_run_asset_events l"
                            " JOIN asset_events ae ON ae.id = l.asset_event_id"
                            " JOIN assets a ON a.id = ae.asset_id WHERE l.dag_run_id = r.id")


def _where(conditions: Sequence[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """`` WHERE a AND b`` over the conditions whose value is not ``None``, and their values."""
    kept = [(sql, value) for sql, value in conditions if value is not None]
    if not kept:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in kept), [value for _, value in kept]


def _names(dialect: Dialect, value: Any) -> tuple[str, ...]:
    return tuple(sorted({str(name) for name in dialect.items(value)}))


def list_events(
    read: Reader, dialect: Dialect, *, asset: str | None, trigger_id: int | None, limit: int
) -> list[EventRow]:
    """Trigger events, newest first, of one trigger and/or producing an event of one asset."""
    check_limit(limit)
    where, params = _where([
        ("te.trigger_id = ?", trigger_id),
        ("te.id IN (SELECT ae.trigger_event_id FROM asset_events ae"
         " JOIN assets a ON a.id = ae.asset_id WHERE a.name = ?)", asset),
    ])
    sql = (
        "SELECT te.id, te.trigger_id, te.idem_key, te.payload, te.created_at, te.trace_parent, "  # noqa: S608
        + dialect.array(*_ASSETS_OF_EVENT)
        + " FROM trigger_events te" + where + " ORDER BY te.id DESC LIMIT ?"
    )
    return [
        EventRow(
            id=int(row[0]), trigger_id=int(row[1]), idem_key=row[2], payload=bytes(row[3]),
            created_at=dialect.read_time(row[4]), assets=_names(dialect, row[6]),
            trace_parent=row[5],
        )
        for row in read(dialect.sql(sql), [*params, limit])
    ]


def list_runs(
    read: Reader, dialect: Dialect, *, dag_id: str | None, asset: str | None, limit: int
) -> list[RunRow]:
    """DAG runs, newest first, of one DAG and/or consuming an event of one asset."""
    check_limit(limit)
    where, params = _where([
        ("r.dag_id = ?", dag_id),
        ("r.id IN (SELECT l.dag_run_id FROM dag_run_asset_events l"
         " JOIN asset_events ae ON ae.id = l.asset_event_id"
         " JOIN assets a ON a.id = ae.asset_id WHERE a.name = ?)", asset),
    ])
    sql = (
        "SELECT r.id, r.dag_id, r.run_id, r.state, r.created_at, "  # noqa: S608
        + dialect.array(*_EVENTS_OF_RUN) + ", " + dialect.array(*_ASSETS_OF_RUN)
        + f", r.trace_parent, {RUN_COLUMNS} FROM dag_runs r" + where
        + " ORDER BY r.id DESC LIMIT ?"
    )
    runs = []
    for row in read(dialect.sql(sql), [*params, limit]):
        created_at: datetime = dialect.read_time(row[4])
        timed = timed_fields(row[8:], dialect)
        timed["run_after"] = timed["run_after"] or created_at  # an asset-triggered run's
        runs.append(RunRow(
            id=int(row[0]), dag_id=str(row[1]), run_id=str(row[2]), state=str(row[3]),
            created_at=created_at, **timed,
            asset_event_ids=tuple(sorted(int(i) for i in dialect.items(row[5]))),
            assets=_names(dialect, row[6]), trace_parent=row[7],
        ))
    return runs


def dead_letters(
    read: Reader, dialect: Dialect, *, limit: int, stream: str | None
) -> list[DeadLetterRow]:
    """At most ``limit`` kept dead letters, newest first, of one stream or all."""
    check_limit(limit)
    where, params = _where([("stream = ?", stream)])
    sql = f"SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters{where} ORDER BY id DESC LIMIT ?"  # noqa: S608
    return [dead_letter_row(row, dialect.read_time)
            for row in read(dialect.sql(sql), [*params, limit])]
