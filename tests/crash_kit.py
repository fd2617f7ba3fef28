"""What the brokers' crash suites share: a killable test server, the triggerer's end, waits.

The crash suites (``tests/pubsub/test_crash.py``,
``tests/servicebus/test_crash.py``) run the real ``sharedstream
triggerer`` (:class:`tests.cli.TriggererCli`) against a broker's test
server running as its own process, kill one or the other, and account for
every message (:mod:`tests.chaos_accounting`). What is not about a broker
is here:

* :class:`RestartableServer` - a test server on one fixed port, so a
  SIGKILLed one restarts where its clients look for it;
* :func:`wait_until` - a bounded poll that fails early when the triggerer
  died;
* :func:`stop_cleanly` / :func:`kill` - the triggerer's two ends;
* :func:`assert_one_line_and_non_zero_exit` - what a triggerer must do
  when its entity does not exist;
* :func:`distinct` - one dead letter per source (the only allowance a
  crash suite makes for at-least-once).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sharedstream.testing.brokers.process import free_port, stop_process
from tests.chaos_accounting import DeadLetterRecord

__all__ = ["TRIGGERER_ENV", "RestartableServer", "assert_one_line_and_non_zero_exit",
           "distinct", "kill", "running", "stop_cleanly", "wait_until"]

TRIGGERER_ENV = {
    "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "10",
    "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.05",
    "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_MAX": "0.5",
    "SHAREDSTREAM__TRIGGERER__SHUTDOWN_TIMEOUT": "10",
}
"""The crash suites' triggerer settings: quick restarts after an outage, bounded shutdown."""


class RestartableServer:
    """A broker's test server as a child process on one port, killable and restartable.

    ``launch(port)`` starts the server on ``port`` and returns once it
    accepts connections (the kit's ``start_pubsub``, ``start_servicebus``);
    it is called again, on the same port, by each :meth:`start`.
    """

    def __init__(self, launch: Callable[[int], subprocess.Popen[bytes]]) -> None:
        self.port = free_port()
        self._launch = launch
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RestartableServer:
        """Start the server (again) on :attr:`port`."""
        self.process = self._launch(self.port)
        return self

    def kill(self) -> None:
        """SIGKILL: nothing flushed, no connection closed politely."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then a kill after 5 s (idempotent)."""
        if self.process is not None:
            stop_process(self.process)


@contextlib.contextmanager
def running(server: RestartableServer) -> Iterator[RestartableServer]:
    """``server`` started for the block, stopped however it ends."""
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_until(condition: Callable[[], bool], within: float, what: str,
               process: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Poll ``condition`` every 50 ms for ``within`` s; fail saying ``what`` (or a dead process).

    ``log`` (the triggerer's log file) is read when the wait fails, so the
    failure shows its last 3,000 characters as they were then.
    """
    deadline = time.monotonic() + within
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the triggerer exited ({process.returncode}) before {what}; "
                                 f"{_tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out ({within:.0f} s) waiting for {what}; {_tail(log)}")
        time.sleep(0.05)


def _tail(log: Path | None) -> str:
    """The last 3,000 characters of ``log`` (nothing when there is none yet)."""
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-3000:]


def stop_cleanly(process: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM ``process``; it must exit 0 within 30 s (its log's tail is the failure)."""
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=30)
    assert code == 0, log.read_text(errors="replace")[-3000:]


def kill(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``process`` if it is still running (for ``finally`` blocks)."""
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def assert_one_line_and_non_zero_exit(process: subprocess.Popen[bytes], log: Path, name: str,
                                      within: float) -> str:
    """``process`` exits non-zero within ``within`` s, its log naming ``name`` once; that line.

    A triggerer whose every watcher reads a missing entity has nothing to
    retry: it must say so once (no traceback, no retry loop) and exit. It
    is killed if it is still running after ``within`` s.
    """
    try:
        code: int | None = process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill(process)
    lines = log.read_text(errors="replace").splitlines()
    naming = [line for line in lines if name in line]
    assert code not in (None, 0), (f"exit {code} after {within} s (None: still running, "
                                   f"retrying); {len(lines)} log lines, {len(naming)} naming "
                                   f"{name}")
    assert len(naming) == 1, naming
    assert "Traceback" not in "\n".join(lines)
    return naming[0]


def distinct(letters: list[DeadLetterRecord]) -> list[DeadLetterRecord]:
    """One dead letter per source (a crash between publishing a letter and acking may repeat it)."""
    return list({letter.source: letter for letter in letters}.values())
