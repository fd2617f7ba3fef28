"""A pytest plugin for the SDK test runs: leaves out the excluded tests, records every outcome.

Loaded with ``-p sharedstream.testing.fidelity.report`` into the SDK's own
test run. ``SHAREDSTREAM_FIDELITY_EXCLUDE`` names a JSON list of node-id
patterns (``fnmatch``) to deselect; ``SHAREDSTREAM_FIDELITY_SHARD``
(``I/N``) keeps every N-th collected test from the I-th (round robin, so
slow tests spread); ``SHAREDSTREAM_FIDELITY_LONGER_TIMEOUTS`` names a JSON
list of ``[pattern, seconds]``: a test the first matching pattern names
gets that pytest-timeout instead of the run's; ``SHAREDSTREAM_FIDELITY_OUTCOMES`` names the
JSON file written at the end of the session: node id -> ``passed``,
``failed`` (the test body), ``error`` (its set-up or tear-down) or
``skipped``. A test that passed but whose tear-down failed is an
``error``; an expected failure of the SDK's own (``xfail``) is
``skipped``.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

import pytest

__all__ = ["outcome_of"]

_OUTCOMES: dict[str, str] = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def outcome_of(report: pytest.TestReport) -> str:
    """What one phase's report says about its test."""
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    return "passed"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests the exclusion patterns match, and those of the other shards.

    A test a longer-timeout pattern matches gets its ``timeout`` mark.
    """
    longer = os.environ.get("SHAREDSTREAM_FIDELITY_LONGER_TIMEOUTS")
    timeouts: list[list[object]] = (
        json.loads(Path(longer).read_text(encoding="utf-8")) if longer else [])
    for item in items:
        seconds = next((seconds for pattern, seconds in timeouts
                        if fnmatch.fnmatchcase(item.nodeid, str(pattern))), None)
        if seconds is not None:
            item.add_marker(pytest.mark.timeout(seconds))
    source = os.environ.get("SHAREDSTREAM_FIDELITY_EXCLUDE")
    patterns: list[str] = json.loads(Path(source).read_text(encoding="utf-8")) if source else []
    index, _, count = os.environ.get("SHAREDSTREAM_FIDELITY_SHARD", "0/1").partition("/")
    excluded = [item for position, item in enumerate(items)
                if position % int(count) != int(index)
                or any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in patterns)]
    if excluded:
        config.hook.pytest_deselected(items=excluded)
        items[:] = [item for item in items if item not in excluded]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the worst outcome of the test's phases."""
    outcome = outcome_of(report)
    if report.when != "call" and outcome == "passed":
        outcome = _OUTCOMES.get(report.nodeid, "passed")
    previous = _OUTCOMES.get(report.nodeid)
    if previous is None or _RANK[outcome] > _RANK[previous]:
        _OUTCOMES[report.nodeid] = outcome


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the outcomes where the runner reads them."""
    target = os.environ.get("SHAREDSTREAM_FIDELITY_OUTCOMES")
    if target:
        Path(target).write_text(json.dumps(_OUTCOMES, indent=1, sort_keys=True),
                                encoding="utf-8")
