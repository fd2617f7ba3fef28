"""How much the triggerer logs when nothing goes well, and when nothing happens.

A real ``sharedstream triggerer`` runs a Kafka watcher pointed at a closed
port (an unreachable broker): our own ``broker call failed; retrying``
lines are held back like a client library's repeats, one per call a
minute. An idle one logs its first ``progress`` line at INFO and the
unchanged ones after it at DEBUG. A filter whose client turns the stop's
cancellation into an error is not reported as failed after ``stopping``;
one that really fails while the triggerer stops is not restarted.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.runtime.conftest import Deployment, wait_for

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "tests" / "ops" / "kafka_defs.py"
CLOSING = Path(__file__).with_name("stop_defs.py")


def closed_port() -> int:
    """A local port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
def test_an_unreachable_broker_gives_one_retry_line_per_call(deployment: Deployment) -> None:
    d = deployment
    d.env.update(OPS_KAFKA_BOOTSTRAP=f"127.0.0.1:{closed_port()}", OPS_KAFKA_TOPIC="orders")
    proc = d.start(KAFKA)
    # Two connection attempts (five retries each) and a restart in between.
    wait_for(lambda: d.stderr().count("trigger failed; restarting") >= 2, timeout=30,
             what="the stream failing twice")
    assert d.stop(proc) == 0
    log = d.stderr()
    retries = [line for line in log.splitlines() if "broker call failed; retrying" in line]
    assert len(retries) == 1, log
    assert "call='connecting the consumer'" in retries[0]
    assert "repeats_hidden_s=60" in retries[0]


@pytest.mark.slow  # about 30 s of waiting on an idle triggerer: the slow CI step
def test_an_idle_triggerer_logs_progress_only_when_something_changed(
    deployment: Deployment,
) -> None:
    d = deployment
    proc = d.start()
    time.sleep(21)  # progress lines come every ten seconds: two of them
    d.append({"kind": "order", "amount": 5})
    wait_for(lambda: d.stderr().count(" progress ") == 2, timeout=15,
             what="a progress line for the new order")
    assert d.stop(proc) == 0
    progress = [line for line in d.stderr().splitlines() if " progress " in line]
    assert [line.split()[2] for line in progress] == ["INFO", "INFO"], progress
    assert "stored=0 new=0" in progress[0]
    assert "new=0" not in progress[1]


def test_a_trigger_stopped_by_the_stop_is_not_a_failure(deployment: Deployment) -> None:
    d = deployment
    d.append(*({"kind": "order", "amount": n} for n in range(3)))
    proc = d.start(CLOSING)
    wait_for(lambda: d.committed() == 2, what="the three orders committed")
    signalled = time.monotonic()
    assert d.stop(proc) == 0
    assert time.monotonic() - signalled < 10, d.stderr()
    log = d.stderr()
    assert "stopping (" in log
    assert "trigger failed" not in log, log
    [closing] = [row for row in d.json("triggers", "list")
                 if row["classpath"].endswith(".ClosingFileLogTrigger")]
    assert (closing["errors"], closing["last_error"]) == (0, None)


def test_a_trigger_failing_while_stopping_is_not_restarted(deployment: Deployment) -> None:
    d = deployment
    mark = d.dir / "failing"
    d.env.update(STOP_FAIL_MARK=str(mark), STOP_FAIL_AFTER="1")
    d.append({"kind": "order", "amount": 1}, {"kind": "order", "amount": 2})
    proc = d.start(CLOSING)
    # The second order waits for the late filter, so the stop waits for it (in flight).
    wait_for(mark.exists, what="the late filter on its order")
    signalled = time.monotonic()
    assert d.stop(proc) == 0  # while the filter still holds the order
    assert time.monotonic() - signalled < 10, d.stderr()
    log = d.stderr()
    assert "trigger failed; restarting" not in log, log
    stopping = log.index("stopping (")
    failed = log.index("trigger failed while stopping; not restarted")
    assert stopping < failed
    assert "error=ValueError('cannot handle order 0')" in log[failed:]
    [late] = [row for row in d.json("triggers", "list")
              if row["classpath"].endswith(".FailsLateFileLogTrigger")]
    assert (late["errors"], late["last_error"]) == (1, "ValueError: cannot handle order 0")
