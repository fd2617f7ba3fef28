"""``sharedstream demo --broker servicebus`` end to end through the real CLI, and its errors."""

from __future__ import annotations

import time

import pytest

from tests.demo_accounting import (
    check_demo_run,
    check_interrupted_demo,
    check_missing_sdk,
    run_demo_cli,
)


def _servicebus_installed() -> bool:
    try:
        import azure.servicebus  # noqa: F401, PLC0415
        import proton  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


needs_servicebus = pytest.mark.skipif(not _servicebus_installed(),
                                      reason="the servicebus extra is not installed")


@needs_servicebus
def test_the_servicebus_demo_runs_to_completion_with_the_expected_counts() -> None:
    """Every record completed (the queue ends empty: the count is exact), the expected
    events and runs stored, the malformed records read back from the dead-letter sub-queue."""
    started = time.monotonic()
    result = run_demo_cli("--broker", "servicebus", "--messages", "200")
    assert time.monotonic() - started < 30
    check_demo_run(result, "servicebus", 200)
    assert "completed (below the oldest in the queue)" in result.stderr


def test_without_the_servicebus_sdk_the_demo_is_one_line_naming_the_extra() -> None:
    check_missing_sdk("servicebus", "azure.servicebus", "the demo needs Service Bus support: "
                      "pip install 'sharedstream[servicebus,testing]'")


@needs_servicebus
@pytest.mark.parametrize("signals", [
    # A graceful stop finishes the messages in flight; the producer completes them at tens
    # a second while the demo floods the server (docs/benchmarks.md, Service Bus end to
    # end), so it takes 7 to 50 s.
    pytest.param(1, marks=pytest.mark.slow),
    2,
])
def test_an_interrupted_servicebus_demo_stops_its_server_and_cleans_up(signals: int) -> None:
    """Ctrl-C (once: a graceful stop; twice: at once) exits 130, the server process stops
    with the demo, the temp directory goes and no traceback is printed."""
    check_interrupted_demo(
        "servicebus", signals,
        started=(r"servicebus test server on (?P<host>[\d.]+):(?P<port>\d+);.* "
                 r"working in (?P<workdir>\S+)"),
        progress=r"completed \(below the oldest in the queue\) +[1-9]")
