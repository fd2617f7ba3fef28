"""End to end through the real CLI, as subprocesses, against real SQLite files.

The upstream is a durable file-backed log (``filelog_defs.py``) that commits
offsets the way a Kafka consumer group does, so restarts, redeliveries and
the persistence gate behave as they would against a broker.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import DEFS, SECRET, Deployment, wait_for

MESSAGES = [
    {"kind": "order", "amount": 50},   # all_orders            -> 1 event
    {"kind": "refund", "amount": 10},  # refunds               -> 1 event
    {"kind": "order", "amount": 150},  # all_orders + big      -> 2 events
    "this is not json",                # rejected by everyone  -> dead-lettered
]
# asset events: orders x3, refunds x1; runs: process_orders x3, either x4, reconcile x1
EXPECTED_RUNS = {"process_orders": 3, "either": 4, "reconcile": 1}
STOPPING = "stopping (send the signal again to exit at once) signal=SIGTERM"


def run_counts(d: Deployment) -> Counter[str]:
    return Counter(run["dag_id"] for run in d.json("runs", "list", "--limit", "100000"))


def test_events_become_asset_events_and_queued_runs(deployment: Deployment) -> None:
    d = deployment
    d.append(*MESSAGES)
    proc = d.start()
    wait_for(lambda: d.committed() == 3, what="all four offsets committed")
    assert d.stop(proc) == 0

    events = d.json("events", "list")
    assert sorted(e["payload"]["id"] for e in events) == [0, 1, 2, 2]
    assert run_counts(d) == EXPECTED_RUNS
    [reconcile] = d.json("runs", "list", "--dag", "reconcile")
    assert set(reconcile["assets"]) == {"orders", "refunds"}  # it needed both
    assert {r["dag_id"] for r in d.json("runs", "list", "--asset", "refunds")} == {
        "either", "reconcile",
    }
    assert Path(f"{d.log}.dlq").read_text() == "this is not json\n"
    triggers = d.json("triggers", "list")
    assert len(triggers) == 3  # the two identical refund watchers are one trigger
    assert sorted(t["watchers"] for t in triggers) == [
        ["orders/all_orders"], ["orders/big_orders"], ["refunds/refunds", "refunds/refunds_again"]]
    assert all(t["state"] == "active" for t in triggers)
    assert "stopped stored=4 duplicates=0 dag_runs=8 " in d.stderr()
    assert "queued DAG run " not in d.stderr()  # one line per run only at debug level

    table = d.cli("runs", "list").stdout
    assert table.splitlines()[0].split()[:3] == ["DAG_ID", "RUN_ID", "STATE"]
    assert "queued" in table


def test_redelivered_messages_create_no_second_run(deployment: Deployment) -> None:
    d = deployment
    d.append(*MESSAGES)
    first = d.start()
    wait_for(lambda: d.committed() == 3)
    assert d.stop(first) == 0
    before = (d.json("events", "list"), run_counts(d))

    Path(f"{d.log}.offsets").unlink()  # the broker forgets the commits: all redelivered
    second = d.start()
    wait_for(lambda: "stopped" in d.stderr() or d.committed() == 3, what="redelivered")
    assert d.stop(second) == 0
    assert (d.json("events", "list"), run_counts(d)) == before
    assert "stopped stored=0 duplicates=4 dag_runs=0 " in d.stderr()


def test_store_write_failure_never_advances_the_broker(deployment: Deployment) -> None:
    d = deployment
    proc = d.start()
    wait_for(lambda: "running=3" in d.stderr(), what="triggers running")
    with sqlite3.connect(d.db) as db:  # a fault injected in the store itself
        db.executescript("""
            CREATE TABLE fault (on_ INTEGER);
            INSERT INTO fault VALUES (1);
            CREATE TRIGGER inject BEFORE INSERT ON trigger_events
            WHEN (SELECT count(*) FROM fault) > 0
            BEGIN SELECT RAISE(ABORT, 'injected write failure'); END;
        """)
    d.append({"kind": "order", "amount": 5})
    wait_for(lambda: "the store keeps failing" in d.stderr(), what="the store reported failing")
    wait_for(lambda: "ack timeout" in d.stderr(), what="the unconfirmed event timing out")
    assert d.committed() == -1  # never advanced while the store refused the event
    assert d.json("events", "list") == []
    with sqlite3.connect(d.db) as db:
        db.execute("DELETE FROM fault")
    wait_for(lambda: d.committed() == 0, what="the redelivered event committed")
    assert [e["payload"]["id"] for e in d.json("events", "list")] == [0]
    assert "the store takes writes again" in d.stderr()
    assert d.stop(proc) == 0
    [failed] = re.findall(r"stopped .* store_retries=(\d+)", d.stderr())
    assert int(failed) >= 3  # the operator sees how many writes the store refused


def test_a_trigger_that_raises_is_recorded_and_restarted(deployment: Deployment) -> None:
    d = deployment
    marker = d.dir / "exploded"
    proc = d.start()
    d.append({"kind": "order", "amount": 1, "explode_once": str(marker)},
             {"kind": "order", "amount": 2})
    wait_for(lambda: d.committed() == 1, what="both offsets committed after the restart")
    assert marker.exists()
    failing = [t for t in d.json("triggers", "list") if t["errors"]]
    assert len(failing) == 1  # the first order watcher to see it explodes, once
    assert "RuntimeError: exploding on message 0" in failing[0]["last_error"]
    assert "Traceback" in failing[0]["last_traceback"]
    ids = Counter(e["payload"]["id"] for e in d.json("events", "list"))
    assert ids == {0: 1, 1: 1}  # redelivered after the restart, stored once
    assert d.stop(proc) == 0


def test_bad_definitions_file_is_one_clear_line(deployment: Deployment) -> None:
    d = deployment
    bad = d.dir / "bad_defs.py"
    bad.write_text(DEFS.read_text() + "\nDag('typo', schedule=Asset('ordrs'))\n")
    result = subprocess.run(
        [sys.executable, "-m", "sharedstream", "--config", str(d.config), "triggerer",
         "--definitions", str(bad)],
        env=d.env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "bad_defs.py" in result.stderr
    assert "Dag 'typo' is scheduled on asset 'ordrs', which no watcher" in result.stderr
    assert "Traceback" not in result.stderr

    broken = d.dir / "broken_defs.py"
    broken.write_text("x = 1\ny = 1 / 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "sharedstream", "--config", str(d.config), "triggerer",
         "--definitions", str(broken)],
        env=d.env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "broken_defs.py: failed to import (line 2): ZeroDivisionError" in result.stderr


def test_trigger_kwargs_are_encrypted_at_rest(deployment: Deployment) -> None:
    d = deployment
    proc = d.start()
    wait_for(lambda: "running=3" in d.stderr())
    assert d.stop(proc) == 0
    stored = b"".join(p.read_bytes() for p in d.dir.glob("sharedstream.db*"))
    assert SECRET.encode() not in stored
    assert b"big_orders" not in stored or SECRET.encode() not in stored
    shown = d.cli("config", "show").stdout
    assert "kwargs_key" in shown
    key = next(line for line in d.config.read_text().splitlines() if "kwargs_key" in line)
    assert key.split("=", 1)[1].strip().strip('"') not in shown


TOTAL = 4000


def interrupt_mid_stream(d: Deployment, sig: int) -> None:
    """Start a triggerer over TOTAL orders and stop it with ``sig`` part-way through."""
    d.append(*[{"kind": "order", "amount": n % 150} for n in range(TOTAL)])
    proc = d.start()
    wait_for(lambda: d.committed() >= 200, what="some progress")
    at_signal = d.committed()
    code = d.stop(proc, sig)
    assert at_signal < TOTAL - 1, "the run finished before it could be interrupted"
    assert code == (0 if sig == signal.SIGTERM else -sig)


def assert_complete_and_unique(d: Deployment) -> None:
    proc = d.start()
    wait_for(lambda: "running=3" in d.stderr(), what="the restarted triggerer")
    wait_for(lambda: d.committed() == TOTAL - 1, timeout=120, what="everything committed")
    assert d.stop(proc) == 0
    events = d.json("events", "list", "--limit", "100000")
    counts = Counter((e["trigger"], e["payload"]["id"]) for e in events)
    assert max(counts.values()) == 1, "an event was stored twice"
    assert {i for (_t, i) in counts} == set(range(TOTAL)), "an event was lost"
    assert run_counts(d)["process_orders"] == len(events)  # one run per event, none twice


def test_sigterm_mid_stream_loses_nothing(deployment: Deployment) -> None:
    interrupt_mid_stream(deployment, signal.SIGTERM)
    assert STOPPING in deployment.stderr()
    assert_complete_and_unique(deployment)


def test_sigkill_then_restart_loses_nothing_and_duplicates_nothing(
    deployment: Deployment,
) -> None:
    interrupt_mid_stream(deployment, signal.SIGKILL)
    assert_complete_and_unique(deployment)


@pytest.mark.parametrize("command", [
    ["--help"], ["init", "--help"], ["triggerer", "--help"], ["triggers", "list", "--help"],
    ["events", "list", "--help"], ["runs", "list", "--help"], ["config", "show", "--help"],
])
def test_every_command_has_help(command: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "sharedstream", *command],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "usage: sharedstream" in result.stdout


def test_bad_configuration_is_one_line_naming_the_option(deployment: Deployment) -> None:
    d = deployment
    d.env["SHAREDSTREAM__TRIGGERER__CAPACITY"] = "lots"
    result = d.cli("triggers", "list", check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "capacity" in result.stderr
    assert "SHAREDSTREAM__TRIGGERER__CAPACITY" in result.stderr


STANDALONE = DEFS.with_name("standalone_defs.py")
DEMO_DEFINITIONS = DEFS.parents[2] / "sharedstream" / "demo" / "definitions.py"


def test_standalone_triggers_fire_finish_and_fail_loudly(deployment: Deployment) -> None:
    d = deployment
    d.env["STANDALONE_AT"] = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    proc = d.start(STANDALONE)
    wait_for(lambda: len(d.json("runs", "list", "--dag", "on_time")) == 1, what="the timed run")
    [event] = d.json("events", "list", "--asset", "once")
    assert datetime.fromisoformat(event["payload"]) == datetime.fromisoformat(
        d.env["STANDALONE_AT"]
    )

    def trigger(kind: str) -> dict[str, Any]:
        return next(t for t in d.json("triggers", "list") if kind in t["classpath"])

    wait_for(lambda: trigger("DateTimeTrigger")["state"] == "finished", what="finished")
    wait_for(lambda: trigger("EndsEmpty")["errors"] >= 2, what="a restart, failing again")
    empty = trigger("EndsEmpty")
    assert empty["state"] == "active"  # never silently stopped
    assert "run() ended without firing an event" in empty["last_error"]
    assert d.stop(proc) == 0
    proc = d.start(STANDALONE)  # a finished trigger is not run again
    wait_for(lambda: "running=1" in d.stderr(), what="only the unfinished trigger running")
    assert d.stop(proc) == 0
    assert len(d.json("runs", "list", "--dag", "on_time")) == 1


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
def test_a_time_delta_watcher_fires_once_at_its_first_deadline_across_restarts(
        deployment: Deployment) -> None:
    d = deployment
    d.env["STANDALONE_AT"] = "2100-01-01T00:00:00+00:00"
    d.env["STANDALONE_DELTA"] = "6"
    began = datetime.now(UTC)
    proc = d.start(STANDALONE)
    wait_for(lambda: "running=3" in d.stderr(), what="start-up")
    assert d.stop(proc) == 0
    restarted = datetime.now(UTC)
    proc = d.start(STANDALONE)  # a new countdown would fire 6 s from now
    wait_for(lambda: len(d.json("runs", "list", "--dag", "after_delay")) == 1, timeout=30,
             what="the delayed run")
    [event] = d.json("events", "list", "--asset", "later")
    deadline = datetime.fromisoformat(event["payload"])
    assert began + timedelta(seconds=6) <= deadline < restarted + timedelta(seconds=6)
    [delayed] = [t for t in d.json("triggers", "list") if t["classpath"].endswith(
        "DateTimeTrigger") and t["state"] == "finished"]
    assert d.stop(proc) == 0
    proc = d.start(STANDALONE)  # fired and finished: not again
    wait_for(lambda: d.stderr().count("running=2") >= 1, what="the restart without it")
    time.sleep(1.0)
    assert d.stop(proc) == 0
    assert len(d.json("runs", "list", "--dag", "after_delay")) == 1
    assert [t["id"] for t in d.json("triggers", "list") if t["classpath"].endswith(
        "DateTimeTrigger") and t["state"] == "finished"] == [delayed["id"]]


def test_a_second_signal_exits_at_once(deployment: Deployment) -> None:
    d = deployment
    d.env["STANDALONE_AT"] = "2100-01-01T00:00:00+00:00"
    d.env["SLOW_CLEANUP"] = "60"  # a graceful stop would take a minute
    d.env["RUN_SECONDS"] = "3600"  # stopped while running (cancelling a cleanup is quick)
    mark = d.dir / "run-began"
    d.env["RUN_MARK"] = str(mark)
    proc = d.start(STANDALONE)
    wait_for(lambda: "running=2" in d.stderr(), what="start-up")
    # Signal once the slow trigger runs: a stop that was quick could end before the second
    # signal, which would then meet the default handler the triggerer gave back.
    wait_for(mark.exists, what="the slow trigger running")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: STOPPING in d.stderr(), what="the graceful stop beginning")
    assert proc.poll() is None  # still cleaning up
    assert d.stop(proc, signal.SIGTERM) == 128 + signal.SIGTERM
    assert "second stop signal: exiting at once signal=SIGTERM" in d.stderr()


def test_a_stop_under_a_backlog_closes_intake_and_exits_promptly(deployment: Deployment) -> None:
    """SIGTERM with 20,000 lines waiting: no new line is taken, nothing taken is lost."""
    d = deployment
    d.append(*({"kind": "order", "amount": 5} for _ in range(20_000)))
    proc = d.start()
    wait_for(lambda: d.committed() >= 200, what="the backlog being worked on")
    signalled = time.monotonic()
    assert d.stop(proc) == 0
    took = time.monotonic() - signalled
    log = d.stderr()
    assert STOPPING in log
    assert "shutdown timed out" not in log
    assert took < 15, f"stopping took {took:.1f}s"  # the default grace period is 30 s
    committed = d.committed()
    assert committed < 19_000, "the stop kept consuming the backlog"
    with sqlite3.connect(d.db) as db:
        stored = {row[0] for row in db.execute(
            "SELECT idem_key FROM trigger_events WHERE trigger_id = "
            "(SELECT min(trigger_id) FROM trigger_events)")}
    ids = {int(key.split("/")[-1].split("#")[0]) for key in stored}
    assert set(range(committed + 1)) <= ids, "a committed line has no stored event"


@pytest.mark.parametrize(("args", "names"), [
    (("triggerer", "--definitions", "defs.py", "--log-level", "verbose"), "--log-level"),
    (("runs", "list", "--limit", "-1"), "--limit"),
    (("events", "list", "--limit", "-5"), "--limit"),
    (("deadletters", "list", "--limit", "ten"), "--limit"),
    (("demo", "--messages", "0"), "--messages"),
])
def test_a_bad_argument_is_one_line_and_status_2(
    deployment: Deployment, args: tuple[str, ...], names: str,
) -> None:
    result = deployment.cli(*args, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert f"argument {names}:" in error


def test_the_help_has_examples_environment_and_exit_status(deployment: Deployment) -> None:
    text = deployment.cli("--help").stdout
    for heading in ("examples:", "environment:", "exit status:"):
        assert f"\n{heading}\n" in text
    assert "SHAREDSTREAM__<SECTION>__<OPTION>" in text
    assert "sharedstream triggerer --definitions defs.py" in text


def test_log_levels_are_listed_in_the_help(deployment: Deployment) -> None:
    help_text = " ".join(deployment.cli("triggerer", "--help").stdout.split())
    assert "logging level: debug, info, warning, error, critical (default: info)" in help_text


def test_a_missing_or_empty_database_is_refused_outside_init(deployment: Deployment) -> None:
    d = deployment
    d.db.unlink()
    for args in (("triggerer", "--definitions", str(DEFS)), ("triggers", "list")):
        result = d.cli(*args, check=False)
        assert result.returncode == 2
        assert result.stderr.strip() == (
            f"sharedstream: error: no database at {d.db}; run `sharedstream init` first "
            "(or check [store] url)")
        assert not d.db.exists()  # not quietly created
    d.db.touch()
    result = d.cli("triggers", "list", check=False)
    assert result.returncode == 2
    assert "is empty; run `sharedstream init`" in result.stderr
    assert d.db.stat().st_size == 0


def test_a_second_triggerer_on_one_sqlite_file_refuses_to_start(deployment: Deployment) -> None:
    d = deployment
    first = d.start()
    wait_for(lambda: "running=3" in d.stderr(), what="the first triggerer running")
    second = d.start()
    assert second.wait(timeout=30) == 2
    refusal = d.stderr(-1).strip().splitlines()[-1]
    assert refusal == (f"sharedstream: error: another triggerer (pid {first.pid}) is already "
                       f"running on {d.db}; an SQLite store serves one triggerer (several "
                       "need PostgreSQL)")
    assert first.poll() is None  # the first one is untouched
    assert d.stop(first) == 0
    third = d.start()  # the lock went with the first process
    wait_for(lambda: "running=3" in d.stderr(), what="a new triggerer running")
    assert d.stop(third) == 0


def test_a_trigger_that_cannot_be_built_is_a_start_up_error(deployment: Deployment) -> None:
    """Its serialize() no longer matches its constructor: one line, status 2, nothing runs."""
    d = deployment
    broken = d.dir / "drifted_defs.py"
    broken.write_text(DEFS.read_text() + '''

class Drifted(FileLogTrigger):
    def serialize(self):
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "colour": "red"}  # the constructor takes no colour


Asset("drifted", watchers=[AssetWatcher("red_orders", trigger=Drifted(LOG, ["order"]))])
''')
    result = d.cli("triggerer", "--definitions", str(broken), check=False)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("sharedstream: error: watcher drifted/red_orders (")
    assert "unexpected keyword argument 'colour'" in line
    assert "Traceback" not in result.stderr


def test_a_missing_broker_extra_is_a_start_up_error(deployment: Deployment) -> None:
    """As if `pip install sharedstream` without the kafka extra: say the fix, do not retry."""
    d = deployment
    blocked = d.dir / "no_extras"
    (blocked / "aiokafka").mkdir(parents=True)
    (blocked / "aiokafka" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'aiokafka'\")\n")
    d.env["PYTHONPATH"] = f"{blocked}{os.pathsep}{d.env['PYTHONPATH']}"
    d.env["SHAREDSTREAM_DEMO_BOOTSTRAP"] = "127.0.0.1:1"  # never reached
    result = d.cli("triggerer", "--definitions", str(DEMO_DEFINITIONS), check=False)
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert "pip install 'sharedstream[kafka]'" in line
    assert line.startswith("sharedstream: error: watcher ")
    assert "Traceback" not in result.stderr


def test_a_triggerer_with_nothing_left_to_run_exits(deployment: Deployment) -> None:
    d = deployment
    d.env["STANDALONE_AT"] = (datetime.now(UTC) + timedelta(seconds=0.5)).isoformat()
    only_once = d.dir / "once_defs.py"
    only_once.write_text(
        "import os\nfrom datetime import datetime\n"
        "from sharedstream.definitions import Asset, AssetWatcher\n"
        "from sharedstream.triggers.temporal import DateTimeTrigger\n"
        "AT = datetime.fromisoformat(os.environ['STANDALONE_AT'])\n"
        "Asset('once', watchers=[AssetWatcher('at', trigger=DateTimeTrigger(AT))])\n")
    proc = d.start(only_once)
    assert proc.wait(timeout=30) == 0  # its one trigger fired and finished: done
    assert "every trigger finished; nothing left to run" in d.stderr()


def test_config_goes_before_or_after_the_command(deployment: Deployment) -> None:
    d = deployment
    after = subprocess.run(
        [sys.executable, "-m", "sharedstream", "triggers", "list", "--config", str(d.config)],
        cwd=d.dir.parent, env=d.env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == d.cli("triggers", "list").stdout.strip()


def test_init_says_what_to_do_instead(deployment: Deployment) -> None:
    d = deployment
    again = d.cli("init", "--path", str(d.config), check=False)
    assert again.returncode == 2
    assert "refusing to overwrite existing file" in again.stderr
    assert "pass --path to write a new one" in again.stderr
    bad = d.cli("init", "--path", str(d.dir / "other.toml"), "--db", "mysql://db",
                check=False)
    assert bad.returncode == 2
    assert "(from sharedstream init --db)" in bad.stderr
    assert "write_default_config" not in bad.stderr
