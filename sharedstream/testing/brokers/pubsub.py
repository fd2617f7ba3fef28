"""The kit's Pub/Sub test server as a child process on a free loopback port.

The server is :mod:`sharedstream.testing.pubsub` (a subset of Pub/Sub,
written for the real ``google-cloud-pubsub`` client; no emulator ships
outside gcloud). It needs ``google-cloud-pubsub`` (grpcio comes with it):
``pip install 'sharedstream[pubsub]'``. A client reaches it by setting
``PUBSUB_EMULATOR_HOST`` to the ``host:port`` yielded here *before* it is
created.

It runs as its own process, started with the running interpreter, so it
has a core of its own: the client's threads do not compete with it for
the test process's GIL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sharedstream.testing.brokers.process import (
    BrokerNotInstalled,
    free_port,
    port_answers,
    start_process,
    stop_process,
)
from sharedstream.testing.tls import ServerCertificates, kit_tls_dir

__all__ = ["pubsub_server", "start_pubsub", "stop_pubsub", "tls_ca_file"]


def _check_installed() -> None:
    for module in ("grpc", "google.pubsub_v1"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package (google) is missing
            found = False
        if not found:
            raise BrokerNotInstalled(f"the Pub/Sub test server needs {module}: "
                                     "pip install 'sharedstream[pubsub]'")


def start_pubsub(workdir: Path, *, port: int | None = None, state_file: Path | None = None,
                 tls: bool = False, timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start the test server on a loopback port; return it and its ``host:port``.

    ``port``: a free one unless given (give the old one to restart a server
    in place). ``state_file``: keep topics, subscriptions and unacked
    messages there across a kill (``--state-file``). ``tls``: serve TLS
    only, with a certificate made in ``kit_tls_dir(workdir)`` (``--tls-dir``); a
    client trusts ``tls_ca_file(workdir)``. Returns once the port
    accepts connections (the server binds it only after its services are
    registered). Its log is appended to ``workdir/pubsub.log``. Raises
    :class:`BrokerNotInstalled` or :class:`~.process.BrokerDidNotStart` (the
    process already stopped).
    """
    _check_installed()
    chosen = free_port() if port is None else port
    extra = [] if state_file is None else ["--state-file", str(state_file)]
    if tls:
        extra += ["--tls-dir", str(kit_tls_dir(workdir))]
    process = start_process(
        "the Pub/Sub test server",
        [sys.executable, "-m", "sharedstream.testing.pubsub", "--port", str(chosen), *extra],
        log_path=workdir / "pubsub.log", ready=lambda: port_answers(chosen), timeout=timeout,
    )
    return process, f"127.0.0.1:{chosen}"


def tls_ca_file(workdir: Path) -> Path:
    """The CA file a client trusts to reach a server started with ``tls`` in ``workdir``."""
    return ServerCertificates.in_directory(kit_tls_dir(workdir)).ca_file


def stop_pubsub(process: subprocess.Popen[bytes]) -> None:
    """Stop the test server (SIGTERM, then a kill after 5 s). Idempotent."""
    stop_process(process)


@contextlib.contextmanager
def pubsub_server(workdir: Path | None = None) -> Iterator[str]:
    """Run the Pub/Sub test server for the ``with`` block; yields its ``"127.0.0.1:<port>"``.

    Set ``PUBSUB_EMULATOR_HOST`` to it before creating a client. The log
    goes to ``workdir/pubsub.log`` (a temporary directory when not given).
    Stopped when the block ends, however it ends.
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pubsub-")))
        process, host = start_pubsub(workdir)
        stack.callback(stop_pubsub, process)
        yield host
