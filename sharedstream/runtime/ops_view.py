"""What the operations endpoint reports about a running triggerer: readiness and status.

:class:`TriggererView` reads a :class:`~sharedstream.runtime.ops_base.ObservedTriggerer`
for :mod:`sharedstream.runtime.api` (and ``sharedstream status``). It holds
no state of its own beyond a cache of trigger names, and changes nothing it
reads.

Invariants:

1. Every read happens on the triggerer's event loop (the HTTP handlers run
   there), so the engine's books, groups and counters are read between two
   steps of the loop, never while they change. Store reads go through the
   triggerer's single database thread, each bounded by ``store_timeout``.
2. Nothing secret leaves: no trigger kwargs, no connection settings. A
   stream is shown by its name (:mod:`sharedstream.engine.names`: topic,
   queue or subscription and group, a digest of its key where two would
   otherwise agree; never the key, which may hold bootstrap servers or an
   endpoint), plus the watchers that use it; the store's URL is redacted;
   dead letters are listed without their bodies or headers.
3. Cost: a status or a check walks the live groups once (O(streams +
   members + lanes)) and asks the store a bounded number of small queries;
   nothing runs per raw event.

Readiness (:meth:`TriggererView.readiness`) is three checks, each named in
the answer: ``store`` (the store answers a read and the gate's writes are
not failing), ``streams`` (every shared stream with members has a live
poll: its producer is built, its consumer open, its poll not ended and
waiting for a restart), and ``watchers`` (no stream's oldest unresolved raw
event is older than the ack timeout: nobody is stuck); a fourth,
``dispatch``, while the triggerer dispatches runs
(:mod:`sharedstream.runtime.ops_dispatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any

from sharedstream.engine.names import broker_word, stream_name
from sharedstream.runtime.ops_backlog import PENDING, BacklogPoller, BacklogReading
from sharedstream.runtime.ops_base import Check, ObservedTriggerer
from sharedstream.runtime.ops_dispatch import dispatch_check, dispatch_status
from sharedstream.runtime.replays import replay_record
from sharedstream.store import redact_url
from sharedstream.store.replays import ReplayRow

__all__ = [
    "RECENT",
    "Check",
    "TriggererView",
    "backlog_record",
    "lane_label",
    "letter_record",
    "run_record",
    "stream_label",
    "trigger_record",
    "watcher_counts",
]

STORE_TIMEOUT = 5.0
"""Seconds a store read of a check or a status may take before it counts as failed."""

RECENT = 20
"""Dead letters and DAG runs a status lists (the newest)."""

_LABEL_LIMIT = 120


def stream_label(key: Hashable) -> str:
    """The stream's name, as in its log lines and dead letters: ``kafka orders (group g)``.

    The metrics' and the status's ``stream`` (see
    :mod:`sharedstream.engine.names`): the same across restarts for the
    same definitions, and never the key itself, which may hold connection
    details.
    """
    return stream_name(key)


def lane_label(lane: Hashable) -> str:
    """A lane (a partition, a message group) as text, cut to a bounded length."""
    text = "/".join(map(str, lane)) if isinstance(lane, tuple) else str(lane)
    return text if len(text) <= _LABEL_LIMIT else text[: _LABEL_LIMIT - 3] + "..."


class TriggererView:
    """Read-only views of one running triggerer (see the module docstring).

    Built by the endpoint when the triggerer starts it. Every method must
    be called on the triggerer's event loop.
    """

    def __init__(self, triggerer: ObservedTriggerer, *, store_timeout: float = STORE_TIMEOUT,
                 backlog: BacklogPoller | None = None) -> None:
        self._triggerer = triggerer
        self.backlog = backlog
        """Where the brokers' backlog readings come from (``None``: every stream ``pending``)."""
        self._store_timeout = store_timeout
        self._names: dict[int, tuple[str, ...]] = {}  # trigger id -> its asset/watcher names

    def names(self, trigger_id: Hashable) -> tuple[str, ...]:
        """The ``asset/watcher`` names of a trigger, as last read from the store."""
        return self._names.get(_int(trigger_id), ())

    async def refresh_names(self) -> None:
        """Read every trigger's watcher names from the store (start-up, each status)."""
        errors: dict[str, str] = {}
        rows = await self._read(errors, "triggers", self._triggerer.store.list_triggers)
        for row in rows or []:
            self._names[row.id] = row.watchers

    # -- readiness -------------------------------------------------------------------

    async def readiness(self) -> list[Check]:
        """The checks: store, streams, watchers, and dispatch while runs are dispatched."""
        checks = [await self._store_check(), self._streams_check(), self._stuck_check()]
        dispatcher = self._dispatcher()
        if dispatcher is not None:
            checks.append(dispatch_check(dispatcher))
        return checks

    def _dispatcher(self) -> Any:
        service = self._triggerer.dispatch
        return None if service is None else service.dispatcher

    async def _store_check(self) -> Check:
        triggerer = self._triggerer
        if triggerer.gate.store_failing:
            return Check("store", False, "writes to the store are failing (being retried)")
        try:
            async with asyncio.timeout(self._store_timeout):
                await triggerer.db(triggerer.store.schema_status)  # its database thread
        except TimeoutError:
            return Check("store", False, f"no answer within {self._store_timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - whatever the store raised is the answer
            return Check("store", False, f"{type(exc).__name__}: {exc}")
        return Check("store", True, "answers")

    def _streams_check(self) -> Check:
        down, away = [], []
        for key, group, members in self._triggerer.manager.streams():
            if members and group is None:
                down.append(stream_label(key))
            elif group is not None and group.connected() is False:
                away.append(stream_label(key))
        problems = ([f"restarting: {', '.join(down)}"] if down else []) + (
            [f"not connected to the broker: {', '.join(away)}"] if away else [])
        if problems:
            return Check("streams", False, "; ".join(problems))
        return Check("streams", True, "every stream is polling")

    def _stuck_check(self) -> Check:
        manager = self._triggerer.manager
        limit = manager.ack_timeout
        stuck = []
        for key, group, _members in manager.streams():
            age = _oldest_age(group)
            if age is not None and age > limit:
                stuck.append(f"{stream_label(key)} ({age:.0f}s)")
        if stuck:
            return Check("watchers", False,
                         f"unresolved past the ack timeout ({limit:g}s): " + ", ".join(stuck))
        return Check("watchers", True, "none stuck")

    # -- status ----------------------------------------------------------------------

    def streams(self) -> list[dict[str, Any]]:
        """Every stream in use: label, live, watchers with their lag, lanes, oldest age.

        ``broker_backlog`` is the broker's own backlog (see :func:`backlog_record`).
        """
        now = self.backlog.clock() if self.backlog is not None else 0.0
        result = []
        for key, group, members in self._triggerer.manager.streams():
            queued = group.queued() if group is not None else {}
            book = group.book if group is not None else None
            lanes = book.lanes_snapshot() if book is not None else []
            ids = sorted({*members, *queued}, key=str)
            result.append({
                "stream": stream_label(key),
                "broker": broker_word(key),
                "live": group is not None,
                "connected": group.connected() if group is not None else False,
                "ack_mode": group.ack_mode if group is not None else None,
                "outstanding": book.outstanding() if book is not None else 0,
                "paused_seconds": dict(group.paused) if group is not None else {},
                "oldest_unresolved_age": _oldest_age(group) or 0.0,
                "lanes": [{"lane": lane_label(lane), "outstanding": n} for lane, n in lanes],
                "broker_backlog": backlog_record(
                    self.backlog.reading(key) if self.backlog is not None else PENDING, now),
                "watchers": [{"trigger": trigger_id, "names": list(self.names(trigger_id)),
                              "queued": queued.get(trigger_id, 0),
                              **watcher_counts(group, trigger_id)}
                             for trigger_id in ids],
            })
        return result

    async def status(self) -> dict[str, Any]:
        """The whole overview: triggerer, totals, streams, watchers, dead letters, DAG runs.

        Store reads that fail leave their part out and say why under
        ``"errors"``; the live parts are always there.
        """
        triggerer = self._triggerer
        errors: dict[str, str] = {}
        triggers = await self._read(errors, "triggers", triggerer.store.list_triggers)
        for row in triggers or []:
            self._names[row.id] = row.watchers
        letters = await self._read(errors, "dead_letters", triggerer.store.dead_letters, RECENT)
        runs = await self._read(errors, "dag_runs", triggerer.store.list_runs)
        replays = await self._read(errors, "replays", triggerer.store.list_replays, RECENT)
        gate, totals, progress = triggerer.gate, triggerer.manager.totals, triggerer.progress
        return {
            "triggerer": {
                "id": triggerer.triggerer_id,
                "store": redact_url(triggerer.config.store.url),
                "intake": sorted(triggerer.manager.intake.reasons) or "open",
                "triggers_running": progress.running,
            },
            "totals": {
                "events_stored": gate.stored, "duplicates": gate.duplicates,
                "dag_runs_queued": triggerer.runs_queued, "store_queue": gate.queued,
                "store_write_retries": gate.failed_writes, "raw_events_advanced": totals.advanced,
                "clean": totals.clean, "failed": totals.failed, "rejected": totals.rejected,
                "dead_lettered": totals.dead_lettered,
                "dead_letter_fallbacks": progress.fallbacks, "refused": progress.refused,
                "restarts": progress.restarts,
            },
            "streams": self.streams(),
            "watchers": [trigger_record(row) for row in triggers or []],
            "dead_letters": [letter_record(row) for row in letters or []][:RECENT],
            "dag_runs": [run_record(row) for row in runs or []][:RECENT],
            "dispatch": self._dispatch_status(),
            "replays": [self._replay(row) for row in replays or []],
            "errors": errors,
        }

    def _replay(self, row: ReplayRow) -> dict[str, Any]:
        """A replay's record, with its rate when this triggerer runs it now."""
        record = replay_record(row)
        loop = self._triggerer.replays
        current = None if loop is None else loop.current
        if current is not None and current.row.id == row.id:
            progress = current.progress
            record.update(done=progress.done, new_events=progress.stored,
                          already_stored=progress.matched - progress.stored,
                          rejected=progress.rejected, rate=round(current.rate(), 1))
            if row.total:
                record["percent"] = round(100 * progress.done / row.total, 1)
        return record

    def _dispatch_status(self) -> list[dict[str, Any]]:
        dispatcher = self._dispatcher()
        if dispatcher is None:
            return []
        return dispatch_status(dispatcher)

    async def _read(self, errors: dict[str, str], part: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the database thread, or ``None`` with the reason in ``errors``."""
        try:
            async with asyncio.timeout(self._store_timeout):
                return await self._triggerer.db(fn, *args)  # its database thread
        except TimeoutError:
            errors[part] = f"the store did not answer within {self._store_timeout:g}s"
        except Exception as exc:  # noqa: BLE001 - a status shows what it could read
            errors[part] = f"{type(exc).__name__}: {exc}"
        return None


def watcher_counts(group: Any, trigger_id: Hashable) -> dict[str, Any]:
    """Why a watcher fired or not, in its stream's current poll (zeros while there is none).

    ``seen``: raw events broadcast to the stream since it joined;
    ``skipped``: those of them its prefilter declined (they never reached
    its filter); ``emitted``: trigger events its filter yielded;
    ``rejected``: raw events it rejected, and ``last_reject`` the last
    reason; ``failed``: attempts of its filter that failed (raised, hung
    past the ack timeout, or ended). Kept by the engine's resolution book
    and fan-out at the cost of one integer add per raw event (``seen``), per
    raw event handed to a prefiltered stream's watchers (``skipped``) and
    per emitted event; ack mode only.
    """
    book: Any = group.book if group is not None else None
    sub = book.subscribers.get(trigger_id) if book is not None else None
    if sub is None:
        return {"seen": 0, "skipped": 0, "emitted": 0, "rejected": 0, "last_reject": None,
                "failed": 0}
    return {"seen": book.broadcasts - sub.joined_at, "skipped": book.fanout.declined(sub),
            "emitted": sub.matched, "rejected": sub.rejected, "last_reject": sub.last_reject,
            "failed": sub.failed_attempts}


def _oldest_age(group: Any) -> float | None:
    """Seconds the group's oldest unresolved raw event has waited (``None``: none, fast path)."""
    book = group.book if group is not None else None
    if book is None:
        return None
    since = book.oldest_unresolved_at()
    return None if since is None else max(0.0, book.clock() - since)


def _int(value: Hashable) -> int:
    return value if isinstance(value, int) else -1


def _time(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with its offset (``...+00:00``), as a status's JSON carries times."""
    return None if value is None else value.astimezone(UTC).isoformat()


def backlog_record(reading: BacklogReading, now: float) -> dict[str, Any]:
    """A stream's broker backlog as a status shows it.

    ``state`` (``ok``, ``n/a``, ``unknown``, ``pending``: see
    :data:`~sharedstream.runtime.ops_backlog.BacklogState`), ``lanes`` (one
    entry per lane: its label and a count per kind; empty unless ``ok``),
    ``detail`` (why not ``ok``) and ``age_seconds`` (since the reading;
    ``None`` while ``pending``). ``now`` is on the poller's clock.
    """
    return {
        "state": reading.state,
        "lanes": [{"lane": lane_label(lane), **kinds}
                  for lane, kinds in sorted(reading.lanes.items())],
        "detail": reading.detail,
        "age_seconds": (None if reading.state == "pending"
                        else round(max(0.0, now - reading.at), 1)),
    }


def trigger_record(row: Any) -> dict[str, Any]:
    """A stored trigger (:class:`~sharedstream.store.TriggerRow`) as a status shows it."""
    return {"trigger": row.id, "names": list(row.watchers), "state": row.state,
            "class": row.classpath, "events_stored": row.events_stored,
            "errors": row.error_count, "last_error": row.last_error,
            "last_error_at": _time(row.last_error_at)}


def letter_record(row: Any) -> dict[str, Any]:
    """A kept dead letter as a status shows it: never its body or headers."""
    return {"id": row.id, "at": _time(row.created_at), "stream": row.stream,
            "source": row.source, "reason": row.reason, "triggers": list(row.triggers),
            "size": row.payload_size}


def run_record(row: Any) -> dict[str, Any]:
    """A DAG run as a status shows it."""
    return {"dag": row.dag_id, "run_id": row.run_id, "state": row.state,
            "type": row.run_type, "at": _time(row.created_at), "assets": list(row.assets),
            "trace_parent": row.trace_parent, "target": row.target, "attempts": row.attempts,
            "last_error": row.last_error}
