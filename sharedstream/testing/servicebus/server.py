"""Run the Service Bus test server: ``python -m sharedstream.testing.servicebus --port N``.

:func:`serve` runs it on the calling thread until :meth:`ServerControl.stop`;
:func:`main` is the command line, which stops cleanly on SIGTERM or SIGINT
and prints the connection string. The testing kit starts it as a child
process (:func:`sharedstream.testing.brokers.servicebus_server`), so the
server has a core of its own and the SDK's work does not compete with it
for the test process's GIL.

Entities are created before the port is bound, from an entities document
(:mod:`.config`: ``--queue``, ``--topic``, ``--subscription``, ``--config
FILE``), or later through the Python API of :class:`~.state.ServiceBusState`
for a server run in-process (``serve(..., state=...)``). With ``--state-file
PATH`` (:mod:`.state_file`) the state outlives the process: a server
restarted on the same file has the last one's entities and messages, and
the entities document applies only when the file does not exist yet.

Proton listens on a loopback port of its own, plain; the AMQP port clients
reach is a relay in front of it (:mod:`.amqp_front`) that ends TLS with
``--tls-dir`` and renumbers the client's deliveries as Service Bus
tolerates them (:mod:`.amqp_rewrite`). With ``--websocket-port N`` it also
takes AMQP over WebSockets on port ``N`` (Service Bus's is 443:
``TransportType.AmqpOverWebsocket``), through a relay to that AMQP port
(:mod:`.websocket_front`): ``wss`` with ``--tls-dir``, else ``ws``.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import Any

from proton import Event, Handler
from proton.reactor import Container

from sharedstream.testing.servicebus import config
from sharedstream.testing.servicebus.amqp_front import AmqpFront
from sharedstream.testing.servicebus.front import RelayFront, listen
from sharedstream.testing.servicebus.model import DEFAULT_KEY, AccessKey, Namespace, Refused
from sharedstream.testing.servicebus.service import ServiceBusService
from sharedstream.testing.servicebus.state import ServiceBusState
from sharedstream.testing.servicebus.state_file import StateFile
from sharedstream.testing.servicebus.websocket_front import WebSocketFront
from sharedstream.testing.tls import make_certificates

__all__ = ["ServerControl", "connection_string", "main", "serve", "tls_connection_string"]

TICK = 0.05
"""Seconds between lock-expiry sweeps: the precision of lock durations."""
PROTON_HOST = "127.0.0.1"
"""Where proton itself listens (any free port), reached by the AMQP front only."""


def connection_string(host: str, port: int, key: AccessKey = DEFAULT_KEY) -> str:
    """What the SDK connects to the server with: plain AMQP, signing with ``key``.

    The server accepts the tokens of its namespace's keys only
    (:mod:`.auth`); :data:`~.model.DEFAULT_KEY` unless the entities
    document names others.
    """
    return (f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key.name};"
            f"SharedAccessKey={key.secret};UseDevelopmentEmulator=true;")


def tls_connection_string(host: str, key: AccessKey = DEFAULT_KEY) -> str:
    """What the SDK connects to a TLS server with (``amqps``), signing with ``key``.

    Without ``UseDevelopmentEmulator`` the SDK speaks TLS, as to Azure, and
    drops any port from the endpoint (Azure's is always 5671): give it the
    server's port with the client option ``custom_endpoint_address``
    (``sb://host:port``) and its CA with ``connection_verify``.
    """
    return (f"Endpoint=sb://{host}/;SharedAccessKeyName={key.name};"
            f"SharedAccessKey={key.secret};")


class ServerControl:
    """Stops a running :func:`serve` from any thread or a signal handler (idempotent)."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask the server to stop; it does within one tick (:data:`TICK`)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()


class _Ticker(Handler):
    """The container's timer: expiry sweeps, and the stop check."""

    def __init__(self, service: ServiceBusService, control: ServerControl,
                 container: Container) -> None:
        super().__init__()
        self.service, self.control, self.container = service, control, container

    def on_timer_task(self, event: Event) -> None:
        """Stop if asked to; else sweep (:meth:`.ServiceBusService.tick`) and come back."""
        if self.control.stopping:
            self.container.stop()
            return
        self.service.tick()
        self.container.schedule(TICK, self)


def serve(host: str = "127.0.0.1", port: int = 0, *, state: ServiceBusState | None = None,
          entities: Mapping[str, Any] | None = None, control: ServerControl | None = None,
          ready: Callable[[int], None] | None = None, state_file: Path | None = None,
          namespace: Namespace | None = None, tls_dir: Path | None = None,
          websocket_port: int | None = None) -> None:
    """Serve on ``host:port`` (0 = any free port) until ``control`` asks to stop.

    ``state``: the broker state to serve (a new one when not given; create
    entities on it first, or from ``entities``, an entities document).
    ``state_file``: if it exists, loaded into ``state`` (which must have no
    entities; ``entities`` is then not applied); written after changes and
    when the server stops (:mod:`.state_file`). ``ready`` is called with the
    bound port once the server accepts connections. ``namespace``: its keys
    and message size limit (from ``entities`` when not given, see
    :func:`.config.namespace`; else the defaults). ``tls_dir``: serve
    ``amqps`` (TLS only) with the certificate in that directory, made there
    at start when missing (:func:`~sharedstream.testing.tls.make_certificates`;
    a client trusts ``ca.pem``); ``None``: plain AMQP. ``websocket_port``:
    also serve AMQP over WebSockets on that port (a port number, not 0), as
    :class:`~.websocket_front.WebSocketFront` does: ``wss`` with the same
    certificate when ``tls_dir`` is given, else ``ws``; it listens before
    the AMQP port does, so a client that reaches that one reaches it too.
    Clients reach proton (on :data:`PROTON_HOST`, any free port) through
    the AMQP front on ``host:port`` (:class:`~.amqp_front.AmqpFront`, which
    serves the TLS). Blocks the calling thread; every event and every state
    change runs on it (each front has a thread of its own, outside the
    state).
    """
    if websocket_port is not None and not 0 < websocket_port < 65536:
        raise ValueError(f"websocket_port is a port number, not {websocket_port}")
    state = state if state is not None else ServiceBusState()
    kept = None if state_file is None else StateFile(state_file)
    restored = kept is not None and kept.load(state)
    if entities and not restored:
        config.apply(state, entities)
    control = control or ServerControl()
    if namespace is None:
        namespace = config.namespace(entities or {})
    service = ServiceBusService(state, state.clock, kept, namespace)
    container = Container(service)
    container.container_id = "sharedstream-servicebus-test-server"
    certificates = None if tls_dir is None else make_certificates(tls_dir)
    with ExitStack() as sockets:
        front_socket = None if websocket_port is None else sockets.enter_context(
            listen(host, websocket_port))
        amqp_socket = sockets.enter_context(listen(host, port))
        acceptor = container.listen(f"{PROTON_HOST}:0")
        listening = acceptor._selectable._delegate  # proton's port: it was asked for any
        if not isinstance(listening, socket.socket):
            raise TypeError(f"proton listens on {listening!r}, not a socket")
        sockets.enter_context(listening)  # proton leaves it open: a server in a thread must not
        bound: int = amqp_socket.getsockname()[1]
        fronts: list[RelayFront] = [AmqpFront(amqp_socket, PROTON_HOST,
                                              listening.getsockname()[1], certificates)]
        if front_socket is not None:
            fronts.append(WebSocketFront(front_socket, host, bound, certificates))
        container.schedule(0, _Ticker(service, control, container))
        try:
            for front in fronts:
                front.start()
            if ready is not None:
                ready(bound)
            container.run()
        finally:
            for front in reversed(fronts):
                front.stop()
            acceptor.close()
            if kept is not None:
                kept.save(state)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: serve until SIGTERM or SIGINT; print the connection string."""
    parser = argparse.ArgumentParser(
        prog="python -m sharedstream.testing.servicebus",
        description="An Azure Service Bus test server (a subset, for the azure-servicebus SDK).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--queue", action="append", default=[], metavar="NAME[:OPTIONS]",
                        help="create a queue, e.g. 'orders:lock_duration=5,max_delivery_count=3,"
                             "sessions' (repeatable)")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME",
                        help="create a topic (repeatable)")
    parser.add_argument("--subscription", action="append", default=[],
                        metavar="TOPIC/NAME[:OPTIONS]",
                        help="create a subscription, with settings and one correlation filter, "
                             "e.g. 'events/urgent:subject=urgent,property.priority=high'")
    parser.add_argument("--config", type=Path, default=None,
                        help="a JSON entities document (see sharedstream.testing.servicebus."
                             "config), created before the --queue/--topic/--subscription ones")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="keep entities and messages in this file across restarts (loaded "
                             "on start if it exists - the entity options then do nothing - and "
                             "written after changes)")
    parser.add_argument("--tls-dir", type=Path, default=None,
                        help="serve amqps (TLS only) with the certificate in this directory, "
                             "made there at start when missing (clients trust its ca.pem)")
    parser.add_argument("--websocket-port", type=int, default=None, metavar="PORT",
                        help="also serve AMQP over WebSockets (GET /$servicebus/websocket, "
                             "subprotocol AMQPWSB10) on this port: wss with --tls-dir, else ws")
    args = parser.parse_args(argv)
    if args.websocket_port is not None and not 0 < args.websocket_port < 65536:
        parser.error(f"--websocket-port must be a port number (1-65535), "
                     f"not {args.websocket_port}")
    state = ServiceBusState()
    restoring = args.state_file is not None and args.state_file.exists()
    try:
        documents = [json.loads(args.config.read_text(encoding="utf-8"))] if args.config else []
        namespace = config.namespace(documents[0] if documents else {})
        documents.append(config.document_from_specs(args.queue, args.topic, args.subscription))
        for document in [] if restoring else documents:
            config.apply(state, document)
    except (OSError, ValueError, KeyError, Refused) as exc:
        parser.error(f"entities: {exc!r}")
    control = ServerControl()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        control.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    websockets = ("" if args.websocket_port is None else
                  f"; AMQP over WebSockets on {args.host}:{args.websocket_port}")
    serve(args.host, args.port, state=state, control=control, state_file=args.state_file,
          namespace=namespace, tls_dir=args.tls_dir, websocket_port=args.websocket_port,
          ready=lambda port: print(
              f"listening on {args.host}:{port} ({time.monotonic() - started:.2f} s){websockets}; "
              f"connection string: {_connection_string(args, port, namespace.keys[0])}",
              file=sys.stderr, flush=True))


def _connection_string(args: argparse.Namespace, port: int, key: AccessKey) -> str:
    if args.tls_dir is None:
        return connection_string(args.host, port, key)
    return (f"{tls_connection_string(args.host, key)} (with custom_endpoint_address "
            f"sb://{args.host}:{port} and connection_verify {args.tls_dir / 'ca.pem'})")
