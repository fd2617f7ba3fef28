"""The ``sharedstream`` command line.

Commands: ``init`` (configuration file with a fresh encryption key, and the
database), ``triggerer`` (run the watchers of a definitions file), ``triggers
list``, ``triggerers list`` (who is alive and what each runs), ``events
list``, ``runs list``, ``deadletters list`` (``--json`` for machines),
``dags list`` (each DAG's schedule, next and last run) and ``dags next-runs
DAG -n N`` (its next logical dates and data intervals),
``db upgrade`` and ``db check`` (the schema of the metadata database),
``config show`` (the effective configuration, secrets masked),
``connections list`` / ``connections get ID`` (the Airflow-style
connections of the config file and the environment, masked), ``send``
(test messages to a broker: :mod:`.cli_send`) and ``broker start`` (a
local broker of the testing kit: :mod:`.cli_broker`). Every
command reaches the store through ``[store] url`` and the
:class:`~sharedstream.store.MetadataStore` protocol, whatever the backend.
Every error a user can cause - bad configuration, a broken definitions
file, an unusable or out-of-date store - is one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from sharedstream import __version__
from sharedstream.connections import Connection, env_connections, get_connection
from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.cli_broker import add_broker_command
from sharedstream.runtime.cli_output import (
    emit,
    open_migrated_store,
    plain,
    positive,
    preview,
    to_base64,
)
from sharedstream.runtime.cli_runs import add_redrive_command, add_run_commands
from sharedstream.runtime.cli_send import add_send_command
from sharedstream.runtime.cli_watchers import add_watcher_commands
from sharedstream.runtime.config import Config, load_config, write_default_config
from sharedstream.runtime.config_connections import install_connections
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.logs import configure_logging
from sharedstream.runtime.serde import unpack_event_payload
from sharedstream.store import StoreError

__all__ = ["main"]

EXIT_USAGE = 2

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(text: str) -> str:
    """A ``--log-level`` value, any case; one line naming the choices otherwise."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r} (choose from {', '.join(LOG_LEVELS)})")
    return text.upper()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.handler is _init:  # init writes the configuration; there is none to load yet
            return _init(args)  # type: ignore[no-any-return]
        if args.handler is _demo:  # the demo writes its own configuration
            return _demo(args)  # type: ignore[no-any-return]
        config = load_config(args.config)
        handler: Callable[[argparse.Namespace, Config], int] = args.handler
        return int(handler(args, config))
    except SharedStreamError as exc:
        print(f"sharedstream: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: stop quietly
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C before the triggerer's own handlers were in place
        print("sharedstream: interrupted", file=sys.stderr)
        return 130


_EPILOG = """\
examples:
  sharedstream init                               write ./sharedstream.toml and a database
  sharedstream triggerer --definitions defs.py    run the watchers of defs.py
  sharedstream runs list --dag ship --limit 20    the newest queued DAG runs of one DAG
  sharedstream triggerers list                    the triggerer processes: alive? running what?
  sharedstream deadletters list --json            raw events kept in the store's DLQ table
  sharedstream watchers replay orders/late --from 24h
                                                  feed one watcher the day it missed
  sharedstream db check                           is the database reachable and up to date?
  sharedstream demo                               everything against a local broker
  sharedstream broker start kafka                 a local broker; prints its connection
  sharedstream send --broker kafka --topic orders --value '{"id": 1}'
                                                  a test message (see `send --help`)

environment:
  SHAREDSTREAM_CONFIG                   the configuration file (like --config)
  SHAREDSTREAM__<SECTION>__<OPTION>     overrides one option, e.g.
                                        SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT=60
  SHAREDSTREAM_CONN_<ID>, AIRFLOW_CONN_<ID>
                                        a connection (URI or JSON), found before the
                                        config file's [connections.<id>]
  (`sharedstream config show` prints the effective configuration and where each value came from)

exit status:
  0    success (the triggerer: stopped by SIGTERM/SIGINT, or every trigger finished)
  1    the triggerer had no trigger left it could run; send: the broker could not be
       reached or failed; broker start: the broker exited on its own
  2    bad arguments, configuration, definitions or database (one line says which)
  128+N  a second signal N (130 for Ctrl-C, 143 for SIGTERM): exited at once; the
         broker redelivers whatever was not advanced
"""


class _Parser(argparse.ArgumentParser):
    """The CLI's parser (and, argparse's default, every subcommand's).

    A command or action left out (bare ``sharedstream``, ``sharedstream
    dags``) prints the parser's usage and its list of commands on stderr,
    then exits 2, instead of argparse's bare "arguments are required".
    """

    def error(self, message: str) -> NoReturn:
        """Exit 2: the command list when only the command is missing, else argparse's line."""
        commands = [action for action in self._actions
                    if isinstance(action, argparse._SubParsersAction)]
        if commands and message == (
                f"the following arguments are required: {commands[0].metavar}"):
            epilog, self.epilog = self.epilog, None  # the examples are in --help
            try:
                listing = self.format_help()
            finally:
                self.epilog = epilog
            what = str(commands[0].metavar).lower()
            article = "an" if what[0] in "aeiou" else "a"
            self.exit(EXIT_USAGE, f"{listing}\n{self.prog}: error: choose {article} {what} "
                      f"(`{self.prog} {commands[0].metavar} --help` says more)\n")
        super().error(message)


class _Commands:
    """``add_subparsers()`` whose every command also takes the shared options of ``parent``.

    A command given a ``help`` but no ``description`` gets the help as its
    description, so that ``COMMAND --help`` says what the command does.
    """

    def __init__(self, actions: Any, parent: argparse.ArgumentParser) -> None:
        self._actions, self._parent = actions, parent

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if kwargs.get("help") and "description" not in kwargs:
            text = str(kwargs["help"])
            kwargs["description"] = f"{text[0].upper()}{text[1:]}."
        parser: argparse.ArgumentParser = self._actions.add_parser(
            name, parents=[self._parent], **kwargs)
        return parser


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sharedstream",
        description=("Event-driven ingestion: one shared broker consumer per stream, fanned out "
                     "to many filtering triggers; the broker is advanced only once every event "
                     "derived from a message is stored."),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sharedstream {__version__}")
    config_help = ("configuration file (default: $SHAREDSTREAM_CONFIG or ./sharedstream.toml "
                   "if present)")
    parser.add_argument("--config", type=Path, default=None, help=config_help)
    # Also accepted after the command (`sharedstream runs list --config x.toml`);
    # SUPPRESS keeps a subcommand that did not get it from resetting the global one.
    anywhere = argparse.ArgumentParser(add_help=False)
    anywhere.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=config_help)
    commands = _Commands(parser.add_subparsers(title="commands", required=True,
                                               metavar="COMMAND"), anywhere)

    init = commands.add_parser(
        "init", help="write a configuration file with a new key; create the database"
    )
    init.add_argument("--path", type=Path, default=None,
                      help="where to write the configuration (default: --config, else "
                      "./sharedstream.toml)")
    init.add_argument("--db", default="sqlite:///sharedstream.db",
                      help="store URL (default: sqlite:///sharedstream.db, next to the file)")
    init.set_defaults(handler=_init)

    demo = commands.add_parser(
        "demo", help="run the pipeline against a broker started locally (Kafka, Pub/Sub or "
        "Service Bus)"
    )
    demo.add_argument("--messages", type=positive, default=2000, metavar="N",
                      help="records to produce (default: 2000)")
    demo.add_argument("--keep", type=Path, default=None, metavar="DIR",
                      help="work in DIR (new or empty) and keep it, instead of a temp directory")
    demo.add_argument("--log-level", type=_log_level, default="ERROR", metavar="LEVEL",
                      help=f"logging level: {', '.join(LOG_LEVELS)} (default: error)")
    demo.add_argument("--broker", default="kafka", metavar="NAME",
                      help="the broker to start and run on: kafka (Tansu, the default), "
                      "pubsub or servicebus (the testing kit's Pub/Sub and Service Bus test "
                      "servers)")
    demo.set_defaults(handler=_demo)

    triggerer = commands.add_parser("triggerer", help="run the watchers of a definitions file")
    triggerer.add_argument("--definitions", type=Path, required=True, action="append",
                           metavar="PATH",
                           help="Python file declaring Assets, their watchers and Dags, or a "
                           "folder of them; repeat it for several (they make one set: a Dag "
                           "id defined twice is an error)")
    triggerer.add_argument("--log-level", type=_log_level, default="INFO", metavar="LEVEL",
                           help=f"logging level: {', '.join(LOG_LEVELS)} (default: info)")
    triggerer.set_defaults(handler=_triggerer)

    for noun, what, handler, extra in (
        ("triggers", "triggers", _triggers_list, ()),
        ("triggerers", "triggerer processes", _triggerers_list, ()),
        ("events", "events", _events_list, ("--asset", "--trigger", "--limit")),
        ("deadletters", "dead letters", _deadletters_list, ("--stream", "--limit")),
    ):
        group = commands.add_parser(noun, help=f"inspect stored {what}")
        verbs = _Commands(group.add_subparsers(title="actions", required=True,
                                               metavar="ACTION"), anywhere)
        order = "by id" if noun in ("triggers", "triggerers") else "newest first"
        listing = verbs.add_parser("list", help=f"list {what}, {order}")
        listing.add_argument("--json", action="store_true", help="one JSON document on stdout")
        if "--asset" in extra:
            listing.add_argument("--asset", help="only those of this asset")
        if "--trigger" in extra:
            listing.add_argument("--trigger", type=int, help="only those of this trigger id")
        if "--dag" in extra:
            listing.add_argument("--dag", help="only runs of this DAG")
        if "--stream" in extra:
            listing.add_argument("--stream", help="only those of this stream, by its name "
                                 "(\"kafka orders (group g)\", see `status`)")
        if "--limit" in extra:
            listing.add_argument("--limit", type=positive, default=100,
                                 help="at most this many (default: 100)")
        listing.set_defaults(handler=handler)
        if noun == "deadletters":
            add_redrive_command(verbs)

    dag_verbs = _add_dags_commands(commands, anywhere)

    db = commands.add_parser("db", help="the metadata database's schema")
    db_verbs = _Commands(db.add_subparsers(title="actions", required=True, metavar="ACTION"),
                         anywhere)
    db_verbs.add_parser(
        "upgrade", help="apply the migrations the database lacks; print the versions"
    ).set_defaults(handler=_db_upgrade)
    db_verbs.add_parser(
        "check", help="check that the database answers and its schema is current (exit 2 if not)"
    ).set_defaults(handler=_db_check)
    add_run_commands(commands, anywhere, dag_verbs, db_verbs)

    _add_config_commands(commands, anywhere)
    _add_status_command(commands)
    add_send_command(commands, _log_level)
    add_broker_command(commands)
    add_watcher_commands(commands, anywhere)
    return parser


def _add_dags_commands(commands: _Commands, anywhere: argparse.ArgumentParser) -> _Commands:
    """``dags list`` and ``dags next-runs DAG -n N``; returns the ``dags`` verbs (for more)."""
    dags = commands.add_parser("dags", help="the DAGs in the store and their schedules")
    dag_verbs = _Commands(dags.add_subparsers(title="actions", required=True, metavar="ACTION"),
                          anywhere)
    listing = dag_verbs.add_parser("list", help="every DAG: schedule, next run, catchup, last run")
    listing.add_argument("--json", action="store_true", help="one JSON document on stdout")
    listing.set_defaults(handler=_dags_list)
    upcoming = dag_verbs.add_parser(
        "next-runs", help="a DAG's next logical dates, data intervals and run-after times")
    upcoming.add_argument("dag_id", metavar="DAG")
    upcoming.add_argument("-n", type=positive, default=5, metavar="N",
                          help="how many (default: 5)")
    upcoming.add_argument("--definitions", type=Path, action="append", metavar="PATH",
                          help="also register the timetable classes of these definitions (a "
                          "file or folder; repeatable), and know their DAGs the store does "
                          "not have yet")
    upcoming.add_argument("--json", action="store_true", help="one JSON document on stdout")
    upcoming.set_defaults(handler=_dags_next_runs)
    return dag_verbs


def _add_status_command(commands: _Commands) -> None:
    """``status``: the operations overview, from the endpoint or the store."""
    status = commands.add_parser(
        "status", help="streams, lag, watchers, dead letters, DAG runs (from the [api] "
        "endpoint, else the store)")
    status.add_argument("--url", metavar="URL",
                        help="the endpoint to ask (default: [api] host and port when enabled)")
    status.add_argument("--json", action="store_true", help="one JSON document on stdout")
    status.set_defaults(handler=_status)


def _add_config_commands(commands: _Commands, anywhere: argparse.ArgumentParser) -> None:
    """``config show`` and ``connections list`` / ``connections get ID``."""
    config = commands.add_parser("config", help="inspect the configuration")
    verbs = _Commands(config.add_subparsers(title="actions", required=True, metavar="ACTION"),
                      anywhere)
    show = verbs.add_parser("show", help="the effective configuration, secrets masked")
    show.add_argument("--json", action="store_true", help="JSON instead of TOML")
    show.set_defaults(handler=_config_show)

    connections = commands.add_parser(
        "connections", help="inspect the Airflow-style connections (secrets masked)")
    verbs = _Commands(connections.add_subparsers(title="actions", required=True,
                                                 metavar="ACTION"), anywhere)
    listing = verbs.add_parser("list", help="every connection: environment, then config file")
    listing.add_argument("--json", action="store_true", help="one JSON document on stdout")
    listing.set_defaults(handler=_connections_list)
    get = verbs.add_parser("get", help="the connection a trigger with conn_id=ID would use")
    get.add_argument("conn_id", metavar="ID")
    get.set_defaults(handler=_connections_get)


# -- commands -----------------------------------------------------------------------


def _init(args: argparse.Namespace) -> int:
    """Create and migrate the database, then write the file: nothing is written unless both work."""
    path = args.path or args.config or Path("sharedstream.toml")
    ready: list[str] = []

    def migrate(config: Config) -> None:
        try:
            with config.store.open_store(create=True) as store:
                ready.append(f"database {store.location} ready (schema v{store.migrate()})")
        except StoreError as exc:
            raise StoreError(f"{exc}; nothing was written: run `sharedstream init` again once "
                             "the database answers") from exc

    write_default_config(path, kwargs_key=generate_key(), store_url=args.db, check=migrate)
    print(f"wrote {path} (with a new kwargs encryption key: keep it secret)")
    print(*ready)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sharedstream.demo import run_demo  # noqa: PLC0415 - needs the optional Kafka extras

    return run_demo(args)


def _triggerer(args: argparse.Namespace, config: Config) -> int:
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - imports user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415 - only this command needs it

    configure_logging(args.log_level, config.logging.format)
    definitions = load_definitions(args.definitions)

    async def run() -> int:
        return await Triggerer(config, definitions).run()

    return asyncio.run(run())


def _db_upgrade(args: argparse.Namespace, config: Config) -> int:
    with config.store.open_store() as store:
        before = store.schema_status()
        if before.newer:
            store.migrate()  # refuses, with the message that says what to do
        after = store.migrate()
        if before.current == after:
            print(f"database {store.location}: schema v{after}, already up to date")
        else:
            print(f"database {store.location}: schema v{before.current} -> v{after}")
    return 0


def _db_check(args: argparse.Namespace, config: Config) -> int:
    with config.store.open_store() as store:
        status = store.schema_status()
        if status.newer:
            store.migrate()  # refuses: the database is newer than this sharedstream
        if status.behind:
            raise StoreError(
                f"database {store.location} is at schema v{status.current}, this sharedstream "
                f"needs v{status.latest}; run `sharedstream db upgrade`"
            )
        print(f"database {store.location}: reachable, schema v{status.current} (up to date)")
    return 0


def _triggers_list(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        rows = store.list_triggers()
    records = [
        {"id": r.id, "watchers": list(r.watchers), "classpath": r.classpath, "state": r.state,
         "events": r.events_stored, "errors": r.error_count, "last_error": r.last_error,
         "last_error_at": r.last_error_at, "last_traceback": r.last_traceback}
        for r in rows
    ]
    columns = ("id", "state", "events", "errors", "watchers", "classpath", "last_error")
    return emit(args, records, columns)


def _triggerers_list(args: argparse.Namespace, config: Config) -> int:
    threshold = config.triggerer.triggerer_health_check_threshold
    with open_migrated_store(config) as store:
        rows = store.triggerers()
    now = datetime.now(UTC)
    records = [
        {"id": r.id, "host": r.hostname, "pid": r.pid, "started_at": r.started_at,
         "heartbeat_at": r.heartbeat_at,
         "heartbeat_age": round((now - r.heartbeat_at).total_seconds(), 1),
         "alive": r.alive(now, threshold), "triggers": list(r.running)}
        for r in rows
    ]
    columns = ("id", "host", "pid", "alive", "heartbeat_at", "heartbeat_age", "triggers")
    return emit(args, records, columns)


def _events_list(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        rows = store.list_events(asset=args.asset, trigger_id=args.trigger, limit=args.limit)
    records = [
        {"id": r.id, "trigger": r.trigger_id, "assets": list(r.assets), "key": r.idem_key,
         "created_at": r.created_at, "payload": unpack_event_payload(r.payload),
         "trace_parent": r.trace_parent}
        for r in rows
    ]
    return emit(args, records, ("id", "trigger", "assets", "created_at", "key", "payload"))


def _dags_list(args: argparse.Namespace, config: Config) -> int:
    from sharedstream.runtime import cli_dags  # noqa: PLC0415 - only these commands need it
    from sharedstream.runtime.definitions import timetable_registry  # noqa: PLC0415

    with open_migrated_store(config) as store:
        rows = store.list_dags()
    registry = timetable_registry({})
    return emit(args, cli_dags.dag_records(rows, registry), cli_dags.DAG_COLUMNS)


def _dags_next_runs(args: argparse.Namespace, config: Config) -> int:
    from sharedstream.runtime import cli_dags  # noqa: PLC0415 - only these commands need it
    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - user code

    definitions = None if args.definitions is None else load_definitions(args.definitions)
    with open_migrated_store(config) as store:
        rows = store.list_dags()
    records, source = cli_dags.next_run_records(rows, args.dag_id, args.n, definitions)
    if not args.json:
        print(source)
    return emit(args, records, cli_dags.NEXT_RUN_COLUMNS)


def _deadletters_list(args: argparse.Namespace, config: Config) -> int:
    with open_migrated_store(config) as store:
        rows = store.dead_letters(args.limit, stream=args.stream)
    records: list[dict[str, Any]] = []
    for r in rows:
        record = {"id": r.id, "created_at": r.created_at, "stream": r.stream,
                  "source": r.source, "reason": r.reason, "triggers": list(r.triggers),
                  "redrives": r.redrives, "redriven_at": r.redriven_at}
        if args.json:  # everything, bytes as base64
            record |= {"payload_size": r.payload_size, "truncated": r.truncated,
                       "payload": to_base64(r.payload),
                       "headers": [[name, to_base64(value)] for name, value in r.headers]}
        else:
            record |= {"size": f"{r.payload_size} (truncated)" if r.truncated else r.payload_size,
                       "preview": preview(r.payload)}
        records.append(record)
    columns = ("id", "created_at", "stream", "source", "reason", "triggers", "redrives", "size",
               "preview")
    return emit(args, records, columns)


def _effective_connections(config: Config) -> dict[str, Connection]:
    """The config file's connections, overlaid by the environment's (which are found first)."""
    return {**config.connections, **{conn.conn_id: conn for conn in env_connections()}}


def _status(args: argparse.Namespace, config: Config) -> int:
    from sharedstream.runtime import cli_status  # noqa: PLC0415 - only this command needs it

    if args.url is not None:
        parts = urlsplit(args.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SharedStreamError(f"--url {args.url!r} is not an http(s) URL of the endpoint "
                                    "(e.g. http://127.0.0.1:8794)")
    status, note = cli_status.fetch_status(config, args.url, partial(open_migrated_store, config))
    if note is not None:
        print(f"sharedstream: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(status, indent=2, default=plain))
    else:
        print(cli_status.render(status), end="")
    return 0


def _config_show(args: argparse.Namespace, config: Config) -> int:
    shown = dataclasses.replace(config, connections=_effective_connections(config))
    if args.json:
        document = shown.as_dict(mask_secrets=True)
        for conn_id, entry in document.get("connections", {}).items():
            entry["source"] = shown.connections[conn_id].source
        print(json.dumps(document, indent=2, default=str))
    else:
        print(shown.to_toml(mask_secrets=True), end="")
    return 0


def _connections_list(args: argparse.Namespace, config: Config) -> int:
    records = [conn.masked() for conn in _effective_connections(config).values()]
    records.sort(key=lambda record: record["conn_id"])
    return emit(args, records, ("conn_id", "conn_type", "host", "port", "login", "source"))


def _connections_get(args: argparse.Namespace, config: Config) -> int:
    install_connections(config.connections, config.file)
    print(json.dumps(get_connection(args.conn_id).masked(), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
