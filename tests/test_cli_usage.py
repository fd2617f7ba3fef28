"""The ``sharedstream`` command's usage errors: what a user sees when a command is wrong.

Through the real CLI (a subprocess, as a user runs it; the ``--help`` walk
calls its ``main`` in this process for speed): every command and action
says what it does; a command or action left out lists the choices (exit
2); a ``status --url`` that is not a URL, a ``dags next-runs`` of a DAG
the store does not know yet, and watchers none of which has its
connection are each one line and exit 2; ``init`` writes nothing until its
database answers, and its refusal to overwrite names ``db upgrade``.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from sharedstream.runtime.cli import main
from sharedstream.testing.brokers import free_port
from sharedstream.testing.fixtures import postgres_database, postgres_url
from tests.cli import run_sharedstream

__all__ = ["postgres_database", "postgres_url"]


def _help(capsys: pytest.CaptureFixture[str], *path: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def _choices(help_text: str) -> list[str]:
    """The commands (or actions) a ``--help`` lists under ``COMMAND`` / ``ACTION``."""
    listed = re.search(r"^  (?:COMMAND|ACTION)\n((?:    .*\n|      .*\n)+)", help_text, re.M)
    return [] if listed is None else re.findall(r"^    (\S+)", listed.group(1), re.M)


def test_every_command_and_action_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    """``X --help`` has a description under its usage, and ``X``'s parent lists it with a help."""
    pending: list[tuple[str, ...]] = [()]
    seen = []
    while pending:
        path = pending.pop()
        text = _help(capsys, *path)
        listed = re.search(r"^  (?:COMMAND|ACTION)\n((?:    .*\n|      .*\n)+)", text, re.M)
        if listed is not None:
            for line in listed.group(1).splitlines():
                if not line.startswith("      "):
                    assert len(line.split(maxsplit=1)) == 2, f"no help: {line!r} in {path}"
        pending += [(*path, choice) for choice in _choices(text)]
        if path:
            seen.append(" ".join(path))
            after_usage = text.split("\n\n", 1)[1]
            assert not after_usage.startswith(("options:", "positional arguments:")), (
                f"`sharedstream {' '.join(path)} --help` has no description:\n{text}")
    assert {"init", "dags next-runs", "deadletters redrive", "broker start", "send",
            "db prune", "status"} <= set(seen)
    assert len(seen) > 30


@pytest.mark.parametrize(("args", "choices", "last"), [
    ((), ["init", "triggerer", "status", "broker"],
     "sharedstream: error: choose a command (`sharedstream COMMAND --help` says more)"),
    (("dags",), ["list", "next-runs", "trigger"],
     "sharedstream dags: error: choose an action (`sharedstream dags ACTION --help` says more)"),
])
def test_a_missing_command_lists_the_commands(
        tmp_path: Path, args: tuple[str, ...], choices: list[str], last: str) -> None:
    result = run_sharedstream(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"usage: sharedstream {' '.join(args)}".replace("  ", " "))
    assert set(choices) <= set(_choices(result.stderr))
    assert lines[-1] == last
    assert "examples:" not in result.stderr  # those are --help's
    assert result.stdout == ""


def test_status_refuses_a_url_that_is_not_one(tmp_path: Path) -> None:
    """Not a quiet fall-back to the store: one line, exit 2."""
    assert run_sharedstream("init", cwd=tmp_path).returncode == 0
    result = run_sharedstream("status", "--url", "notaurl", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        "sharedstream: error: --url 'notaurl' is not an http(s) URL of the endpoint "
        "(e.g. http://127.0.0.1:8794)"]


def test_next_runs_of_a_dag_not_stored_yet_says_to_pass_the_definitions(tmp_path: Path) -> None:
    (tmp_path / "defs.py").write_text(
        "from datetime import UTC, datetime\nfrom sharedstream.definitions import Dag\n"
        'Dag("nightly", schedule="@daily", start_date=datetime(2026, 1, 1, tzinfo=UTC))\n')
    assert run_sharedstream("init", cwd=tmp_path).returncode == 0
    result = run_sharedstream("dags", "next-runs", "nightly", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "sharedstream: error: no DAG 'nightly' in the store (it has the DAGs of a triggerer "
        "that started; to read a definitions file or folder instead, pass --definitions PATH)"]
    told = run_sharedstream("dags", "next-runs", "nightly", "--definitions", "defs.py",
                            cwd=tmp_path)
    assert told.returncode == 0, told.stderr
    assert "not in the store yet" in told.stdout


LOST_CONNECTION = """\
from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

Asset("orders", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    topics=["orders"], group_id="g", conn_id="nowhere"))])
"""


def test_watchers_none_of_which_has_its_connection_are_a_start_up_error(tmp_path: Path) -> None:
    """Exit 2 and one line, like every start-up configuration error (was: exit 1, after
    starting up and finding nothing to run)."""
    pytest.importorskip("aiokafka")
    (tmp_path / "defs.py").write_text(LOST_CONNECTION)
    assert run_sharedstream("init", cwd=tmp_path).returncode == 0
    result = run_sharedstream("triggerer", "--definitions", "defs.py", cwd=tmp_path, timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "sharedstream: error: watcher orders/all (sharedstream.triggers.kafka."
        "KafkaSharedStreamTrigger) cannot run: connection 'nowhere' not found: no environment "
        "variable SHAREDSTREAM_CONN_NOWHERE or AIRFLOW_CONN_NOWHERE, and no "
        f"[connections.nowhere] table in config file {tmp_path / 'sharedstream.toml'}"]


def test_init_writes_nothing_until_the_database_answers(tmp_path: Path) -> None:
    nowhere = f"postgresql://shop:secret@127.0.0.1:{free_port()}/shop"
    for _ in range(2):  # and so the second try is not refused by a file the first one left
        result = run_sharedstream("init", "--db", nowhere, cwd=tmp_path, timeout=30)
        assert result.returncode == 2
        [line] = result.stderr.splitlines()
        assert line.startswith("sharedstream: error: cannot connect to postgresql://shop:***")
        assert line.endswith("; nothing was written: run `sharedstream init` again once the "
                             "database answers")
        assert list(tmp_path.iterdir()) == []


def test_init_on_postgresql_and_again(tmp_path: Path, postgres_database: str) -> None:
    """Once the server answers, ``init`` creates the schema; a second ``init`` refuses and
    says how to set up (or upgrade) the database of the file that is there."""
    result = run_sharedstream("init", "--db", postgres_database, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "wrote sharedstream.toml (with a new kwargs encryption key: keep it secret)")
    assert re.fullmatch(r"database postgresql://.* ready \(schema v\d+\)",
                        result.stdout.splitlines()[1])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sharedstream.toml"]
    check = run_sharedstream("db", "check", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    again = run_sharedstream("init", "--db", postgres_database, cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.splitlines() == [
        "sharedstream: error: refusing to overwrite existing file sharedstream.toml (it may "
        "hold the key your stored trigger kwargs are encrypted with); pass --path to write a "
        "new one, or set up the database it names with `sharedstream --config "
        "sharedstream.toml db upgrade`"]


def test_init_on_sqlite_creates_the_file_beside_the_configuration(tmp_path: Path) -> None:
    result = run_sharedstream("init", "--path", "conf/shop.toml", cwd=tmp_path)
    assert result.returncode == 2  # conf/ does not exist: nothing is created
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "conf").mkdir()
    result = run_sharedstream("init", "--path", "conf/shop.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in (tmp_path / "conf").iterdir()) == [
        "sharedstream.db", "shop.toml"]
    with sqlite3.connect(tmp_path / "conf" / "sharedstream.db") as db:
        assert db.execute("SELECT count(*) FROM schema_version").fetchone()[0] > 0
