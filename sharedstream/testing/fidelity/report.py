"""A pytest plugin for the SDK test runs: leaves out the excluded tests, records every outcome.

Loaded with ``-p sharedstream.testing.fidelity.report`` into the SDK's own
test run. ``SHAREDSTREAM_FIDELITY_EXCLUDE`` names a JSON list of node-id
patterns (``fnmatch``) to deselect; ``SHAREDSTREAM_FIDELITY_SHARD``
(``I/N``) keeps the I-th shard's tests (:func:`shard_of`);
``SHAREDSTREAM_FIDELITY_TIMEOUTS`` names a JSON map of node id ->
seconds, the timeout of a test that waits longer than the run's by design
(a ``timeout`` mark, which pytest-timeout prefers to its setting);
``SHAREDSTREAM_FIDELITY_OUTCOMES`` names the
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
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

__all__ = ["ORDINARY_SECONDS", "outcome_of", "shard_of"]

_OUTCOMES: dict[str, str] = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def outcome_of(report: pytest.TestReport) -> str:
    """What one phase's report says about its test."""
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    return "passed"


ORDINARY_SECONDS = 20
"""What :func:`shard_of` counts for a test without a timeout of its own."""


def shard_of(tests: Sequence[str], slow: Mapping[str, int], count: int) -> list[int]:
    """The shard (``0 <= shard < count``) of each of ``tests``, in collection order.

    Balanced by expected time: the ``slow`` tests (node id -> their own
    timeout: minutes of sleep each) go first, longest first, each to the
    shard with the least time so far; then every other test, counted as
    :data:`ORDINARY_SECONDS`, in collection order, the same way (so a
    file's tests spread, and a shard holding a slow test gets fewer
    others). Ties go to the lowest shard. Pure: every process of a run
    computes the same.
    """
    load = [0] * count
    shards = [0] * len(tests)
    dealt = sorted((position for position, test in enumerate(tests) if test in slow),
                   key=lambda position: (-slow[tests[position]], position))
    others = [position for position, test in enumerate(tests) if test not in slow]
    for position in [*dealt, *others]:
        shard = min(range(count), key=lambda index: (load[index], index))
        shards[position] = shard
        load[shard] += slow.get(tests[position], ORDINARY_SECONDS)
    return shards


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect excluded tests and those of other shards; give slow ones their timeouts."""
    source = os.environ.get("SHAREDSTREAM_FIDELITY_EXCLUDE")
    patterns: list[str] = json.loads(Path(source).read_text(encoding="utf-8")) if source else []
    timeouts = os.environ.get("SHAREDSTREAM_FIDELITY_TIMEOUTS")
    seconds: dict[str, int] = json.loads(Path(timeouts).read_text(encoding="utf-8")) \
        if timeouts else {}
    index, _, count = os.environ.get("SHAREDSTREAM_FIDELITY_SHARD", "0/1").partition("/")
    shards = shard_of([item.nodeid for item in items], seconds, int(count))
    excluded = [item for item, shard in zip(items, shards, strict=True)
                if shard != int(index)
                or any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in patterns)]
    if excluded:
        config.hook.pytest_deselected(items=excluded)
        items[:] = [item for item in items if item not in excluded]
    for item in items:
        if item.nodeid in seconds:
            item.add_marker(pytest.mark.timeout(seconds[item.nodeid]))


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
