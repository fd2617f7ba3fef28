"""The kit's Azure Service Bus test server as a child process on a free loopback port.

The server is :mod:`sharedstream.testing.servicebus` (a subset of Service
Bus over AMQP 1.0, written for the real ``azure-servicebus`` SDK; the
official emulator needs Docker). It needs ``python-qpid-proton``: ``pip
install 'sharedstream[testing]'`` (built from source). A client reaches it with the
connection string returned here
(``Endpoint=sb://127.0.0.1:<port>;...;UseDevelopmentEmulator=true;``).

Entities are created at start from an entities document
(:mod:`sharedstream.testing.servicebus.config`), written to the work
directory and passed with ``--config``. The server runs as its own
process, started with the running interpreter, so it has a core of its
own: the SDK's work does not compete with it for the test process's GIL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sharedstream.testing.brokers.process import (
    BrokerNotInstalled,
    free_port,
    port_answers,
    start_process,
    stop_process,
)
from sharedstream.testing.tls import ServerCertificates, kit_tls_dir

__all__ = ["servicebus_server", "start_servicebus", "stop_servicebus", "tls_client_options"]


def _check_installed() -> None:
    if importlib.util.find_spec("proton") is None:
        raise BrokerNotInstalled("the Service Bus test server needs python-qpid-proton: "
                                 "pip install 'sharedstream[testing]' (pip builds it: a C compiler "
                                 "and Python's headers)")


def _connection_string(port: int, entities: Mapping[str, Any] | None, *, tls: bool) -> str:
    """The string of the document's first key (``k``/``v`` when it names none)."""
    keys = (entities or {}).get("keys") or [{"name": "k", "key": "v"}]
    signing = f"SharedAccessKeyName={keys[0]['name']};SharedAccessKey={keys[0]['key']};"
    if tls:  # no emulator flag: the SDK speaks TLS, as to Azure (and drops the port)
        return f"Endpoint=sb://127.0.0.1/;{signing}"
    return f"Endpoint=sb://127.0.0.1:{port};{signing}UseDevelopmentEmulator=true;"


def tls_client_options(workdir: Path, port: int) -> dict[str, str]:
    """The producer's (and the SDK client's) options to reach a ``tls`` server on ``port``.

    ``connection_verify``: the server's CA; ``custom_endpoint_address``:
    its port (the SDK otherwise dials 5671). For AMQP over WebSockets,
    ``port`` is the ``websocket_port`` (the SDK otherwise dials 443), with
    the client option ``transport_type=TransportType.AmqpOverWebsocket``.
    """
    ca_file = ServerCertificates.in_directory(kit_tls_dir(workdir)).ca_file
    return {"connection_verify": str(ca_file), "custom_endpoint_address": f"sb://127.0.0.1:{port}"}


def start_servicebus(workdir: Path, *, entities: Mapping[str, Any] | None = None,
                     port: int | None = None, state_file: Path | None = None,
                     tls: bool = False, websocket_port: int | None = None,
                     timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start the test server on a loopback port; return it and its connection string.

    ``entities``: the queues, topics and subscriptions to create (an
    entities document, see :mod:`sharedstream.testing.servicebus.config`),
    written to ``workdir/servicebus-entities.json``. ``port``: a free one
    unless given (give the old one to restart a server in place).
    ``state_file``: keep entities and messages there across a kill
    (``--state-file``; where it exists, ``entities`` is not applied). The
    connection string signs with the document's first key (``keys``; the
    server refuses tokens of any other). ``tls``: serve ``amqps`` only, with
    a certificate made in ``kit_tls_dir(workdir)`` (``--tls-dir``); the
    connection string is then a TLS one, to be used with the client options
    of :func:`tls_client_options`. ``websocket_port``: also serve AMQP over
    WebSockets on that port (``--websocket-port``; ``wss`` with ``tls``,
    else ``ws``), which the SDK reaches with ``custom_endpoint_address``
    ``sb://127.0.0.1:<websocket_port>`` and
    ``transport_type=TransportType.AmqpOverWebsocket``.
    Returns once the port accepts connections (the server creates the
    entities before it binds). Its log is appended to
    ``workdir/servicebus.log``. Raises :class:`BrokerNotInstalled` or
    :class:`~.process.BrokerDidNotStart` (the process already stopped; a
    malformed document is one way).
    """
    _check_installed()
    chosen = free_port() if port is None else port
    command = [sys.executable, "-m", "sharedstream.testing.servicebus", "--port", str(chosen)]
    if entities:
        workdir.mkdir(parents=True, exist_ok=True)
        document = workdir / "servicebus-entities.json"
        document.write_text(json.dumps(entities, indent=1), encoding="utf-8")
        command += ["--config", str(document)]
    if state_file is not None:
        command += ["--state-file", str(state_file)]
    if tls:
        command += ["--tls-dir", str(kit_tls_dir(workdir))]
    if websocket_port is not None:  # bound before the AMQP port: ready means both are
        command += ["--websocket-port", str(websocket_port)]
    process = start_process(
        "the Service Bus test server", command, log_path=workdir / "servicebus.log",
        ready=lambda: port_answers(chosen), timeout=timeout,
    )
    return process, _connection_string(chosen, entities, tls=tls)


def stop_servicebus(process: subprocess.Popen[bytes]) -> None:
    """Stop the test server (SIGTERM, then a kill after 5 s). Idempotent."""
    stop_process(process)


@contextlib.contextmanager
def servicebus_server(workdir: Path | None = None, *,
                      entities: Mapping[str, Any] | None = None,
                      websocket_port: int | None = None) -> Iterator[str]:
    """Run the Service Bus test server for the ``with`` block; yields its connection string.

    ``entities`` and ``websocket_port`` (plain ``ws`` here, as its AMQP port
    is plain) as for :func:`start_servicebus`. The log goes to
    ``workdir/servicebus.log`` (a temporary directory when not given).
    Stopped when the block ends, however it ends.
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="servicebus-")))
        process, connection_string = start_servicebus(workdir, entities=entities,
                                                      websocket_port=websocket_port)
        stack.callback(stop_servicebus, process)
        yield connection_string
