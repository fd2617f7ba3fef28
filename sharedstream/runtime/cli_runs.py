"""The commands that act on DAG runs: what a person does with the outbox.

``runs list`` (by DAG, asset, state), ``runs show DAG RUN_ID`` (the run, the
events that triggered it, every attempt and the last output), ``runs retry``
(queue finished runs again with a new retry budget), ``runs mark`` (record
``success`` or ``failed`` by hand), ``dags trigger`` (a manual run through
the same dispatch path), ``dags pause`` / ``dags unpause`` and ``db prune``.
Every change goes through the store's outbox methods
(:class:`~sharedstream.store.OutboxStore`), each one transaction; a running
triggerer picks it up within ``[dispatch] poll_interval``. Mistakes (an
unknown DAG or run, a bad ``--conf``) are one line and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime import config_options
from sharedstream.runtime.cli_output import (
    cell,
    emit,
    open_migrated_store,
    plain,
    positive,
    time_text,
)
from sharedstream.runtime.config import Config
from sharedstream.runtime.config_connections import install_connections
from sharedstream.runtime.redrive import redrive
from sharedstream.runtime.registry import TriggerRegistry
from sharedstream.runtime.retention import prune_all
from sharedstream.runtime.serde import SerializationError, unpack_event_payload
from sharedstream.store import FINISHED_STATES, RUN_STATES, MetadataStore, PruneResult, RunRow

__all__ = ["RUN_COLUMNS", "add_redrive_command", "add_run_commands", "parse_age", "run_record"]

RUN_COLUMNS = ("dag_id", "run_id", "state", "created_at", "assets", "target", "attempts",
               "last_error")

def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` as a duration (an ``argparse`` type)."""
    try:
        return config_options.parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _state(text: str) -> str:
    if text not in RUN_STATES:
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r} (choose from {', '.join(RUN_STATES)})")
    return text


def run_record(r: RunRow) -> dict[str, Any]:
    """Everything ``runs list --json`` says of a run."""
    return {
        "dag_id": r.dag_id, "run_id": r.run_id, "run_type": r.run_type, "state": r.state,
        "created_at": r.created_at, "logical_date": r.logical_date,
        "data_interval_start": r.data_interval_start, "data_interval_end": r.data_interval_end,
        "run_after": r.run_after, "assets": list(r.assets),
        "asset_events": list(r.asset_event_ids), "trace_parent": r.trace_parent,
        "target": r.target, "attempts": r.attempts, "last_error": r.last_error,
        "external_id": r.external_id, "external_url": r.external_url,
        "dispatched_at": r.dispatched_at, "ended_at": r.ended_at, "conf": r.conf,
    }


def add_run_commands(commands: Any, anywhere: argparse.ArgumentParser,
                     dag_verbs: Any, db_verbs: Any) -> None:
    """Add ``runs ...``, ``dags trigger|pause|unpause`` and ``db prune`` to the parser."""
    runs = commands.add_parser("runs", help="DAG runs: list, show, retry, mark")
    verbs = type(commands)(runs.add_subparsers(title="actions", required=True,
                                               metavar="ACTION"), anywhere)
    listing = verbs.add_parser("list", help="list runs, newest first")
    listing.add_argument("--json", action="store_true", help="one JSON document on stdout")
    listing.add_argument("--dag", help="only runs of this DAG")
    listing.add_argument("--asset", help="only runs that consumed an event of this asset")
    listing.add_argument("--state", type=_state,
                         help=f"only runs in this state ({', '.join(RUN_STATES)})")
    listing.add_argument("--limit", type=positive, default=100,
                         help="at most this many (default: 100)")
    listing.set_defaults(handler=_runs_list)

    show = verbs.add_parser("show", help="one run: its events, its attempts, the last output")
    show.add_argument("dag_id", metavar="DAG")
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="one JSON document on stdout")
    show.set_defaults(handler=_runs_show)

    retry = verbs.add_parser(
        "retry", help="queue finished runs again (a new retry budget); by id, or all of a state")
    retry.add_argument("dag_id", metavar="DAG")
    retry.add_argument("run_ids", metavar="RUN_ID", nargs="*")
    retry.add_argument("--state", choices=sorted(FINISHED_STATES),
                       help="every run of DAG in this state (instead of RUN_IDs)")
    retry.set_defaults(handler=_runs_retry)

    mark = verbs.add_parser("mark", help="record that runs succeeded or failed (a person's word)")
    mark.add_argument("outcome", choices=("success", "failed"))
    mark.add_argument("dag_id", metavar="DAG")
    mark.add_argument("run_ids", metavar="RUN_ID", nargs="+")
    mark.add_argument("--note", default=None, help="why (kept as the run's last detail)")
    mark.set_defaults(handler=_runs_mark)

    trigger = dag_verbs.add_parser(
        "trigger", help="queue a manual run; the triggerer dispatches it like any other")
    trigger.add_argument("dag_id", metavar="DAG")
    trigger.add_argument("--conf", default="{}", metavar="JSON",
                         help="the run's configuration, a JSON object (default: {})")
    trigger.add_argument("--run-id", default=None,
                         help="the run's id (default: manual__<now, ISO 8601>)")
    trigger.set_defaults(handler=_dags_trigger)
    for verb, paused in (("pause", True), ("unpause", False)):
        toggle = dag_verbs.add_parser(
            verb, help="stop dispatching a DAG's runs (they wait, nothing is lost)" if paused
            else "dispatch a paused DAG's runs again")
        toggle.add_argument("dag_id", metavar="DAG")
        toggle.set_defaults(handler=_dags_pause, paused=paused)

    prune = db_verbs.add_parser(
        "prune", help="delete finished runs, events no run needs, old dead letters and "
        "triggerers")
    prune.add_argument("--older-than", type=parse_age, required=True, metavar="AGE",
                       help="what finished before now minus AGE (30d, 12h, 90m, 2w)")
    prune.set_defaults(handler=_db_prune)


def add_redrive_command(deadletter_verbs: Any) -> None:
    """Add ``deadletters redrive`` to the ``deadletters`` verbs."""
    redrive = deadletter_verbs.add_parser(
        "redrive", help="publish dead letters kept in the store to their source again")
    redrive.add_argument("ids", metavar="ID", nargs="*", type=int,
                         help="the dead letters (see `deadletters list`)")
    redrive.add_argument("--stream", help="every kept letter of this stream (its name, "
                         "\"kafka orders (group g)\") not re-driven yet")
    redrive.add_argument("--again", action="store_true",
                         help="with --stream: also those re-driven before")
    redrive.add_argument("--definitions", type=Path, metavar="FILE",
                         help="register FILE's trigger classes (custom triggers)")
    redrive.set_defaults(handler=_deadletters_redrive)


# -- runs ------------------------------------------------------------------------------


def _runs_list(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        rows = store.list_runs(dag_id=args.dag, asset=args.asset, state=args.state,
                               limit=args.limit)
    columns: tuple[str, ...] = RUN_COLUMNS
    if any(r.logical_date is not None for r in rows):  # time-based runs: their dates too
        columns = (*RUN_COLUMNS[:4], "logical_date", "data_interval_start", "data_interval_end",
                   *RUN_COLUMNS[4:])
    return emit(args, [run_record(r) for r in rows], columns)


def _one_run(store: MetadataStore, dag_id: str, run_id: str) -> RunRow:
    found = store.list_runs(dag_id=dag_id, run_id=run_id, limit=1)
    if not found:
        raise SharedStreamError(f"no run {run_id!r} of DAG {dag_id!r} (see `sharedstream runs "
                                f"list --dag {dag_id}`)")
    return found[0]


def _payload(blob: bytes) -> Any:
    try:
        return unpack_event_payload(blob)
    except SerializationError as exc:
        return f"<cannot be read: {exc}>"


def _runs_show(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        row = _one_run(store, args.dag_id, args.run_id)
        claimed = store.get_run(args.dag_id, args.run_id)
        attempts = store.run_attempts(row.id)
    events = [{"asset": e.asset, "asset_event_id": e.asset_event_id, "event_id": e.event_id,
               "created_at": e.created_at, "payload": _payload(e.payload),
               "trace_parent": e.trace_parent} for e in (claimed.events if claimed else ())]
    tries = [{"attempt": a.attempt, "triggerer": a.triggerer_id, "target": a.target,
              "started_at": a.started_at, "ended_at": a.ended_at, "outcome": a.outcome,
              "detail": a.detail, "output": a.output} for a in attempts]
    record = {**run_record(row), "events": events, "attempt_log": tries}
    if args.json:
        print(json.dumps(record, indent=2, default=plain))
        return 0
    for key in ("dag_id", "run_id", "run_type", "state", "target", "attempts", "created_at",
                "dispatched_at", "ended_at", "logical_date", "last_error", "external_id",
                "external_url", "conf", "trace_parent"):
        value = record[key]
        if value is not None or key in ("state", "attempts"):
            print(f"{key + ':':15} {time_text(value) if isinstance(value, datetime) else value}")
    _table("events", events, ("asset", "asset_event_id", "event_id", "created_at", "payload"))
    _table("attempts", tries, ("attempt", "triggerer", "started_at", "ended_at", "outcome",
                               "detail"))
    last = next((a for a in reversed(tries) if a["output"]), None)
    if last is not None:
        print(f"\noutput of attempt {last['attempt']} (its end):")
        print(str(last["output"]).rstrip("\n"))
    return 0


def _table(title: str, records: list[dict[str, Any]], columns: Sequence[str]) -> None:
    print(f"\n{title}:")
    if not records:
        print("  (none)")
        return
    cells = [[cell(record[column]) for column in columns] for record in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  " + "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths,
                                                                strict=True)).rstrip())
    for row in cells:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _chosen(store: MetadataStore, args: argparse.Namespace) -> list[RunRow]:
    """The runs a ``retry``/``mark`` names: by id, or (``retry --state``) every one of a state."""
    if args.run_ids and getattr(args, "state", None):
        raise SharedStreamError("give RUN_IDs or --state, not both")
    if args.run_ids:
        return [_one_run(store, args.dag_id, run_id) for run_id in args.run_ids]
    if not getattr(args, "state", None):
        raise SharedStreamError("give the RUN_IDs to retry, or --state undeliverable|failed|"
                                "success for all of the DAG's runs in that state")
    return store.list_runs(dag_id=args.dag_id, state=args.state, limit=10_000_000)


def _runs_retry(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        rows = _chosen(store, args)
        unfinished = [r for r in rows if r.state not in FINISHED_STATES]
        if unfinished:
            raise SharedStreamError(f"only finished runs can be retried; {unfinished[0].run_id!r}"
                                    f" is {unfinished[0].state}")
        changed = store.retry_runs([r.id for r in rows])
    print(f"queued {changed} run{'s' * (changed != 1)} of {args.dag_id} again; a running "
          "triggerer dispatches them")
    return 0


def _runs_mark(args: argparse.Namespace, config: Config) -> int:
    note = args.note or f"marked {args.outcome} by hand"
    with open_migrated_store(config) as store:
        rows = _chosen(store, args)
        changed = store.mark_runs([r.id for r in rows], args.outcome, note)
    print(f"marked {changed} run{'s' * (changed != 1)} of {args.dag_id} {args.outcome}")
    return 0


# -- dags and the database ----------------------------------------------------------------


def _dags_trigger(args: argparse.Namespace, config: Config) -> int:
    try:
        conf = json.loads(args.conf)
    except ValueError as exc:
        raise SharedStreamError(f"--conf is not JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise SharedStreamError(f"--conf must be a JSON object, got {type(conf).__name__}")
    run_id = args.run_id or f"manual__{datetime.now(UTC).isoformat(timespec='microseconds')}"
    with open_migrated_store(config) as store:
        if not store.queue_manual_run(args.dag_id, run_id, conf):
            raise SharedStreamError(f"DAG {args.dag_id!r} already has a run {run_id!r}")
    print(f"queued {args.dag_id} {run_id}; a running triggerer dispatches it (see `sharedstream "
          f"runs show {args.dag_id} {run_id}`)")
    return 0


def _dags_pause(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        if not store.set_dag_paused(args.dag_id, args.paused):
            raise SharedStreamError(f"no DAG {args.dag_id!r} in the store (see `sharedstream "
                                    "dags list`)")
    print(f"{args.dag_id}: {'paused (its runs wait in the store)' if args.paused else 'unpaused'}")
    return 0


def _deadletters_redrive(args: argparse.Namespace, config: Config) -> int:
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - user code

    if bool(args.ids) == bool(args.stream):
        raise SharedStreamError("give the dead letters' IDs, or --stream STREAM")
    registry = TriggerRegistry()
    registry.load_entry_points()
    if args.definitions is not None:
        for classpath, cls in load_definitions(args.definitions).trigger_classes.items():
            registry.register(classpath, cls)
    install_connections(config.connections, config.file)
    with open_migrated_store(config) as store:
        if args.ids:
            rows = store.dead_letters(len(args.ids), ids=args.ids)
            missing = sorted(set(args.ids) - {row.id for row in rows})
            if missing:
                raise SharedStreamError(f"no dead letter {missing[0]} in the store (see "
                                        "`sharedstream deadletters list`)")
        else:
            rows = [row for row in store.dead_letters(10_000_000, stream=args.stream)
                    if args.again or not row.redrives]
        report = asyncio.run(redrive(store, rows, key=config.store.kwargs_key,
                                     registry=registry))
    for stream, ids in report.redriven.items():
        print(f"re-drove {len(ids)} dead letter{'s' * (len(ids) != 1)} of {stream} to its "
              f"source: {', '.join(map(str, sorted(ids)))}")
    for problem in report.refused:
        print(f"sharedstream: {problem}", file=sys.stderr)
    if not rows:
        print("(no dead letter to re-drive)")
    return 2 if report.refused else 0


def _db_prune(args: argparse.Namespace, config: Config) -> int:
    before = datetime.now(UTC) - args.older_than

    def said(total: PruneResult) -> None:
        if total.total():
            print(f"  ... {total.dag_runs} runs, {total.trigger_events} trigger events so far",
                  file=sys.stderr, flush=True)

    async def direct(fn: Callable[..., Any], *call: Any) -> Any:
        return fn(*call)

    with open_migrated_store(config) as store:
        result = asyncio.run(prune_all(store, direct, before, progress=said))
    print(f"pruned what finished before {time_text(before)}: "
          f"{result.dag_runs} runs, {result.trigger_events} trigger events, "
          f"{result.asset_events} asset events, {result.dead_letters} dead letters, "
          f"{result.triggerers} triggerers, {result.replays} replays")
    return 0
