"""The Airflow benchmark's own parts (``benchmarks/airflow_e2e.py``), no broker, no Airflow.

Its two sides must run the same watcher code: the files it writes for
sharedstream are the Airflow ones under the import rule, and they load here
as K distinct triggers of the watcher class. Its verdict must hold the
target to the letter: a ratio of at least 100 in the rounds' median, and no
duplicate on our side. Its CPU meter must count a child process that is
born and ends during a run (Airflow's triggerer once read negative).
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sharedstream.runtime.definitions import load_definitions

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """The benchmark script as a module (it imports its siblings, ``_e2e`` and ``kafka_e2e``)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("airflow_e2e")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_sharedstream_files_are_the_airflow_ones_under_the_import_rule(
        bench: ModuleType, tmp_path: Path) -> None:
    for side in ("airflow", "sharedstream"):
        bench.write_watchers(tmp_path / side, side)
        bench.write_dag(tmp_path / side, side, "orders", 12)

    for name in ("bench_watchers.py", "bench_watched.py"):
        theirs = (tmp_path / "airflow" / name).read_text()
        ours = (tmp_path / "sharedstream" / name).read_text()
        assert "from airflow." in theirs
        assert ours == theirs.replace("from airflow.", "from sharedstream.airflow.")


def test_the_sharedstream_files_load_as_k_distinct_watchers(
        bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # as the triggerer imports beside the file
    bench.write_watchers(tmp_path, "sharedstream")
    definitions = load_definitions(bench.write_dag(tmp_path, "sharedstream", "orders", 12))

    watched = list(definitions.triggers.values())
    assert len(watched) == 12  # watchers j and j + 10 keep one bucket, and stay two triggers
    assert {w.classpath for w in watched} == {"bench_watchers.BucketWatcher"}
    assert sorted((w.kwargs["watcher"], w.kwargs["bucket"]) for w in watched) == [
        (j, j % 10) for j in range(12)]
    assert {tuple(w.kwargs["topics"]) for w in watched} == {("orders",)}
    assert sorted(definitions.dags) == ["bench_watched"]


def _run(bench: ModuleType, side: str, round_: int, seconds: float, *, duplicates: int = 0,
         finished: bool = True) -> Any:
    return bench.Run(side, "live", 10, round_, 1000, 1000, finished, seconds, 0.1, 1.0,
                     1000 + duplicates, 1000, 1.0, 1.0, 1.0)


def test_the_verdict_is_the_median_of_same_round_ratios_and_needs_zero_duplicates(
        bench: ModuleType) -> None:
    runs = [_run(bench, "airflow", 0, 100.0), _run(bench, "sharedstream", 0, 0.5),
            _run(bench, "airflow", 1, 50.0), _run(bench, "sharedstream", 1, 1.0),
            _run(bench, "airflow", 2, 80.0), _run(bench, "sharedstream", 2, 1.0)]

    ratio = bench.ratios(runs)["live K=10"]
    assert ratio["msgs_per_s_ours_over_airflow"] == {"rounds": [200.0, 50.0, 80.0],
                                                     "median": 80.0}
    assert ratio["verdict"] == "NOT MET"

    runs[3] = _run(bench, "sharedstream", 1, 0.25)  # 200x in round 1: median 200
    assert bench.ratios(runs)["live K=10"]["verdict"] == "MET"

    runs[1] = _run(bench, "sharedstream", 0, 0.5, duplicates=1)
    assert bench.ratios(runs)["live K=10"]["verdict"] == "NOT MET"


def test_an_unfinished_run_has_no_rate_and_is_the_slowest_median(bench: ModuleType) -> None:
    unfinished = _run(bench, "airflow", 0, 900.0, finished=False)
    runs = [unfinished, _run(bench, "airflow", 1, 100.0),
            _run(bench, "airflow", 2, 10.0)]

    assert math.isnan(unfinished.per_s)
    assert bench.medians(runs)[0].seconds == 100.0


def test_the_cpu_meter_counts_a_child_that_is_born_and_ends_during_the_run(
        bench: ModuleType) -> None:
    burn = ("import time\nstart = time.process_time()\n"
            "while time.process_time() - start < 0.4:\n    pass\n")
    parent = ("import subprocess, sys, time\n"
              f"subprocess.run([sys.executable, '-c', {burn!r}])\ntime.sleep(1.5)\n")
    process = subprocess.Popen([sys.executable, "-c", parent])
    try:
        meter = bench.CpuMeter(process.pid)
        meter.sample()
        while process.poll() is None:
            meter.sample()
            time.sleep(0.02)
    finally:
        process.kill()
        process.wait()

    assert 0.3 <= meter.seconds() <= 3.0  # the child's 0.4 s (less its last 20 ms), and starts
