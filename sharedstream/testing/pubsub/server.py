"""Run the Pub/Sub test server: ``python -m sharedstream.testing.pubsub --port N``.

:func:`serve` runs it in the current event loop until cancelled; :func:`main`
is the command line, which stops cleanly on SIGTERM or SIGINT. The testing
kit starts it as a child process (:func:`sharedstream.testing.brokers.pubsub_server`),
so the server has a core of its own and the client's threads do not compete
with it for the test process's GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import grpc.aio

from sharedstream.testing.pubsub.service import PAYLOAD_LIMIT, PubSubService
from sharedstream.testing.tls import make_certificates

__all__ = ["SERVER_OPTIONS", "ClientGoneFilter", "main", "quiet_gone_clients", "serve"]

SERVER_OPTIONS = (("grpc.max_receive_message_length", 2 * PAYLOAD_LIMIT),
                  ("grpc.max_send_message_length", -1))
"""gRPC options of the server (gRPC's defaults: 4 MiB received, so a 5 MB publish failed with
``RESOURCE_EXHAUSTED``, a status the SDK's publisher retries). It takes requests up to twice
Pub/Sub's limits, so that it refuses them as Pub/Sub does (``INVALID_ARGUMENT``, see
:mod:`.service`), and still bounds what one request may make it buffer; it answers with
messages of any size."""


class ClientGoneFilter(logging.Filter):
    """Drops gRPC's ERROR for an answer the server could not send: the client had gone.

    A publisher stopped mid-call (a demo's second Ctrl-C, a killed test) leaves
    its call's answer with nobody to take it; gRPC's aio server logs that as
    ``ExecuteBatchError raised in core by servicer method ...`` with a
    traceback. For a test server that is no error of its own. Every other
    record passes. :func:`quiet_gone_clients` installs one on the
    ``grpc._cython.cygrpc`` logger for the rest of the process (gRPC can log
    such a call after the server stopped).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for that one record, ``True`` for any other."""
        return not record.getMessage().startswith("ExecuteBatchError raised in core by servicer")


_GRPC_CORE_LOG = "grpc._cython.cygrpc"


def quiet_gone_clients() -> None:
    """Install a :class:`ClientGoneFilter` on gRPC's core logger, once per process, for good.

    Every gRPC server of the test service calls this before it starts
    (:func:`serve`, the demo's). Never removed: gRPC can log a gone client's
    call after ``server.stop()`` has returned (seen on a demo's second Ctrl-C).
    """
    core_log = logging.getLogger(_GRPC_CORE_LOG)
    if not any(isinstance(installed, ClientGoneFilter) for installed in core_log.filters):
        core_log.addFilter(ClientGoneFilter())


async def serve(host: str = "127.0.0.1", port: int = 0, *,
                ready: Callable[[int], None] | None = None,
                state_file: Path | None = None, tls_dir: Path | None = None) -> None:
    """Serve on ``host:port`` (0 = any free port) until cancelled.

    ``ready`` is called with the bound port once the server accepts calls.
    ``state_file``: loaded on start if it exists and written after every
    change, so that a restarted server has what the last one had
    (:mod:`.state_file`); ``None``: in memory only.
    ``tls_dir``: serve TLS (only) with the certificate in that directory,
    made there at start when missing (:func:`~sharedstream.testing.tls.make_certificates`;
    a client trusts ``ca.pem``); ``None``: plain text.
    On cancellation the server stops at once (no grace: in-flight streams
    end) and the cancellation propagates.
    """
    service = PubSubService(state_file=state_file)
    server = grpc.aio.server(handlers=service.handlers(), options=SERVER_OPTIONS)
    if tls_dir is None:
        bound = server.add_insecure_port(f"{host}:{port}")
    else:
        files = make_certificates(tls_dir)
        bound = server.add_secure_port(f"{host}:{port}", grpc.ssl_server_credentials(
            [(files.key_file.read_bytes(), files.cert_file.read_bytes())]))
    quiet_gone_clients()
    await server.start()
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.sweep(), name="pubsub-sweep")
            if ready is not None:
                ready(bound)
            await server.wait_for_termination()
    finally:
        await server.stop(grace=None)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: serve until SIGTERM or SIGINT; print ``listening on host:port``."""
    parser = argparse.ArgumentParser(prog="python -m sharedstream.testing.pubsub",
                                     description="A Google Pub/Sub test server (a subset).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="keep topics, subscriptions and unsettled messages in this file "
                             "across restarts (loaded on start, written after every change)")
    parser.add_argument("--tls-dir", type=Path, default=None,
                        help="serve TLS with the certificate in this directory, made there at "
                             "start when missing (clients trust its ca.pem)")
    args = parser.parse_args(argv)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with asyncio.TaskGroup() as tasks:
            server = tasks.create_task(serve(args.host, args.port, ready=lambda port: print(
                f"listening on {args.host}:{port}", file=sys.stderr, flush=True),
                state_file=args.state_file, tls_dir=args.tls_dir), name="pubsub-serve")
            await stop.wait()
            server.cancel()  # a clean exit: the server stops, the group ends

    asyncio.run(run())
