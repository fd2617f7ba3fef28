"""A local broker as a child process: start on a free loopback port, wait until it answers, stop.

Every broker helper of the kit (:mod:`.tansu`, :mod:`.moto`, :mod:`.fauxqs`)
is built on these three functions, so they share one set of guarantees:

1. the broker listens on ``127.0.0.1`` only, on a port chosen free just
   before it starts (:func:`free_port`);
2. :func:`start_process` returns only once the broker answers its
   readiness probe; if it exits, does not answer within the timeout, or the
   wait is interrupted (``KeyboardInterrupt`` included), the process is
   stopped before the exception leaves;
3. the process runs in its own session, so a Ctrl-C in the terminal reaches
   the caller only, and the caller stops the broker (in a ``finally``);
4. :func:`stop_process` terminates, waits a bounded time, then kills (or
   kills at once when asked); it is idempotent.

Errors are :class:`LocalBrokerError` subclasses named after what went wrong:
:class:`BrokerNotInstalled` (a test should skip) and
:class:`BrokerDidNotStart` (a test should fail).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sharedstream.engine.errors import SharedStreamError

__all__ = [
    "BrokerDidNotStart",
    "BrokerNotInstalled",
    "LocalBrokerError",
    "free_port",
    "port_answers",
    "start_process",
    "stop_process",
]


class LocalBrokerError(SharedStreamError):
    """A local broker of the testing kit could not be provided."""


class BrokerNotInstalled(LocalBrokerError):
    """What the broker needs is not installed here (a binary, a package, a Docker engine).

    The message names what is missing and how to install it. The kit's
    pytest fixtures turn it into a skip. Retrying does not help.
    """


class BrokerDidNotStart(LocalBrokerError):
    """The broker is installed but exited, or did not answer in time; the message names its log."""

    retryable = True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_answers(port: int, timeout: float = 0.2, *, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` (loopback by default)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def start_process(
    name: str, command: Sequence[str], *, log_path: Path, ready: Callable[[], bool],
    timeout: float = 30.0, env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command``, its output appended to ``log_path``; return once ``ready()`` is true.

    ``ready`` is polled every 20 ms and must return promptly (bounded
    probes). Raises :class:`BrokerDidNotStart` if the process exits first or
    ``timeout`` seconds pass; the process is stopped before any exception
    (``KeyboardInterrupt`` too) leaves this function.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(  # noqa: S603 - a broker command the kit built
            list(command), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            start_new_session=True,  # Ctrl-C reaches the caller, which stops the broker
        )
    try:
        _wait_until_ready(name, process, ready, timeout, log_path)
    except BaseException:  # an error, a timeout or Ctrl-C: never leave the broker behind
        stop_process(process)
        raise
    return process


def _wait_until_ready(
    name: str, process: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float,
    log_path: Path,
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise BrokerDidNotStart(f"{name} exited with {process.returncode}"
                                    f"{_last_line(log_path)}; see {log_path}")
        if time.monotonic() > deadline:
            raise BrokerDidNotStart(f"{name} did not answer within {timeout:.0f} s"
                                    f"{_last_line(log_path)}; see {log_path}")
        time.sleep(0.02)


def _last_line(log_path: Path, limit: int = 200) -> str:
    """``: <the log's last non-blank line>`` (cut to ``limit``), or ``""`` when there is none.

    The reason a broker died is usually its last words; the error carries them
    so nobody has to go and read the file (the message stays one line).
    """
    try:
        with log_path.open("rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - 4096))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return f": {last if len(last) <= limit else last[: limit - 1] + '…'}"


def stop_process(process: subprocess.Popen[bytes], timeout: float = 5.0, *,
                 at_once: bool = False) -> None:
    """Terminate ``process``; kill it if it has not exited after ``timeout`` s. Idempotent.

    ``at_once`` kills it straight away (SIGKILL), for a caller that is
    exiting at once and throws the broker's state away.
    """
    if process.poll() is None:
        if not at_once:
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            else:
                return
        process.kill()
        process.wait(timeout=timeout)
