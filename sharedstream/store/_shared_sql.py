"""What both stores do with the same SQL: the reads, and the updates of one trigger.

:class:`SharedSql` is a base of :class:`~sharedstream.store.sqlite.SqliteStore`
and :class:`~sharedstream.store.postgres.PostgresStore`: the triggers,
triggerers, dead letters, events, runs and counts they read, and a
trigger's error and state updates, given the store's ``_read``, its
``_write`` transaction and its :class:`~sharedstream.store._dag_schedules.Dialect`
(``DIALECT`` of its module, as the class attribute ``_dialect``). The stores
differ in parameter style, stored times and how a subquery becomes a list:
SQLite aggregates it into a JSON array text (``json_group_array``),
PostgreSQL into an ``ARRAY``.

Contracts: newest first where it says so (ids descending: ids are never
reused); ``limit`` checked first (:func:`~sharedstream.store._rows.check_limit`);
every value is a bound parameter, only constant fragments are concatenated;
asset names come back sorted and distinct, asset event ids ascending.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NamedTuple, Self

from sharedstream.store._batches import release_batches
from sharedstream.store._dag_schedules import RUN_COLUMNS, Dialect, timed_fields
from sharedstream.store._outbox_sql import OutboxSql
from sharedstream.store._replays_sql import ReplaySql
from sharedstream.store._rows import (
    COUNTS_SQL,
    DEAD_LETTER_COLUMNS,
    TRIGGER_COLUMNS,
    TRIGGERERS_SQL,
    WATCHERS_SQL,
    check_limit,
    counts_of,
    dead_letter_row,
    trigger_row,
    triggerer_row,
    watcher_names,
)
from sharedstream.store.base import (
    TRIGGER_STATES,
    DagSpec,
    DeadLetterRow,
    EventRow,
    RunRow,
    Schedule,
    StoreError,
    TriggererRow,
    TriggerRow,
    TriggerSpec,
    WatcherSpec,
)
from sharedstream.store.outbox import RUN_STATES

__all__ = ["CheckedDefinitions", "SharedSql", "check_definitions"]

_ASSETS_OF_EVENT = ("a.name", "FROM asset_events ae JOIN assets a ON a.id = ae.asset_id"
                             " WHERE ae.trigger_event_id = te.id")
_EVENTS_OF_RUN = ("l.asset_event_id", "FROM dag_run_asset_events l WHERE l.dag_run_id = r.id")
_DISPATCH_COLUMNS = ("r.target, r.attempts, r.last_error, r.external_id, r.external_url,"
                     " r.dispatched_at, r.ended_at, r.conf")
_ASSETS_OF_RUN = ("a.name", "FROM dag_run_asset_events l"
                            " JOIN asset_events ae ON ae.id = l.asset_event_id"
                            " JOIN assets a ON a.id = ae.asset_id WHERE l.dag_run_id = r.id")


def _where(conditions: Sequence[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """`` WHERE a AND b`` over the conditions whose value is not ``None``, and their values."""
    kept = [(sql, value) for sql, value in conditions if value is not None]
    if not kept:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in kept), [value for _, value in kept]


def _caused_by(trigger_id: int) -> str:
    """The ``LIKE`` pattern of a ``triggers`` list naming ``trigger_id``.

    The column is a JSON list of ids as text (``["3", "12"]``); an id is
    digits, so the quoted id matches that element and no other.
    """
    return f'%"{int(trigger_id)}"%'


def _names(dialect: Dialect, value: Any) -> tuple[str, ...]:
    return tuple(sorted({str(name) for name in dialect.items(value)}))


class CheckedDefinitions(NamedTuple):
    """What ``sync_definitions`` writes, checked before its transaction starts."""

    specs: dict[str, TriggerSpec]
    """By fingerprint; the last spec wins for a repeated one."""
    referenced: set[str]
    """Fingerprints of the triggers some watcher uses (these are active)."""
    schedules: dict[str, Schedule]
    """Parsed asset schedules by DAG id (a DAG only time schedules has none)."""
    asset_names: list[str]
    """Every asset a watcher or a schedule names, sorted."""


def check_definitions(
    triggers: Sequence[TriggerSpec], watchers: Sequence[WatcherSpec], dags: Sequence[DagSpec]
) -> CheckedDefinitions:
    """Check the definitions ``sync_definitions`` is given, for both stores.

    Raises :class:`StoreError` for a watcher naming a trigger not in
    ``triggers``, a repeated watcher ``(asset, name)`` or ``dag_id``, or an
    invalid schedule.
    """
    specs = {spec.fingerprint: spec for spec in triggers}
    referenced: set[str] = set()
    seen_watchers: set[tuple[str, str]] = set()
    for watcher in watchers:
        if watcher.trigger_fingerprint not in specs:
            raise StoreError(
                f"watcher {watcher.name!r} of asset {watcher.asset!r} references trigger"
                f" {watcher.trigger_fingerprint!r}, which is not among the triggers given"
            )
        if (watcher.asset, watcher.name) in seen_watchers:
            raise StoreError(f"asset {watcher.asset!r} has two watchers named {watcher.name!r}")
        seen_watchers.add((watcher.asset, watcher.name))
        referenced.add(watcher.trigger_fingerprint)
    schedules: dict[str, Schedule] = {}
    seen_dags: set[str] = set()
    for dag in dags:
        if dag.dag_id in seen_dags:
            raise StoreError(f"dag {dag.dag_id!r} is defined twice")
        seen_dags.add(dag.dag_id)
        if dag.schedule is not None:  # None: only time schedules it
            schedules[dag.dag_id] = Schedule.parse(
                dag.schedule, where=f"dag {dag.dag_id!r}: schedule"
            )
    asset_names = sorted({w.asset for w in watchers}.union(
        *(schedule.assets for schedule in schedules.values())
    ))
    return CheckedDefinitions(specs, referenced, schedules, asset_names)


class SharedSql(OutboxSql, ReplaySql):
    """The SQL both stores share; a subclass gives ``_dialect``, ``_read`` and ``_write``.

    The dispatch methods come from :class:`~sharedstream.store._outbox_sql.OutboxSql`,
    the replay methods from :class:`~sharedstream.store._replays_sql.ReplaySql`.
    """

    def close(self) -> None:
        """Release the store's connections (the store's own; idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _update_one_trigger(self, what: str, sql: str, params: Sequence[Any]) -> None:
        """Run an ``UPDATE`` (``?`` placeholders) that must change exactly one trigger."""
        with self._write(what) as conn:
            if conn.execute(self._dialect.sql(sql), params).rowcount != 1:
                raise StoreError(f"no trigger with id {params[-1]}")

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """:meth:`_read` of ``sql`` written with ``?`` placeholders."""
        return self._read(self._dialect.sql(sql), params)

    # -- triggers and triggerers -------------------------------------------------

    def active_triggers(self, limit: int) -> list[TriggerRow]:
        """At most ``limit`` triggers in state ``active``, by id."""
        check_limit(limit)
        rows = self._rows(
            f"SELECT {TRIGGER_COLUMNS} FROM triggers WHERE state = 'active' ORDER BY id LIMIT ?",  # noqa: S608
            (limit,),
        )
        return [trigger_row(row, self._dialect.read_time) for row in rows]

    def get_trigger(self, trigger_id: int) -> TriggerRow | None:
        """The trigger with this id, or ``None``."""
        rows = self._rows(f"SELECT {TRIGGER_COLUMNS} FROM triggers WHERE id = ?", (trigger_id,))  # noqa: S608
        return trigger_row(rows[0], self._dialect.read_time) if rows else None

    def list_triggers(self) -> list[TriggerRow]:
        """Every trigger, by id, with the ``asset/watcher`` names that use it."""
        rows = self._read(f"SELECT {TRIGGER_COLUMNS} FROM triggers ORDER BY id")  # noqa: S608
        watchers = watcher_names(self._read(WATCHERS_SQL))
        return [trigger_row(row, self._dialect.read_time, watchers.get(int(row[0]), ()))
                for row in rows]

    def record_trigger_error(self, trigger_id: int, message: str, traceback: str) -> None:
        """Count one error and remember it as the last; :class:`StoreError` for an unknown id."""
        now = self._dialect.write_time(datetime.now(UTC))
        self._update_one_trigger(
            "record_trigger_error",
            "UPDATE triggers SET error_count = error_count + 1, last_error = ?,"
            " last_traceback = ?, last_error_at = ? WHERE id = ?",
            (message, traceback, now, trigger_id),
        )

    def clear_trigger_error(self, trigger_id: int) -> None:
        """Forget the last error's text and traceback; its count and time stay.

        :class:`StoreError` for an unknown id.
        """
        self._update_one_trigger(
            "clear_trigger_error",
            "UPDATE triggers SET last_error = NULL, last_traceback = NULL WHERE id = ?",
            (trigger_id,),
        )

    def set_trigger_state(self, trigger_id: int, state: str) -> None:
        """Set the state of an existing trigger.

        :class:`StoreError` for a state outside :data:`TRIGGER_STATES` or an
        unknown id.
        """
        if state not in TRIGGER_STATES:
            raise StoreError(
                f"trigger state must be one of {sorted(TRIGGER_STATES)}, got {state!r}"
            )
        self._update_one_trigger("set_trigger_state", "UPDATE triggers SET state = ? WHERE id = ?",
                                 (state, trigger_id))

    def sign_off(self, triggerer_id: str) -> None:
        """Give up every trigger ``triggerer_id`` owns and delete its row; idempotent."""
        with self._write("sign_off") as conn:
            conn.execute(self._dialect.sql(
                "UPDATE triggers SET triggerer_id = NULL WHERE triggerer_id = ?"), (triggerer_id,))
            conn.execute(self._dialect.sql("DELETE FROM triggerers WHERE id = ?"),
                         (triggerer_id,))

    def triggerers(self) -> list[TriggererRow]:
        """Every triggerer that ever sent a heartbeat, by id."""
        return [triggerer_row(row, self._dialect.read_time) for row in self._read(TRIGGERERS_SQL)]

    def mark_redriven(self, ids: Sequence[int]) -> int:
        """Record that these dead letters were re-driven now; how many there were."""
        if not ids:
            return 0
        d = self._dialect
        with self._write("mark_redriven") as conn:
            return int(conn.execute(self._dialect.sql(
                "UPDATE dead_letters SET redriven_at = ?, redrives = redrives + 1"  # noqa: S608
                f" WHERE {d.one_of('id')}"),
                (d.write_time(datetime.now(UTC)), d.bind_list(sorted(set(ids))))).rowcount)

    def release_batches(self) -> list[str]:
        """Make the due runs of batched DAGs, in one transaction (:mod:`._batches`)."""
        with self._write("release_batches") as conn:
            return release_batches(conn, self._dialect, datetime.now(UTC))

    # -- failures of raw events -------------------------------------------------

    def add_raw_failures(self, names: Sequence[str]) -> None:
        """Count one more failure against each raw event in ``names`` (twice if listed twice)."""
        if not names:
            return
        d = self._dialect
        now = d.write_time(datetime.now(UTC))
        with self._write("add_raw_failures") as conn:
            for name, count in sorted(Counter(names).items()):
                conn.execute(d.sql(
                    "INSERT INTO raw_event_failures (name, failures, updated_at) VALUES (?, ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET"
                    " failures = raw_event_failures.failures + excluded.failures,"
                    " updated_at = excluded.updated_at"), (name, count, now))

    def raw_failures(self, names: Sequence[str]) -> dict[str, int]:
        """The failures counted against those of ``names`` that have any."""
        if not names:
            return {}
        d = self._dialect
        rows = self._rows(f"SELECT name, failures FROM raw_event_failures WHERE {d.one_of('name')}",  # noqa: S608
                          (d.bind_list(sorted(set(names))),))
        return {str(name): int(failures) for name, failures in rows}

    # -- dead letters, events, runs, counts ---------------------------------------

    def dead_letters(self, limit: int, *, stream: str | None = None,
                     ids: Sequence[int] | None = None) -> list[DeadLetterRow]:
        """At most ``limit`` kept dead letters, newest first, of one stream and/or ``ids``."""
        check_limit(limit)
        d = self._dialect
        where, params = _where([("stream = ?", stream), (
            d.one_of("id"), None if ids is None else d.bind_list(sorted(set(ids))))])
        sql = f"SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters{where} ORDER BY id DESC LIMIT ?"  # noqa: S608
        return [dead_letter_row(row, self._dialect.read_time)
                for row in self._rows(sql, [*params, limit])]

    def dead_letters_of(self, trigger_id: int, limit: int, *, after: int = 0,
                        before: int | None = None) -> list[DeadLetterRow]:
        """At most ``limit`` letters ``trigger_id`` caused, by id, ids in ``(after, before)``."""
        check_limit(limit)
        where, params = _where([("triggers LIKE ?", _caused_by(trigger_id)), ("id > ?", after),
                                ("id < ?", before)])
        sql = f"SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters{where} ORDER BY id LIMIT ?"  # noqa: S608
        return [dead_letter_row(row, self._dialect.read_time)
                for row in self._rows(sql, [*params, limit])]

    def dead_letter_span(self, trigger_id: int) -> tuple[int, int] | None:
        """The first and last ids of the dead letters ``trigger_id`` caused; ``None``: none."""
        [(first, last)] = self._rows("SELECT min(id), max(id) FROM dead_letters"
                                     " WHERE triggers LIKE ?", (_caused_by(trigger_id),))
        return None if first is None else (int(first), int(last))

    def list_events(
        self, *, asset: str | None = None, trigger_id: int | None = None, limit: int = 100
    ) -> list[EventRow]:
        """Trigger events, newest first, optionally of one trigger and/or one asset.

        ``asset`` keeps the events that produced an asset event of that asset.
        """
        check_limit(limit)
        dialect = self._dialect
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
            for row in self._rows(sql, [*params, limit])
        ]

    def list_runs(
        self, *, dag_id: str | None = None, asset: str | None = None,
        state: str | None = None, run_id: str | None = None, limit: int = 100,
    ) -> list[RunRow]:
        """DAG runs, newest first, optionally of one DAG, one state, consuming one asset's events.

        ``run_id`` keeps the runs of that id (one per DAG). ``ValueError`` for
        a ``state`` outside :data:`~sharedstream.store.outbox.RUN_STATES`.
        """
        check_limit(limit)
        if state is not None and state not in RUN_STATES:
            raise ValueError(f"no run state {state!r} (one of: {', '.join(RUN_STATES)})")
        dialect = self._dialect
        where, params = _where([
            ("r.dag_id = ?", dag_id),
            ("r.state = ?", state),
            ("r.run_id = ?", run_id),
            ("r.id IN (SELECT l.dag_run_id FROM dag_run_asset_events l"
             " JOIN asset_events ae ON ae.id = l.asset_event_id"
             " JOIN assets a ON a.id = ae.asset_id WHERE a.name = ?)", asset),
        ])
        sql = (
            "SELECT r.id, r.dag_id, r.run_id, r.state, r.created_at, "  # noqa: S608
            + dialect.array(*_EVENTS_OF_RUN) + ", " + dialect.array(*_ASSETS_OF_RUN)
            + f", r.trace_parent, {RUN_COLUMNS}, {_DISPATCH_COLUMNS} FROM dag_runs r" + where
            + " ORDER BY r.id DESC LIMIT ?"
        )
        runs = []
        when = dialect.when
        for row in self._rows(sql, [*params, limit]):
            created_at: datetime = dialect.read_time(row[4])
            timed = timed_fields(row[8:13], dialect)
            timed["run_after"] = timed["run_after"] or created_at  # an asset-triggered run's
            target, attempts, error, external_id, url, dispatched, ended, conf = row[13:]
            runs.append(RunRow(
                id=int(row[0]), dag_id=str(row[1]), run_id=str(row[2]), state=str(row[3]),
                created_at=created_at, **timed,
                asset_event_ids=tuple(sorted(int(i) for i in dialect.items(row[5]))),
                assets=_names(dialect, row[6]), trace_parent=row[7],
                target=target, attempts=int(attempts), last_error=error,
                external_id=external_id, external_url=url, dispatched_at=when(dispatched),
                ended_at=when(ended), conf=None if conf is None else json.loads(conf),
            ))
        return runs

    def counts(self) -> dict[str, int]:
        """Row counts under the keys triggers, trigger_events, asset_events, dag_runs."""
        (row,) = self._read(COUNTS_SQL)
        return counts_of(row)
