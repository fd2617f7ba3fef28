"""``sharedstream demo --broker pubsub`` end to end through the real CLI, and its errors."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.demo_accounting import ROOT, check_demo_run, run_demo_cli


def test_the_pubsub_demo_runs_to_completion_with_the_expected_counts() -> None:
    started = time.monotonic()
    result = run_demo_cli("--broker", "pubsub", "--messages", "500")
    assert time.monotonic() - started < 30
    check_demo_run(result, "pubsub", 500)
    assert "consumed and acked (server count)" in result.stderr


def test_without_the_pubsub_sdk_the_demo_is_one_line_naming_the_extra() -> None:
    hide_sdk = ("import sys; sys.modules['google.pubsub_v1'] = None; "
                "from sharedstream.runtime.cli import main; "
                "sys.exit(main(['demo', '--broker', 'pubsub', '--messages', '5']))")
    result = subprocess.run([sys.executable, "-c", hide_sdk], cwd=ROOT, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "sharedstream: error: the demo needs Pub/Sub support: pip install 'sharedstream[pubsub]'"]


@pytest.mark.parametrize("signals", [1, 2])
def test_an_interrupted_pubsub_demo_stops_its_server_and_cleans_up(signals: int) -> None:
    """Ctrl-C (once: a graceful stop; twice: at once) exits 130, the server stops with
    the demo, the temp directory goes and no traceback is printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharedstream", "demo", "--broker", "pubsub",
         "--messages", "200000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    where = None
    while True:  # the demo prints a progress line every half second
        line = proc.stderr.readline()
        assert line, f"the demo ended early: {''.join(seen)}"
        seen.append(line)
        where = where or re.match(r"pubsub test server on ([\d.]+):(\d+);.* working in (\S+)",
                                  line)
        if where and re.search(r"consumed and acked \(server count\) +[1-9]", line):
            break
    host, port, workdir = where.group(1), int(where.group(2)), Path(where.group(3))
    assert workdir.exists()
    proc.send_signal(signal.SIGINT)
    if signals == 2:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = "".join(seen) + err
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "SIGINT: stopping" in err
    assert not workdir.exists()
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, port), timeout=2):
        pass  # the server is gone
    if signals == 1:
        found = re.match(r"interrupted: (\d+) messages", out)
        assert found, out
        assert 0 < int(found.group(1)) < 200_000
