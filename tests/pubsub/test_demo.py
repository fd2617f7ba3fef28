"""``sharedstream demo --broker pubsub`` end to end through the real CLI, and its errors."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.demo_accounting import ROOT, check_demo_run, check_interrupted_demo, run_demo_cli


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
    check_interrupted_demo(
        "pubsub", signals,
        started=(r"pubsub test server on (?P<host>[\d.]+):(?P<port>\d+);.* "
                 r"working in (?P<workdir>\S+)"),
        progress=r"consumed and acked \(server count\) +[1-9]")
