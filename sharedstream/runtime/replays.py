"""Asking for a replay and showing one: what the CLI and the operations endpoint share.

A replay is named by its *watcher* (``asset/watcher``, or the watcher's
name alone when no other asset has a watcher of that name) and starts
``--from`` a time or offsets:

- a time: ISO 8601 with a date (``2026-11-27``, ``2026-11-27T08:00``,
  ``2026-11-27T08:00:00+01:00``; without an offset it is UTC), or an age
  such as ``24h``, ``90m``, ``2d`` (that long ago);
- offsets: ``PARTITION:OFFSET`` items, comma-separated (``0:120,1:300``),
  or ``TOPIC/PARTITION:OFFSET`` when the stream reads several topics;
  partitions not named replay nothing.

``--to`` (optional) is a time in the same forms: the replay stops before the
first message after it. Instead of ``--from``, ``--dead-letters`` replays
the dead letters the watcher caused, as the store keeps them (SQS, Service
Bus; see :mod:`sharedstream.runtime.replay_deadletters`). What the request
becomes is the store's row
(:mod:`sharedstream.store.replays`); a triggerer serving the watcher runs it
(:mod:`sharedstream.runtime.replay_loop`).
"""

from __future__ import annotations

import difflib
import re
from datetime import UTC, datetime
from typing import Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime import config_options
from sharedstream.store import MetadataStore
from sharedstream.store.replays import ReplayRow

__all__ = ["ReplayRequestError", "ask_replay", "parse_start", "parse_time", "replay_record",
           "resolve_watcher"]

_OFFSETS = re.compile(r"(?:[^,:/\s]+/)?\d+:\d+(?:,(?:[^,:/\s]+/)?\d+:\d+)*")


class ReplayRequestError(SharedStreamError):
    """A replay asked for with a bad watcher, time or offsets: one line naming it."""


def parse_time(text: str, *, now: datetime | None = None, what: str = "--from") -> datetime:
    """An ISO 8601 time with a date (UTC when it has no offset) or an age ago (``24h``)."""
    now = now or datetime.now(UTC)
    try:
        return now - config_options.parse_age(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReplayRequestError(
            f"{what} {text!r} is not a time: give a date and time (2026-11-27T08:00, UTC unless "
            "it says otherwise), an age (24h, 90m, 2d) or, for --from, offsets "
            "(0:120,1:300)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def parse_start(text: str, *, now: datetime | None = None) -> dict[str, Any]:
    """``--from``: ``{"from": ISO time}`` or ``{"offsets": {lane: offset}}``."""
    compact = text.replace(" ", "")
    if _OFFSETS.fullmatch(compact):
        offsets: dict[str, int] = {}
        for item in compact.split(","):
            lane, _, offset = item.rpartition(":")
            if lane in offsets:
                raise ReplayRequestError(f"--from names partition {lane} twice")
            offsets[lane] = int(offset)
        return {"offsets": offsets}
    return {"from": parse_time(text, now=now).isoformat()}


def resolve_watcher(store: MetadataStore, name: str) -> tuple[int, str]:
    """``(trigger id, "asset/watcher")`` of the watcher ``name`` names; one line if none or many."""
    known: dict[str, int] = {}
    for row in store.list_triggers():
        for watcher in row.watchers:
            known[watcher] = row.id
    if name in known:
        return known[name], name
    by_name = [full for full in known if full.partition("/")[2] == name]
    if len(by_name) == 1:
        return known[by_name[0]], by_name[0]
    if by_name:
        raise ReplayRequestError(f"watcher {name!r} is ambiguous: say which, "
                                 f"{' or '.join(sorted(by_name))}")
    near = difflib.get_close_matches(name, list(known), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else (
        f" (the watchers: {', '.join(sorted(known))})" if known else
        " (the store has no watchers: has a triggerer registered the definitions?)")
    raise ReplayRequestError(f"no watcher {name!r}{hint}")


def ask_replay(store: MetadataStore, watcher: str, start: str | None,
               until: str | None = None, *, dead_letters: bool = False,
               now: datetime | None = None) -> ReplayRow:
    """Check the request and write it as a ``pending`` replay; the row.

    Exactly one of ``start`` (``--from``) and ``dead_letters``; ``until``
    only with ``start``.
    """
    if dead_letters and (start is not None or until is not None):
        raise ReplayRequestError("--dead-letters replays the watcher's dead letters: it takes "
                                 "no --from or --to")
    if not dead_letters and start is None:
        raise ReplayRequestError("say where the replay starts: --from TIME|OFFSETS, or "
                                 "--dead-letters")
    trigger_id, full = resolve_watcher(store, watcher)
    if start is None:
        return _written(store, trigger_id, full, {"dead_letters": True})
    request = parse_start(start, now=now)
    if until is not None:
        end = parse_time(until, now=now, what="--to")
        begin = request.get("from")
        if begin is not None and end <= datetime.fromisoformat(begin):
            raise ReplayRequestError(f"--to ({end.isoformat()}) is not after --from ({begin})")
        request["to"] = end.isoformat()
    return _written(store, trigger_id, full, request)


def _written(store: MetadataStore, trigger_id: int, watcher: str,
             request: dict[str, Any]) -> ReplayRow:
    replay_id = store.create_replay(trigger_id, watcher, request)
    row = store.get_replay(replay_id)
    assert row is not None  # noqa: S101 - just written
    return row


def replay_record(row: ReplayRow) -> dict[str, Any]:
    """Everything ``watchers replays --json`` and ``/replays`` say of a replay."""
    percent = None if not row.total else round(100 * row.done / row.total, 1)
    return {
        "id": row.id, "watcher": row.watcher, "trigger": row.trigger_id, "state": row.state,
        "request": dict(row.request), "done": row.done, "total": row.total, "percent": percent,
        "new_events": row.stored, "already_stored": row.matched - row.stored,
        "rejected": row.rejected, "triggerer": row.triggerer_id, "error": row.error,
        "plan": None if row.plan is None else {k: list(v) for k, v in row.plan.items()},
        "positions": dict(row.positions), "created_at": row.created_at,
        "updated_at": row.updated_at, "finished_at": row.finished_at,
    }
