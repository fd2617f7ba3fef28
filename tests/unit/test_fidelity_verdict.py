"""The fidelity suite's verdict: an SDK run's outcomes against the expected-failure list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharedstream.testing.fidelity.report import ORDINARY_SECONDS, shard_of
from sharedstream.testing.fidelity.verdict import (
    Exclusion,
    Expectations,
    ExpectationsError,
    SlowTest,
    judge,
    load_expectations,
)

LISTED = Expectations({"t.py::deferral": "receiving deferred messages"})


def test_a_clean_run_counts_every_test_once() -> None:
    verdict = judge({"t.py::a": "passed", "t.py::b": "skipped", "t.py::deferral": "failed"},
                    LISTED)
    assert verdict.ok
    assert verdict.counts() == {"passed": 1, "failed": 0, "expected_fail": 1, "unstable": 0,
                                "skipped": 1}


@pytest.mark.parametrize("outcome", ["passed", "failed"])
def test_an_unstable_test_is_counted_whatever_it_does(outcome: str) -> None:
    expectations = Expectations({}, unstable={"t.py::timed": "waits on the wall clock"})
    verdict = judge({"t.py::a": "passed", "t.py::timed": outcome}, expectations)
    assert verdict.ok
    assert (verdict.passed, verdict.unstable, verdict.failed) == (1, 1, 0)
    assert judge({"t.py::a": "passed"}, expectations).problems == (
        "t.py::timed is on the unstable list but did not run",)



def test_a_selection_does_not_miss_the_listed_tests_it_left_out() -> None:
    """``-k``: what did not run is not judged; what ran still is."""
    assert judge({"t.py::a": "passed"}, LISTED).problems  # a whole run misses it
    assert judge({"t.py::a": "passed"}, LISTED, partial=True).ok
    assert not judge({"t.py::a": "passed", "t.py::deferral": "passed"}, LISTED,
                     partial=True).ok


def test_a_listed_test_that_passes_fails_the_run_naming_the_feature() -> None:
    verdict = judge({"t.py::a": "passed", "t.py::deferral": "passed"}, LISTED)
    assert not verdict.ok
    assert verdict.problems == (
        "t.py::deferral passed but is listed as needing 'receiving deferred messages': "
        "take it off the expected-failure list",)


@pytest.mark.parametrize("outcome", ["failed", "error"])
def test_an_unlisted_failure_fails_the_run(outcome: str) -> None:
    verdict = judge({"t.py::a": outcome, "t.py::deferral": "error"}, LISTED)
    assert verdict.problems == (f"t.py::a {outcome} and is not on the expected-failure list",)
    assert (verdict.failed, verdict.expected_fail) == (1, 1)


def test_a_listed_test_that_did_not_run_fails_the_run() -> None:
    verdict = judge({"t.py::a": "passed"}, LISTED)
    assert verdict.problems == ("t.py::deferral is on the expected-failure list "
                                "('receiving deferred messages') but did not run",)


def test_a_run_where_nothing_passed_is_not_ok() -> None:
    assert not judge({"t.py::a": "skipped"}, Expectations({})).ok
    assert not judge({}, Expectations({})).ok


def test_an_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown outcome 'xpassed'"):
        judge({"t.py::a": "xpassed"}, Expectations({}))


def test_the_list_is_read_per_suite(tmp_path: Path) -> None:
    path = tmp_path / "expected.toml"
    path.write_text('[sb.expected_failures]\n"t.py::x" = "list sessions"\n'
                    '[[sb.excluded]]\npattern = "*-ws]"\nreason = "WebSockets"\n',
                    encoding="utf-8")
    assert load_expectations(path, "sb") == Expectations(
        {"t.py::x": "list sessions"}, (Exclusion("*-ws]", "WebSockets"),))
    with pytest.raises(ExpectationsError, match=r"no \[pubsub\] table"):
        load_expectations(path, "pubsub")


def test_an_entry_without_its_feature_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "expected.toml"
    path.write_text('[sb.expected_failures]\n"t.py::x" = ""\n', encoding="utf-8")
    with pytest.raises(ExpectationsError, match="the feature it needs or why"):
        load_expectations(path, "sb")


def test_a_slow_test_gets_its_own_timeout_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "expected.toml"
    path.write_text('[sb.expected_failures]\n[sb.slow]\n'
                    '"t.py::idle" = { seconds = 420, reason = "sleeps 5 min" }\n',
                    encoding="utf-8")
    assert load_expectations(path, "sb").slow == {"t.py::idle": SlowTest(420, "sleeps 5 min")}
    for entry in ('420', '{ seconds = 420 }', '{ seconds = 0, reason = "r" }',
                  '{ seconds = 4.5, reason = "r" }'):
        path.write_text(f'[sb.expected_failures]\n[sb.slow]\n"t.py::idle" = {entry}\n',
                        encoding="utf-8")
        with pytest.raises(ExpectationsError, match=r"'t.py::idle' needs seconds"):
            load_expectations(path, "sb")


def test_the_runner_gives_a_slow_test_its_timeout(tmp_path: Path) -> None:
    """The report plugin marks the listed test: a 1 s timeout beats the run's 60 s."""
    (tmp_path / "test_sleepy.py").write_text(
        "import time\n\ndef test_sleepy():\n    time.sleep(5)\n\n"
        "def test_quick():\n    pass\n", encoding="utf-8")
    (tmp_path / "timeouts.json").write_text('{"test_sleepy.py::test_sleepy": 1}',
                                            encoding="utf-8")
    outcomes = tmp_path / "outcomes.json"
    env = {**os.environ, "SHAREDSTREAM_FIDELITY_TIMEOUTS": str(tmp_path / "timeouts.json"),
           "SHAREDSTREAM_FIDELITY_OUTCOMES": str(outcomes)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-p", "sharedstream.testing.fidelity.report", "-o", "timeout=60",
                    "-o", "addopts=", "-o", "filterwarnings=", "test_sleepy.py"],
                   cwd=tmp_path, env=env, capture_output=True, timeout=60, check=False)
    assert json.loads(outcomes.read_text(encoding="utf-8")) == {
        "test_sleepy.py::test_quick": "passed", "test_sleepy.py::test_sleepy": "failed"}


def test_shards_balance_the_slow_tests_first_and_spread_the_rest() -> None:
    tests = [f"t.py::t{i}" for i in range(40)]
    slow = {"t.py::t3": 400, "t.py::t4": 300, "t.py::t30": 300}
    shards = shard_of(tests, slow, 8)
    assert [shards[3], shards[4], shards[30]] == [0, 1, 2]
    load = [0] * 8
    for test, shard in zip(tests, shards, strict=True):
        load[shard] += slow.get(test, ORDINARY_SECONDS)
    assert max(load) == 400  # a slow test's shard takes no ordinary test past it
    rest = [shard for test, shard in zip(tests, shards, strict=True) if test not in slow]
    assert shards[:3] == [3, 4, 5]  # collection order, least loaded first
    assert rest.count(0) == 0
    assert rest.count(7) > rest.count(1)
    assert shard_of(tests, {}, 8) == [position % 8 for position in range(40)]
    assert shard_of(tests, slow, 1) == [0] * 40
    assert shard_of(tests, slow, 8) == shards  # every process computes the same


def test_the_checked_in_list_names_a_feature_for_every_entry() -> None:
    from sharedstream.testing.fidelity.__main__ import EXPECTATIONS  # noqa: PLC0415
    from sharedstream.testing.fidelity.suites import SUITES  # noqa: PLC0415

    for suite in SUITES:
        expectations = load_expectations(EXPECTATIONS, suite)
        assert all(reason for reason in expectations.expected_failures.values())
        assert all(reason for reason in expectations.unstable.values())
        assert not set(expectations.unstable) & set(expectations.expected_failures)
        assert all(item.reason for item in expectations.excluded)
