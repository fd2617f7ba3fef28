"""moto's server: SQS (and S3) on a free loopback port, for correctness tests.

``moto_server`` comes with ``pip install 'moto[server]'`` (or ``moto`` plus
``flask`` and ``flask-cors``). Any region and keys work; SQS batch calls,
long polling, visibility changes, redrive to a dead-letter queue and FIFO
queues behave like SQS. It is slow (tens to hundreds of messages a second,
worse as a queue grows): use :mod:`.fauxqs` for volume.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from sharedstream.testing.brokers.process import (
    BrokerNotInstalled,
    free_port,
    start_process,
    stop_process,
)

__all__ = ["moto_server", "moto_server_command", "start_moto", "stop_moto"]


def moto_server_command() -> list[str]:
    """How to run ``moto_server``: next to the running interpreter first, then on ``PATH``.

    Raises :class:`BrokerNotInstalled` when neither has it.
    """
    script = Path(sys.executable).with_name("moto_server")
    if script.exists():
        return [str(script)]
    found = shutil.which("moto_server")
    if found is None:
        raise BrokerNotInstalled("moto_server is not installed: pip install 'moto[server]'")
    return [found]


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):  # noqa: S310 - loopback
            return True
    except OSError:
        return False


def start_moto(workdir: Path, *, port: int | None = None,
               timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start moto's server on a loopback port; return it and its endpoint URL.

    ``port``: a free one unless given (give the old one to restart a server
    in place; moto keeps nothing across a restart, so queues are made
    again). Returns once ``/moto-api/`` answers; its log is appended to
    ``workdir/moto.log``. Raises :class:`BrokerNotInstalled` or
    :class:`~.process.BrokerDidNotStart` (the process already stopped).
    """
    port = free_port() if port is None else port
    endpoint = f"http://127.0.0.1:{port}"
    process = start_process(
        "moto_server", [*moto_server_command(), "-H", "127.0.0.1", "-p", str(port)],
        log_path=workdir / "moto.log", ready=lambda: _answers(endpoint), timeout=timeout,
        env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
    )
    return process, endpoint


def stop_moto(process: subprocess.Popen[bytes]) -> None:
    """Terminate moto's server (kill it after 10 s). Idempotent."""
    stop_process(process, timeout=10)


@contextlib.contextmanager
def moto_server(workdir: Path | None = None) -> Iterator[str]:
    """Run moto's server for the ``with`` block; yields its endpoint URL.

    The URL is ``http://127.0.0.1:<port>``: give it to aiobotocore or boto3
    as ``endpoint_url``, with any region and keys. Stopped when the block
    ends, however it ends.
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moto-")))
        process, endpoint = start_moto(workdir)
        stack.callback(stop_moto, process)
        yield endpoint
