"""The fidelity suite's verdict: a run's outcomes against the checked-in expectations.

Pure and synchronous: the runner hands in what pytest reported per test
(node id -> ``passed``/``failed``/``error``/``skipped``) and what
``expected_failures.toml`` says, and gets the counts and the list of
problems back.

Invariants:

1. A test on the expected-failure list that passes is a problem ("take it
   off the list"): the list never hides a feature that now works.
2. A test that fails (or errors) and is not on the list is a problem: the
   list never grows silently.
3. A test on the list that did not run at all is a problem: a renamed or
   removed test does not leave a stale entry behind.
4. A test on the unstable list (it passes or fails from run to run, for a
   reason named there) is counted as ``unstable`` whatever its outcome, and
   is never a problem: it is neither proof nor disproof.
5. Every test that ran is counted exactly once: ``passed``, ``failed``
   (unexpected), ``expected_fail``, ``unstable`` or ``skipped``; ``ok`` is
   true when and only when there is no problem and something passed.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "OUTCOMES",
    "Exclusion",
    "Expectations",
    "ExpectationsError",
    "SlowTest",
    "Verdict",
    "judge",
    "load_expectations",
]

Outcome = Literal["passed", "failed", "error", "skipped"]
OUTCOMES: Final = ("passed", "failed", "error", "skipped")
_FAILED: Final = ("failed", "error")


class ExpectationsError(ValueError):
    """The expectations file is malformed; the message names the entry."""


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """Tests not run at all: a node-id pattern (``fnmatch``) and the reason."""

    pattern: str
    reason: str


@dataclasses.dataclass(frozen=True)
class SlowTest:
    """A test that waits longer than the suite's per-test timeout by design: its own limit."""

    seconds: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Expectations:
    """One suite's checked-in expectations.

    ``expected_failures`` maps a node id to the unimplemented feature it
    needs; ``unstable`` a node id to why its outcome varies from run to run;
    ``excluded`` names tests the suite does not run, with why; ``slow`` maps
    a node id to the timeout it gets instead of the suite's (it sleeps
    longer than that by design), with why.
    """

    expected_failures: Mapping[str, str]
    excluded: tuple[Exclusion, ...] = ()
    unstable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    slow: Mapping[str, SlowTest] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Counts of one suite's run and the problems that fail it (one line each)."""

    passed: int
    failed: int
    expected_fail: int
    unstable: int
    skipped: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No problem, and at least one test passed (an empty run proves nothing)."""
        return not self.problems and self.passed > 0

    def counts(self) -> dict[str, int]:
        """The counts by name, for the JSON summary."""
        return {"passed": self.passed, "failed": self.failed,
                "expected_fail": self.expected_fail, "unstable": self.unstable,
                "skipped": self.skipped}


def judge(outcomes: Mapping[str, str], expectations: Expectations, *,
          partial: bool = False) -> Verdict:
    """The verdict of ``outcomes`` (node id -> outcome) under ``expectations``.

    ``partial`` is for a run of some of the tests (a selection): a listed
    test that did not run is then not a problem. Raises ``ValueError`` for
    an outcome that is not one of :data:`OUTCOMES`.
    """
    expected = expectations.expected_failures
    counts = dict.fromkeys(("passed", "failed", "expected_fail", "unstable", "skipped"), 0)
    problems: list[str] = []
    for test, outcome in sorted(outcomes.items()):
        if outcome not in OUTCOMES:
            raise ValueError(f"{test}: unknown outcome {outcome!r}")
        if test in expectations.unstable:
            counts["unstable"] += 1
        elif outcome in _FAILED and test in expected:
            counts["expected_fail"] += 1
        elif outcome in _FAILED:
            counts["failed"] += 1
            problems.append(f"{test} {outcome} and is not on the expected-failure list")
        elif outcome == "passed" and test in expected:
            counts["passed"] += 1
            problems.append(f"{test} passed but is listed as needing {expected[test]!r}: "
                            "take it off the expected-failure list")
        else:
            counts[outcome] += 1
    if partial:
        return Verdict(problems=tuple(problems), **counts)
    problems += [f"{test} is on the expected-failure list ({expected[test]!r}) but did not run"
                 for test in sorted(set(expected) - set(outcomes))]
    problems += [f"{test} is on the unstable list but did not run"
                 for test in sorted(set(expectations.unstable) - set(outcomes))]
    return Verdict(problems=tuple(problems), **counts)


def load_expectations(path: Path, suite: str) -> Expectations:
    """The ``[suite]`` table of the TOML file at ``path``.

    Its shape: ``[suite.expected_failures]`` maps node ids to the feature
    they need, ``[suite.unstable]`` node ids to why their outcome varies;
    ``[[suite.excluded]]`` entries have a ``pattern`` and a ``reason``;
    ``[suite.slow]`` maps node ids to ``{seconds = N, reason = "..."}``.
    :class:`ExpectationsError` names what is wrong.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExpectationsError(f"{path}: {exc}") from exc
    table: Any = document.get(suite)
    if not isinstance(table, dict):
        raise ExpectationsError(f"{path}: no [{suite}] table")
    failures, unstable = table.get("expected_failures", {}), table.get("unstable", {})
    for name, entries in (("expected_failures", failures), ("unstable", unstable)):
        if not isinstance(entries, dict) or not all(
                isinstance(reason, str) and reason for reason in entries.values()):
            raise ExpectationsError(f"{path}: [{suite}.{name}] maps each test to the "
                                    "feature it needs or why (a non-empty string)")
    excluded = []
    for entry in table.get("excluded", []):
        if not (isinstance(entry, dict) and isinstance(entry.get("pattern"), str)
                and isinstance(entry.get("reason"), str) and entry["reason"]):
            raise ExpectationsError(f"{path}: each [[{suite}.excluded]] needs a pattern and a "
                                    f"reason, not {entry!r}")
        excluded.append(Exclusion(entry["pattern"], entry["reason"]))
    slow = {}
    for test, entry in table.get("slow", {}).items():
        seconds, reason = (entry.get("seconds"), entry.get("reason")) \
            if isinstance(entry, dict) else (None, None)
        if not (type(seconds) is int and seconds > 0 and isinstance(reason, str) and reason):
            raise ExpectationsError(f"{path}: [{suite}.slow] {test!r} needs seconds (a "
                                    f"positive integer) and a reason, not {entry!r}")
        slow[test] = SlowTest(seconds, reason)
    return Expectations(dict(failures), tuple(excluded), dict(unstable), slow)
