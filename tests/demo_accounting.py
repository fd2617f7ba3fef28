"""What a finished ``sharedstream demo`` run must have printed, on any broker.

The summary line must carry exactly the counts :func:`sharedstream.demo.expected_counts`
derives from the deterministic generator (``reconcile`` within its bounds: it
depends on the interleaving), and every progress line must be either the
broker's waiting phase or its advanced count. Used by the demo test of each
broker (``tests/kafka/test_demo_and_crash.py``, ``tests/pubsub/test_demo.py``,
``tests/servicebus/test_demo.py``).
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sharedstream.demo import expected_counts
from sharedstream.demo.brokers import demo_broker

ROOT = Path(__file__).resolve().parents[1]

SUMMARY = re.compile(
    r"done: (\d+) messages, (\d+) trigger events stored, (\d+) asset events, "
    r"DAG runs: ship (\d+), reconcile (\d+), notify (\d+) \(success (\d+)\), "
    r"(\d+) dead-lettered \(to (.+) on the demo's broker, gone with it\), [\d.]+s, "
    r"\d+ msgs/s once consuming")
PER_WATCHER = re.compile(r"events stored per watcher: (.+)")


def run_demo_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``sharedstream demo ARGS`` in a child process, from the repository's root."""
    return subprocess.run([sys.executable, "-m", "sharedstream", "demo", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def check_demo_run(result: subprocess.CompletedProcess[str], broker: str, messages: int) -> None:
    """Exit 0, the exact expected summary, and progress lines in the broker's words."""
    assert result.returncode == 0, result.stderr
    summary, per_watcher = result.stdout.strip().splitlines()[:2]
    found = SUMMARY.fullmatch(summary)
    assert found, summary
    *counts, dead_letters_at = found.groups()
    done, events, asset_events, ship, reconcile, notify, ran, dead = map(int, counts)
    labels = demo_broker(broker)
    assert dead_letters_at == labels.dead_letters_at
    expected = expected_counts(messages)
    watchers = PER_WATCHER.fullmatch(per_watcher)
    assert watchers, per_watcher
    stored = dict(item.rsplit(" ", 1) for item in watchers.group(1).split(", "))
    assert {watcher.split("/")[0]: int(n) for watcher, n in stored.items()} == expected.events
    assert sorted(stored) == ["big_orders/over_min", "eu_orders/eu", "orders/all", "refunds/all"]
    runs = expected.runs()
    assert done == messages
    assert events == asset_events == expected.trigger_events
    assert (ship, notify) == (runs["ship"], runs["notify"])
    low, high = runs["reconcile"]  # type: ignore[misc]
    assert low <= reconcile <= high
    assert dead == expected.dead_lettered > 0
    assert ran == ship + reconcile + notify  # every run ran, on the local target
    # The waiting phase (a group join, a stream opening), then how far the broker advanced.
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert any(labels.advanced_label in line for line in progress), result.stderr
    assert all(labels.waiting_label in line or labels.advanced_label in line
               for line in progress), progress


def check_interrupted_demo(broker: str, signals: int, *, started: str, progress: str) -> None:
    """Ctrl-C ``signals`` times into a long demo on ``broker``: exit 130, no traceback, its
    broker gone and its temp directory removed; one Ctrl-C also prints true counts.

    ``started`` matches the line naming the broker's ``host``, ``port`` and ``workdir``
    (named groups); ``progress`` matches a progress line once something was consumed.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharedstream", "demo", "--broker", broker,
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
        where = where or re.search(started, line)
        if where and re.search(progress, line):
            break
    host, port, workdir = where["host"], int(where["port"]), Path(where["workdir"])
    assert workdir.exists()
    proc.send_signal(signal.SIGINT)
    if signals == 2:
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    last_signal = time.monotonic()
    out, err = proc.communicate(timeout=60)
    exited_after = time.monotonic() - last_signal
    after_stop = err.partition("SIGINT: stopping")[2]
    err = "".join(seen) + err
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err[-3000:]
    assert "SIGINT: stopping" in err
    if signals == 2:  # "at once": the broker is killed, not asked to stop (Tansu ignores it)
        assert exited_after < 2.0, f"{exited_after:.1f} s after the second Ctrl-C"
    # The publisher stops at the first Ctrl-C: at most the batch it was sending completes.
    produced = {int(found) for found in re.findall(r"produced +(\d+)", after_stop)}
    assert len(produced) <= 2, after_stop
    assert not workdir.exists()
    with contextlib.suppress(ConnectionRefusedError), socket.create_connection(
            (host, port), timeout=2):
        raise AssertionError(f"the {broker} broker still listens on {host}:{port}")
    if signals == 1:
        found = re.match(r"interrupted: (\d+) messages", out)
        assert found, out
        assert 0 < int(found.group(1)) < 200_000


def check_missing_sdk(broker: str, module: str, error: str) -> None:
    """``demo --broker BROKER`` with ``module`` hidden: exit 2, and ``error`` is all it prints."""
    hide_sdk = (f"import sys; sys.modules[{module!r}] = None; "
                "from sharedstream.runtime.cli import main; "
                f"sys.exit(main(['demo', '--broker', {broker!r}, '--messages', '5']))")
    result = subprocess.run([sys.executable, "-c", hide_sdk], cwd=ROOT, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"sharedstream: error: {error}"]
