"""``sharedstream watchers ...``: the watchers, and replaying a stream for one of them.

``watchers list`` shows every watcher with its trigger and its active
replay; ``watchers replay WATCHER --from TIME|OFFSETS [--to TIME]`` (or
``--dead-letters``: the dead letters the watcher caused) asks for a
replay (a row in the store that a triggerer serving the watcher claims
and runs, see :mod:`sharedstream.runtime.replay_loop`) and follows
its progress until it ends (``--detach``: print its id and return at once;
Ctrl-C stops following, not the replay); ``watchers replays`` lists
replays; ``watchers cancel-replay ID`` cancels one. Mistakes are one line
and exit status 2; a replay that fails or is cancelled while followed
exits 1.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from sharedstream.runtime.cli_output import cell, emit, open_migrated_store, positive
from sharedstream.runtime.config import Config
from sharedstream.runtime.replays import ask_replay, replay_record
from sharedstream.store import MetadataStore
from sharedstream.store.replays import ReplayRow

__all__ = ["add_watcher_commands", "progress_line"]

FOLLOW_EVERY = 1.0
"""Seconds between two looks at a followed replay."""
QUIET_FOR = 10.0
"""A followed replay whose progress did not change says so at least this often."""


def add_watcher_commands(commands: Any, anywhere: argparse.ArgumentParser) -> None:
    """Add ``watchers list|replay|replays|cancel-replay`` to the CLI's ``commands``."""
    watchers = commands.add_parser(
        "watchers", help="the watchers; replay a stream for one of them")
    verbs = type(commands)(watchers.add_subparsers(title="actions", required=True,
                                                   metavar="ACTION"), anywhere)
    listing = verbs.add_parser("list", help="every watcher: its trigger, events, replay")
    listing.add_argument("--json", action="store_true", help="one JSON document on stdout")
    listing.set_defaults(handler=_list)

    replay = verbs.add_parser(
        "replay", help="feed one watcher the messages it missed, without the others",
        description="Read a bounded part of WATCHER's stream again and feed it to that "
                    "watcher alone (Kafka), up to where the live consumer's commits are: "
                    "its other watchers, the live consumer and its commits are untouched, "
                    "and what the watcher stored already is not stored again. With "
                    "--dead-letters, the dead letters the watcher caused (kept in the store) "
                    "are fed to it alone instead.")
    replay.add_argument("watcher", metavar="WATCHER",
                        help="asset/watcher, or the watcher's name if no other asset uses it")
    start = replay.add_mutually_exclusive_group(required=True)
    start.add_argument("--from", dest="start", metavar="TIME|OFFSETS",
                       help="a time (2026-11-27T08:00, UTC unless it says; or an age: 24h, "
                            "90m, 2d) or offsets (0:120,1:300; topic/0:120 with several "
                            "topics)")
    start.add_argument("--dead-letters", action="store_true",
                       help="replay the dead letters the watcher caused, as the store keeps "
                            "them (SQS, Service Bus)")
    replay.add_argument("--to", dest="until", metavar="TIME",
                        help="stop before the first message after this time (default: where "
                             "the live consumer is)")
    replay.add_argument("--detach", action="store_true",
                        help="print the replay's id and return; do not follow it")
    replay.set_defaults(handler=_replay)

    replays = verbs.add_parser("replays", help="list replays, newest first")
    replays.add_argument("--json", action="store_true", help="one JSON document on stdout")
    replays.add_argument("--limit", type=positive, default=20,
                         help="at most this many (default: 20)")
    replays.set_defaults(handler=_replays)

    cancel = verbs.add_parser("cancel-replay", help="cancel a pending or running replay")
    cancel.add_argument("replay_id", metavar="ID", type=int, help="the replay's id")
    cancel.set_defaults(handler=_cancel)


def progress_line(row: ReplayRow, rate: float | None = None) -> str:
    """``replay 3 (orders/late): running, 1,200 of 5,000 (24%), 300 new events, 820/s``."""
    if row.total is None:
        where = "planning" if row.state == "running" else row.state
        return f"replay {row.id} ({row.watcher}): {where}"
    percent = f" ({100 * row.done / row.total:.0f}%)" if row.total else ""
    text = (f"replay {row.id} ({row.watcher}): {row.state}, {row.done:,} of {row.total:,} "
            f"messages{percent}, {row.stored:,} new events")
    if row.matched > row.stored:
        text += f", {row.matched - row.stored:,} already stored"
    if row.rejected:
        text += f", {row.rejected:,} rejected"
    if rate is not None and row.state == "running":
        text += f", {rate:,.0f}/s"
    if row.error:
        text += f": {row.error}"
    return text


def _list(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        triggers = store.list_triggers()
        active = {r.trigger_id: r for r in store.list_replays(1000, active=True)}
    records: list[dict[str, Any]] = []
    for row in triggers:
        replay = active.get(row.id)
        records.extend(
            {"watcher": watcher, "trigger": row.id, "state": row.state,
             "events": row.events_stored, "classpath": row.classpath,
             "replay": None if replay is None else f"{replay.id} {replay.state}"}
            for watcher in row.watchers)
    return emit(args, records, ("watcher", "trigger", "state", "events", "replay", "classpath"))


def _replay(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        row = ask_replay(store, args.watcher, args.start, args.until,
                         dead_letters=args.dead_letters)
        request = ("its dead letters" if row.request.get("dead_letters") else
                   ", ".join(f"{key} {value}" for key, value in sorted(row.request.items())))
        print(f"replay {row.id} of {row.watcher} asked for ({request}); a triggerer that runs "
              "the watcher takes it within a few seconds")
        if not _anyone_alive(store, config):
            print("no triggerer is running: the replay starts when one that runs this watcher "
                  "does")
        if args.detach:
            print(f"follow it: sharedstream watchers replays; cancel it: sharedstream "
                  f"watchers cancel-replay {row.id}")
            return 0
        try:
            return _follow(store, row.id)
        except KeyboardInterrupt:
            print(f"\nstopped following; replay {row.id} goes on in the triggerer (see "
                  f"`sharedstream watchers replays`; cancel: `sharedstream watchers "
                  f"cancel-replay {row.id}`)")
            return 130


def _anyone_alive(store: MetadataStore, config: Config) -> bool:
    now = datetime.now(UTC)
    threshold = config.triggerer.triggerer_health_check_threshold
    return any(t.alive(now, threshold) for t in store.triggerers())


def _follow(store: MetadataStore, replay_id: int) -> int:
    """Print the replay's progress as it changes; its exit status once it ended."""
    last: tuple[Any, ...] | None = None
    said = time.monotonic()
    first_done: tuple[float, int] | None = None
    while True:
        row = store.get_replay(replay_id)
        if row is None:
            print(f"replay {replay_id} is gone from the store")
            return 1
        now = time.monotonic()
        if row.state == "running" and row.total is not None and first_done is None:
            first_done = (now, row.done)
        rate = None
        if first_done is not None and now > first_done[0]:
            rate = (row.done - first_done[1]) / (now - first_done[0])
        seen = (row.state, row.done, row.total, row.stored)
        if seen != last or now - said >= QUIET_FOR or not row.active:
            print(progress_line(row, rate if row.done > (first_done or (0, 0))[1] else None),
                  flush=True)
            last, said = seen, now
        if not row.active:
            return 0 if row.state == "done" else 1
        time.sleep(FOLLOW_EVERY)


def _replays(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        rows = store.list_replays(args.limit)
    records = [replay_record(row) for row in rows]
    if not args.json:
        for record in records:
            record["progress"] = (f"{record['done']}/{record['total']}"
                                  if record["total"] is not None else "-")
            record["error"] = cell(record["error"])
    return emit(args, records, ("id", "watcher", "state", "progress", "new_events",
                                "already_stored", "rejected", "created_at", "error"))


def _cancel(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        row = store.cancel_replay(args.replay_id)
    if row.state == "cancelled":
        print(f"replay {row.id} of {row.watcher} cancelled (it had not started)")
    else:
        print(f"replay {row.id} of {row.watcher}: asked its triggerer to stop it; it stops "
              "after the batch it is on (its events so far stay stored)")
    return 0
