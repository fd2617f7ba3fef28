"""``sharedstream send``: test messages to a broker, without writing an SDK script.

The messages are the ``--value`` texts, or the lines of ``--file`` (``-``:
stdin), each line one message body as it is (blank lines skipped), read
lazily so a large file is never held in memory. What goes beside each body
(headers, attributes, a key) is given once and applies to every message.
Where to connect: the broker's own options, or ``--conn-id`` naming an
Airflow-style connection of the environment or the configuration file's
``[connections]``, read as the broker's trigger reads it. The broker code
is a :class:`~sharedstream.brokerkit.sending.Sender` of the broker's module,
named in :data:`SENDERS`.

Output: one summary line on stdout (``sent 3 messages to kafka topic
orders``) and, while a large input is sent, a progress line on stderr at
most once a second. Exit status: 0 when everything was sent; 2 (one line)
for what the user must fix - options, a missing file or SDK, unusable
settings, a missing topic or queue; 1 (one line, naming the address) when
the broker cannot be reached or fails a batch (the messages before it were
sent, and the line says how many).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

from sharedstream.brokerkit.errors import BrokerConnectError, BrokerRequestError
from sharedstream.brokerkit.sending import OutgoingMessage, Sender, send_all
from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.config import Config
from sharedstream.runtime.config_connections import install_connections
from sharedstream.runtime.logs import configure_logging

__all__ = ["EXIT_BROKER", "SENDERS", "add_send_command", "sender_class"]

EXIT_BROKER = 1
"""The exit status when the broker cannot be reached or fails a batch."""

SENDERS: Mapping[str, str] = {
    "kafka": "sharedstream.producers._kafka_send:KafkaSender",
    "sqs": "sharedstream.producers._sqs_send:SqsSender",
    "pubsub": "sharedstream.producers._pubsub_send:PubSubSender",
    "servicebus": "sharedstream.producers._servicebus_send:ServiceBusSender",
}
"""``--broker`` name -> its :class:`~sharedstream.brokerkit.sending.Sender` (imported when
chosen: a broker joins ``send`` with its sender module and one line here)."""


def sender_class(name: str) -> type[Sender]:
    """The :class:`~sharedstream.brokerkit.sending.Sender` class of broker ``name``.

    ``KeyError`` for a name not in :data:`SENDERS`.
    """
    module, _, attribute = SENDERS[name].partition(":")
    sender: type[Sender] = getattr(importlib.import_module(module), attribute)
    return sender


_FLAGS = {
    "topic": "--topic", "queue": "--queue", "key": "--key", "ordering_key": "--ordering-key",
    "group_id": "--group-id", "dedup_id": "--dedup-id", "session_id": "--session-id",
    "bootstrap_servers": "--bootstrap-servers", "endpoint_url": "--endpoint-url",
    "region": "--region", "project": "--project", "emulator_host": "--emulator-host",
    "connection_string": "--connection-string", "conn_id": "--conn-id",
    "tls_ca_file": "--tls-ca-file",
}
"""The broker-specific options: ``argparse`` dest -> flag (a broker takes some of them)."""
_PROGRESS_EVERY = 1.0

_EPILOG = """\
examples:
  sharedstream send --broker kafka --topic orders --value '{"id": 1}' --key eu \\
      --header source=cli
  sharedstream send --broker sqs --endpoint-url http://127.0.0.1:5000 --queue orders \\
      --file orders.jsonl
  cat orders.jsonl | sharedstream send --broker pubsub --emulator-host 127.0.0.1:8085 \\
      --project demo --topic orders --attribute region=eu --file -
  sharedstream send --broker servicebus --connection-string "$SB" --queue orders \\
      --session-id eu --property region=eu --value '{"id": 1}'
  sharedstream send --broker kafka --conn-id kafka_default --topic orders --value '{}'

exit status: 0 sent; 1 the broker could not be reached or failed (the line says how
many were sent); 2 bad options, file, settings, or a missing SDK, topic or queue.
"""


def add_send_command(commands: Any, log_level: Callable[[str], str]) -> None:
    """Add ``send`` to the CLI's ``commands`` (the ``add_subparsers`` wrapper).

    ``log_level`` parses ``--log-level`` (the CLI's own level type).
    """
    send = commands.add_parser(
        "send", help="send test messages to a broker (Kafka, SQS, Pub/Sub, Service Bus)",
        description="Send messages to a broker with its real SDK: the --value texts, or\n"
        "the lines of --file (one message body per line, e.g. JSON lines; '-' reads\n"
        "stdin). Headers, attributes and keys apply to every message.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    send.add_argument("--broker", required=True, metavar="NAME",
                      help=f"where to send: {', '.join(SENDERS)}")
    where = send.add_argument_group("destination")
    where.add_argument("--topic", help="Kafka topic, Pub/Sub topic (an id of --project, or "
                       "projects/P/topics/T), or Service Bus topic")
    where.add_argument("--queue", help="SQS queue (a URL or a name) or Service Bus queue")
    source = send.add_argument_group("messages")
    source.add_argument("--value", action="append", metavar="TEXT",
                        help="a message body (repeatable: one message each)")
    source.add_argument("--file", metavar="FILE",
                        help="one message body per line (JSON lines); '-' reads stdin")
    meta = send.add_argument_group("beside each body")
    meta.add_argument("--header", "--attribute", "--property", dest="properties",
                      action="append", metavar="NAME=VALUE",
                      help="a Kafka header, SQS message attribute, Pub/Sub attribute or "
                      "Service Bus application property (repeatable; the three names are one "
                      "option)")
    meta.add_argument("--key", help="Kafka: the record key")
    meta.add_argument("--ordering-key", help="Pub/Sub: the ordering key")
    meta.add_argument("--group-id", help="SQS FIFO queue: the message group id (required there)")
    meta.add_argument("--dedup-id", help="SQS FIFO queue: the deduplication id of every message "
                      "(default: a digest of the body, as content-based deduplication makes it)")
    meta.add_argument("--session-id", help="Service Bus: the session id (required by an entity "
                      "with sessions)")
    conn = send.add_argument_group("connection (options given win over --conn-id's)")
    conn.add_argument("--conn-id", metavar="ID",
                      help="an Airflow-style connection (environment or [connections] of the "
                      "config file), read as the broker's trigger reads it; options given win")
    conn.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                      help="Kafka bootstrap servers (default: 127.0.0.1:9092)")
    conn.add_argument("--endpoint-url", metavar="URL",
                      help="SQS endpoint, e.g. a local moto (default: AWS)")
    conn.add_argument("--region", help="SQS region (default: us-east-1)")
    conn.add_argument("--project", help="Google Cloud project of the Pub/Sub topic")
    conn.add_argument("--emulator-host", metavar="HOST:PORT",
                      help="a Pub/Sub emulator or test server (default: $PUBSUB_EMULATOR_HOST, "
                      "else Google's endpoint)")
    conn.add_argument("--tls-ca-file", metavar="PEM",
                      help="reach the Pub/Sub emulator host over TLS, trusting the certificate "
                      "authorities in this file")
    conn.add_argument("--connection-string", metavar="TEXT",
                      help="the Service Bus namespace's connection string")
    send.add_argument("--log-level", type=log_level, default=None, metavar="LEVEL",
                      help="show the SDK's log lines from this level on (default: none; "
                      "errors are one line anyway)")
    send.set_defaults(handler=_send)


def _sender_type(args: argparse.Namespace) -> type[Sender]:
    """The chosen broker's sender class; options of other brokers are refused (one line)."""
    if args.broker not in SENDERS:
        raise SharedStreamError(f"--broker {args.broker!r}: choose from {', '.join(SENDERS)}")
    sender_type = sender_class(args.broker)
    foreign = [flag for dest, flag in _FLAGS.items()
               if getattr(args, dest) is not None and dest not in sender_type.options]
    if foreign:
        takes = " ".join(flag for dest, flag in _FLAGS.items() if dest in sender_type.options)
        raise SharedStreamError(f"{', '.join(foreign)} does not apply to --broker "
                                f"{args.broker} (it takes {takes})")
    return sender_type


def _properties(pairs: list[str] | None) -> tuple[tuple[str, str], ...]:
    parsed = []
    for pair in pairs or ():
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise SharedStreamError(f"--header/--attribute/--property {pair!r}: expected "
                                    "NAME=VALUE")
        parsed.append((name, value))
    return tuple(parsed)


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    """The stream's lines without their line ends; blank lines are skipped."""
    for line in stream:
        body = line.rstrip(b"\r\n")
        if body.strip():
            yield body


def _bodies(args: argparse.Namespace, stack: ExitStack) -> Iterable[bytes]:
    """The message bodies of ``--value`` or ``--file``; a file is opened now (errors early)."""
    if args.value is not None and args.file is not None:
        raise SharedStreamError("give --value or --file, not both")
    if args.value is not None:
        return [text.encode() for text in args.value]
    if args.file is None:
        raise SharedStreamError("nothing to send: give --value TEXT or --file FILE "
                                "('-' for stdin)")
    if args.file == "-":
        return _lines(sys.stdin.buffer)
    try:
        stream = stack.enter_context(Path(args.file).open("rb"))  # noqa: SIM115 - the stack closes it
    except OSError as exc:
        raise SharedStreamError(f"--file {args.file}: {exc.strerror or exc}") from None
    return _lines(stream)


def _send(args: argparse.Namespace, config: Config) -> int:
    if args.log_level is None:  # the SDKs' own lines (aiokafka's "Unable connect") unshown
        logging.getLogger().addHandler(logging.NullHandler())
    else:
        configure_logging(args.log_level, config.logging.format)
    install_connections(config.connections, config.file)
    sender_type = _sender_type(args)
    properties = _properties(args.properties)
    key = None if sender_type.key_option is None else getattr(args, sender_type.key_option)
    with ExitStack() as stack:
        bodies = _bodies(args, stack)
        sender = sender_type.from_options({dest: getattr(args, dest) for dest in _FLAGS})
        messages = (OutgoingMessage(body, properties, key, args.dedup_id) for body in bodies)
        return asyncio.run(_run(sender, messages))


async def _run(sender: Sender, messages: Iterable[OutgoingMessage]) -> int:
    """Open, send everything, close; the summary or the one-line failure."""
    started = shown = time.monotonic()
    count = 0

    def sent(n: int) -> None:
        nonlocal count, shown
        count += n
        now = time.monotonic()
        if now - shown >= _PROGRESS_EVERY:
            shown = now
            print(f"sent {count} messages ({count / (now - started):.0f}/s)...",
                  file=sys.stderr, flush=True)

    try:
        await sender.open()
        await send_all(sender, messages, sent)
    except (BrokerConnectError, BrokerRequestError) as exc:
        before = f" ({count} sent before)" if count else ""
        print(f"sharedstream: error: {' '.join(str(exc).split())}{before}", file=sys.stderr)
        return EXIT_BROKER
    finally:
        await sender.close()
    print(f"sent {count} message{'' if count == 1 else 's'} to {sender.destination}")
    return 0
