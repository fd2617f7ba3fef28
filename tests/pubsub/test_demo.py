"""``sharedstream demo --broker pubsub`` end to end through the real CLI, and its errors."""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharedstream.demo.pubsub import PubSubDemoBroker
from tests.demo_accounting import (
    ROOT,
    check_demo_run,
    check_interrupted_demo,
    check_missing_sdk,
    run_demo_cli,
)


def test_the_pubsub_demo_runs_to_completion_with_the_expected_counts() -> None:
    started = time.monotonic()
    result = run_demo_cli("--broker", "pubsub", "--messages", "500")
    assert time.monotonic() - started < 30
    check_demo_run(result, "pubsub", 500)
    assert "consumed and acked (server count)" in result.stderr


def test_without_the_pubsub_sdk_the_demo_is_one_line_naming_the_extra() -> None:
    check_missing_sdk("pubsub", "google.pubsub_v1",
                      "the demo needs Pub/Sub support: pip install 'sharedstream[pubsub]'")


@pytest.mark.parametrize("signals", [1, 2])
def test_an_interrupted_pubsub_demo_stops_its_server_and_cleans_up(signals: int) -> None:
    """Ctrl-C (once: a graceful stop; twice: at once) exits 130, the server stops with
    the demo, the temp directory goes and no traceback is printed."""
    check_interrupted_demo(
        "pubsub", signals,
        started=(r"pubsub test server on (?P<host>[\d.]+):(?P<port>\d+);.* "
                 r"working in (?P<workdir>\S+)"),
        progress=r"consumed and acked \(server count\) +[1-9]")


def test_a_ctrl_c_after_the_triggerer_stopped_exits_at_once_without_a_traceback() -> None:
    """The second Ctrl-C lands after the triggerer's run ended, while the demo reads its
    dead letters (a Pull that waits half a second for nothing): it exits at once, 130.

    The triggerer's signal handlers end with its run; Python's default one then
    raised KeyboardInterrupt with the demo's gRPC calls in flight, and the
    in-process server's thread printed "Event loop is closed" tracebacks (the
    flaky ``[2]`` case above when its second Ctrl-C came that late). The
    demo's log line at INFO saying the run is over marks the moment.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharedstream", "demo", "--broker", "pubsub",
         "--messages", "200000", "--log-level", "INFO"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []

    def read_until(pattern: str) -> re.Match[str]:
        while True:
            line = proc.stderr.readline() if proc.stderr is not None else ""
            assert line, f"the demo ended early: {''.join(seen)}"
            seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    try:
        where = read_until(r"pubsub test server on (?P<host>[\d.]+):(?P<port>\d+);.* "
                           r"working in (?P<workdir>\S+)")
        read_until(r"consumed and acked \(server count\) +[1-9]")
        proc.send_signal(signal.SIGINT)
        read_until(r"the triggerer's run is over")  # and the demo reads its dead letters
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(seen) + err
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "stopped at once" in err, err[-3000:]
    assert not Path(where["workdir"]).exists()
    with contextlib.suppress(ConnectionRefusedError), socket.create_connection(
            (where["host"], int(where["port"])), timeout=2):
        raise AssertionError("the demo's Pub/Sub server still listens")


def test_the_demos_server_drops_grpcs_error_for_an_answer_nobody_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C leaves the publisher's last answer untaken: no traceback for that.

    gRPC's aio server logs it as an ERROR with a traceback (seen once in a CI run of the
    test above); the demo's own server quiets it as the kit's ``serve`` does.
    """
    core_log = logging.getLogger("grpc._cython.cygrpc")
    monkeypatch.setattr(core_log, "filters", [])  # whatever an earlier server installed
    gone = logging.LogRecord("grpc._cython.cygrpc", logging.ERROR, __file__, 1,
                             "ExecuteBatchError raised in core by servicer method [%s]",
                             ("/google.pubsub.v1.Publisher/Publish",), None)
    other = logging.LogRecord("grpc._cython.cygrpc", logging.ERROR, __file__, 1,
                              "something else", (), None)
    assert core_log.filter(gone)  # nothing installed yet

    broker = PubSubDemoBroker()
    broker.start(tmp_path)
    try:
        assert not core_log.filter(gone)
        assert core_log.filter(other)
    finally:
        broker.stop()
