"""The Airflow benchmark's own parts (``benchmarks/airflow_e2e.py``), no broker, no Airflow.

Its two sides must run the same watcher code: the files it writes for
sharedstream are the Airflow ones under the import rule, and they load here
as K distinct triggers of the watcher class. Its verdict must hold the
target to the letter: a ratio of at least 100 in the rounds' median, and no
duplicate on our side. Its CPU meter must count a child process that is
born and ends during a run (Airflow's triggerer once read negative). Its one
database reader counts what our store wrote on SQLite and on PostgreSQL (the
kit's PostgreSQL); SQLite and PostgreSQL cases stay apart in every result;
a run that did not finish is still written out, as valid JSON.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
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
from sharedstream.runtime.serde import pack_event_payload
from sharedstream.store import PendingEvent, TriggerSpec, open_store
from sharedstream.testing.fixtures import postgres_database, postgres_url

__all__ = ["postgres_database", "postgres_url"]  # fixtures, used by name

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
         finished: bool = True, store: str = "sqlite") -> Any:
    return bench.Run(side, "live", 10, store, round_, 1000, 1000, finished, seconds, 0.1, 1.0,
                     1000 + duplicates, 1000, 1.0, 1.0, 1.0)


def test_the_verdict_is_the_median_of_same_round_ratios_and_needs_zero_duplicates(
        bench: ModuleType) -> None:
    runs = [_run(bench, "airflow", 0, 100.0), _run(bench, "sharedstream", 0, 0.5),
            _run(bench, "airflow", 1, 50.0), _run(bench, "sharedstream", 1, 1.0),
            _run(bench, "airflow", 2, 80.0), _run(bench, "sharedstream", 2, 1.0)]

    ratio = bench.ratios(runs)["live K=10 sqlite"]
    assert ratio["msgs_per_s_ours_over_airflow"] == {"rounds": [200.0, 50.0, 80.0],
                                                     "median": 80.0, "lower_bounds": [False] * 3,
                                                     "at_least": False}
    assert ratio["verdict"] == "NOT MET"

    runs[3] = _run(bench, "sharedstream", 1, 0.25)  # 200x in round 1: median 200
    assert bench.ratios(runs)["live K=10 sqlite"]["verdict"] == "MET"

    runs[1] = _run(bench, "sharedstream", 0, 0.5, duplicates=1)
    assert bench.ratios(runs)["live K=10 sqlite"]["verdict"] == "NOT MET"


def test_an_unfinished_airflow_run_gives_a_lower_bound_and_an_unfinished_one_of_ours_none(
        bench: ModuleType) -> None:
    # Airflow did not store all 1,000 records in 300 s: its rate was below 3.33/s, so
    # ours (1,000 in 0.5 s: 2,000/s) is at least 600x; a finished round stays exact.
    runs = [_run(bench, "airflow", 0, 300.0, finished=False), _run(bench, "sharedstream", 0, 0.5),
            _run(bench, "airflow", 1, 100.0), _run(bench, "sharedstream", 1, 0.5)]

    speed = bench.ratios(runs)["live K=10 sqlite"]["msgs_per_s_ours_over_airflow"]
    assert speed == {"rounds": [600.0, 200.0], "median": 400.0,
                     "lower_bounds": [True, False], "at_least": True}
    assert bench.ratios(runs)["live K=10 sqlite"]["verdict"] == "MET"

    runs[1] = _run(bench, "sharedstream", 0, 900.0, finished=False)
    ratio = bench.ratios(runs)["live K=10 sqlite"]
    assert ratio["msgs_per_s_ours_over_airflow"]["median"] is None
    assert ratio["verdict"] == "NOT MET"


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


def test_sqlite_and_postgresql_cases_are_told_apart(bench: ModuleType) -> None:
    runs = [_run(bench, "airflow", 0, 100.0), _run(bench, "sharedstream", 0, 0.5),
            _run(bench, "airflow", 0, 200.0, store="postgresql"),
            _run(bench, "sharedstream", 0, 4.0, store="postgresql")]

    ratio = bench.ratios(runs)
    assert ratio["live K=10 sqlite"]["msgs_per_s_ours_over_airflow"]["rounds"] == [200.0]
    assert ratio["live K=10 postgresql"]["msgs_per_s_ours_over_airflow"]["rounds"] == [50.0]
    assert sorted((r.side, r.store) for r in bench.medians(runs)) == [
        ("airflow", "postgresql"), ("airflow", "sqlite"),
        ("sharedstream", "postgresql"), ("sharedstream", "sqlite")]


def _strict(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_an_unfinished_run_is_written_out_with_what_it_stored(
        bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args(["--output-dir", str(tmp_path), "--name", "t", "--rounds", "1",
                             "--store", "sqlite,postgresql", "--airflow-log-level", "info"])
    runs = [_run(bench, "airflow", 0, 120.0, finished=False, duplicates=37),
            _run(bench, "sharedstream", 0, 0.5)]

    bench.write_results(args, runs, {"start": [1.0], "end": [1.0]})

    written = json.loads((tmp_path / "t.json").read_text(), parse_constant=_strict)
    assert written["airflow_logging_level"] == "INFO"
    assert written["stores"] == ["sqlite", "postgresql"]
    airflow = next(row for row in written["rows"] if row["side"] == "airflow")
    assert (airflow["finished"], airflow["stored"], airflow["duplicates"], airflow["msgs_per_s"],
            airflow["cpu_ms_per_message"]) == (False, 1037, 37, None, None)
    ratio = written["ratios"]["live K=10 sqlite"]
    # Airflow's rate was below 1,000 records / 120 s: ours (2,000/s) is at least 240x.
    assert ratio["msgs_per_s_ours_over_airflow"] == {"rounds": [240.0], "median": 240.0,
                                                     "lower_bounds": [True], "at_least": True}
    assert ratio["cpu_per_message_airflow_over_ours"] == {"rounds": [], "median": None}
    assert ratio["verdict"] == "MET"
    assert "False,120.0" in (tmp_path / "t.csv").read_text()
    assert (tmp_path / "t.png").stat().st_size > 0


def test_a_store_it_does_not_know_is_refused(
        bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--store", "sqlite,mysql"])

    assert exited.value.code == 2
    assert "unknown ['mysql']" in capsys.readouterr().err


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_one_reader_counts_what_our_store_wrote_on_either_database(
        bench: ModuleType, store: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path / 'meta.db'}" if store == "sqlite"
           else request.getfixturevalue("postgres_database"))
    with open_store(url, create=True) as ours:
        ours.migrate()
        ids = ours.sync_definitions([TriggerSpec("fp", "pkg.Watcher", b"kw")], [], [])
        ours.write_events([PendingEvent(ids["fp"], None, pack_event_payload(
            {"watcher": 1, "id": record})) for record in (7, 8, 7)])
        database = bench.Database(url)
        tally = bench.Tally()

        tally.target = 3  # the run is complete at 3 distinct pairs
        bench.read_new(database, tally, bench.OUR_EVENTS, bench.our_payload)
        assert (tally.stored, tally.distinct, tally.done_written) == (3, 2, None)
        assert tally.first_written is not None
        assert abs(tally.first_written - time.time()) < 60  # the rows' own write times

        ours.write_events([PendingEvent(ids["fp"], None, pack_event_payload(
            {"watcher": 2, "id": 7}))])
        bench.read_new(database, tally, bench.OUR_EVENTS, bench.our_payload)
        assert (tally.stored, tally.distinct) == (4, 3)  # only the new row was read
        done = tally.done_written
        assert done is not None
        assert tally.first_written <= done < time.time() + 1


def test_write_times_read_as_both_databases_write_them(bench: ModuleType) -> None:
    utc = dt.UTC
    moment = dt.datetime(2026, 11, 28, 12, 0, 1, 250000, tzinfo=utc)
    for written in ("2026-11-28 12:00:01.250000",  # Airflow on SQLite: naive UTC text
                    "2026-11-28T12:00:01.250000+00:00",  # ISO with its zone
                    moment, moment.replace(tzinfo=None)):  # PostgreSQL: datetime objects
        assert bench.epoch_of(written) == moment.timestamp(), written
    assert bench.epoch_of("not a time") is None
    assert bench.epoch_of(None) is None


def test_one_side_alone_that_did_not_finish_is_plotted_without_a_warning(
        bench: ModuleType, tmp_path: Path) -> None:
    args = bench.parse_args(["--output-dir", str(tmp_path), "--name", "t", "--sides", "airflow"])

    bench.write_results(args, [_run(bench, "airflow", 0, 30.0, finished=False)],
                        {"start": [1.0], "end": [1.0]})  # warnings are errors here

    assert (tmp_path / "t.png").stat().st_size > 0


def test_the_filter_floor_runs_the_benchmark_filters_and_bounds_every_ratio(
        bench: ModuleType, tmp_path: Path) -> None:
    import asyncio  # noqa: PLC0415 - only this test runs a loop

    floor = asyncio.run(bench.filter_floor(tmp_path / "floor", 12, 200, 0))
    # 12 watchers over 200 records: watchers j and j + 10 keep the same bucket
    assert (floor.k, floor.round, floor.messages) == (12, 0, 200)
    assert floor.seconds > 0
    assert floor.per_s == 200 / floor.seconds

    runs = [_run(bench, "airflow", 0, 100.0), _run(bench, "sharedstream", 0, 0.5),
            _run(bench, "airflow", 1, 50.0), _run(bench, "sharedstream", 1, 1.0)]
    floors = [bench.Floor(10, 0, 1000, 0.25), bench.Floor(10, 1, 1000, 0.4)]
    ratio = bench.ratios(runs, floors)["live K=10 sqlite"]
    # floor 4,000 and 2,500 records/s; Airflow 10 and 20; ours 2,000 and 1,000
    assert ratio["ceiling_floor_over_airflow"] == {"rounds": [400.0, 125.0], "median": 262.5}
    assert ratio["ours_over_floor"] == {"rounds": [0.5, 0.4], "median": 0.45}
    assert bench.ratios(runs)["live K=10 sqlite"]["ceiling_floor_over_airflow"] == {
        "rounds": [], "median": None}

    args = bench.parse_args(["--output-dir", str(tmp_path), "--name", "f", "--rounds", "2"])
    bench.write_results(args, runs, {"start": [1.0], "end": [1.0]}, floors)
    written = json.loads((tmp_path / "f.json").read_text(), parse_constant=_strict)
    assert [(f["k"], f["round"], f["records_per_s"]) for f in written["filter_floor"]] == [
        (10, 0, 4000.0), (10, 1, 2500.0)]
    assert written["ratios"]["live K=10 sqlite"]["ours_over_floor"]["median"] == 0.45


def test_a_filter_floor_of_other_filters_is_refused(
        bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio  # noqa: PLC0415 - only this test runs a loop

    monkeypatch.setattr(bench, "WATCHERS", bench.WATCHERS.replace(
        'record["bucket"] == self.bucket', 'record["bucket"] != self.bucket'))
    with pytest.raises(RuntimeError, match="not the benchmark's filters"):
        asyncio.run(bench.filter_floor(tmp_path / "floor", 10, 100, 0))


def test_our_package_is_byte_compiled_linked_folders_too(bench: ModuleType) -> None:
    import importlib.util  # noqa: PLC0415 - only this test reads the bytecode cache

    import sharedstream  # noqa: PLC0415

    package = Path(sharedstream.__file__).parent
    linked = package / "producers"
    assert linked.is_symlink()  # compileall alone skips it: the helper must not
    sources = [package / "runtime" / "cli.py", linked / "kafka.py",
               package / "triggers" / "kafka.py"]

    sys.modules["_e2e"].compile_checkout()

    for source in sources:
        cached = Path(importlib.util.cache_from_source(str(source)))
        assert cached.is_file(), cached
        # valid for this source: the header holds the source's mtime and size
        header = cached.read_bytes()[:16]
        stat = source.stat()
        assert int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
        assert int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF
