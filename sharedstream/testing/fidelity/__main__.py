"""``python -m sharedstream.testing.fidelity pubsub|servicebus|all``: run the fidelity suite.

Prints, per suite, the counts (passed, failed, expected-fail, skipped,
excluded) and then one line per problem (a test off the list that failed,
a listed one that passed or did not run); writes the JSON summary; exits 0
when every suite's verdict is clean, 1 when not, 2 for a usage or set-up
error (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from sharedstream.testing.fidelity.sources import SourcesError, cache_dir
from sharedstream.testing.fidelity.suites import SUITES, Shard, run_shards
from sharedstream.testing.fidelity.verdict import (
    Expectations,
    ExpectationsError,
    judge,
    load_expectations,
)

EXPECTATIONS = Path(__file__).with_name("expected_failures.toml")


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sharedstream.testing.fidelity",
        description="Run the SDKs' own tests against the kit's Pub/Sub and Service Bus servers "
                    "and compare the outcome with the expected-failure list.")
    parser.add_argument("suite", choices=[*SUITES, "all"])
    parser.add_argument("--expectations", type=Path, default=EXPECTATIONS,
                        help="the expected-failure list (default: the checked-in one)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the summary (default: CACHE/summary.json)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where the SDK sources and test helpers are kept (default: "
                             "$SHAREDSTREAM_FIDELITY_CACHE or ~/.cache/sharedstream/fidelity)")
    parser.add_argument("--shards", type=int, default=4,
                        help="pytest processes for the Service Bus tests (default 4; 1 without "
                             "root and unshare)")
    parser.add_argument("-k", dest="select", metavar="EXPRESSION", default=None,
                        help="run only the tests pytest's -k EXPRESSION selects (a listed test "
                             "that does not run is then not a problem)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds before the test processes are killed (default 900)")
    args = parser.parse_args(argv)
    if args.shards < 1 or args.timeout <= 0:
        parser.error("--shards and --timeout must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen suites; the exit status (0 clean, 1 problems, 2 set-up error)."""
    args = _arguments(argv)
    cache = args.cache or cache_dir()
    names = list(SUITES) if args.suite == "all" else [args.suite]
    started = time.monotonic()
    try:
        expectations = {name: load_expectations(args.expectations, name) for name in names}
        for name in names:
            SUITES[name].sdist.check_installed()
    except (ExpectationsError, SourcesError) as exc:
        print(f"fidelity: {exc}", file=sys.stderr)
        return 2
    cache.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="run-", dir=cache))
    with ExitStack() as stack:
        shards: list[Shard] = []
        try:
            for name in names:
                suite = SUITES[name]
                expected = expectations[name]
                made, around = suite.shards(
                    workdir / name, cache, expected.excluded,
                    min(args.shards, suite.max_shards()), select=args.select,
                    timeouts={test: slow.seconds for test, slow in expected.slow.items()})
                stack.enter_context(around)
                shards += made
        except (SourcesError, OSError) as exc:
            print(f"fidelity: {exc}", file=sys.stderr)
            return 2
        print(f"fidelity: {len(shards)} pytest processes, logs in {workdir}", flush=True)
        outcomes = run_shards(shards, args.timeout, lambda shard, code, seconds: print(
            f"  {shard.suite} shard {shard.index}: pytest exit {code} after {seconds:.0f} s",
            flush=True))
    return _report(names, outcomes, expectations, args.json or cache / "summary.json",
                   time.monotonic() - started, partial=args.select is not None)


def _report(names: Sequence[str], outcomes: dict[str, dict[str, str]],
            expectations: dict[str, Expectations], summary_path: Path, seconds: float,
            *, partial: bool = False) -> int:
    summary: dict[str, object] = {"seconds": round(seconds, 1)}
    clean = True
    for name in names:
        verdict = judge(outcomes.get(name, {}), expectations[name], partial=partial)
        sdist = SUITES[name].sdist
        counts = verdict.counts()
        print(f"{name} ({sdist.name} {sdist.version}): {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['expected_fail']} expected-fail, "
              f"{counts['unstable']} unstable, "
              f"{counts['skipped']} skipped; excluded by pattern: "
              f"{len(expectations[name].excluded)} rules")
        for problem in verdict.problems:
            print(f"  FIDELITY: {problem}")
        if not verdict.ok and not verdict.problems:
            print(f"  FIDELITY: {name}: no test passed (did the run start at all? see the logs)")
        clean = clean and verdict.ok
        summary[name] = {"sdist": f"{sdist.name}=={sdist.version}", **counts,
                         "problems": list(verdict.problems), "outcomes": outcomes.get(name, {})}
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    print(f"fidelity: {'clean' if clean else 'FAILED'} in {seconds:.0f} s; summary: "
          f"{summary_path}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
