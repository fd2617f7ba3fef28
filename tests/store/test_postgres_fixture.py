"""The testing kit's PostgreSQL fixtures: skip with one line where PostgreSQL is missing, fail
where ``CI`` is set, and the store factory's choices that do not need a server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sharedstream.store import StoreError, open_store, triggerer_guard
from sharedstream.testing.brokers import BrokerNotInstalled
from sharedstream.testing.brokers import postgres as kit
from tests.store.conftest import LATEST


def _run_suite(tmp_path: Path, *, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""\
        from sharedstream.testing.brokers import BrokerNotInstalled, postgres

        def missing():
            raise BrokerNotInstalled("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or"
                                     " under /usr/lib/postgresql; apt-get install -y postgresql")

        postgres.postgres_bin_dir = missing
        pytest_plugins = ["sharedstream.testing.fixtures"]
    """))
    (tmp_path / "test_uses_postgres.py").write_text(textwrap.dedent("""\
        def test_needs_a_database(postgres_database):
            raise AssertionError("never runs")
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {name: value for name, value in os.environ.items()
           if name not in ("CI", "SHAREDSTREAM_TEST_POSTGRES_URL")
           and not name.startswith("PYTEST_")}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def test_without_postgres_the_tests_skip_saying_why(tmp_path: Path) -> None:
    result = _run_suite(tmp_path, ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert line.endswith("; apt-get install -y postgresql")
    assert "1 skipped" in result.stdout


def test_without_postgres_the_tests_fail_where_ci_is_set(tmp_path: Path) -> None:
    result = _run_suite(tmp_path, ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PostgreSQL is required where CI is set: no PostgreSQL server binaries" in result.stdout
    assert "1 error" in result.stdout


def test_the_binaries_are_found_or_said_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        found = kit.postgres_bin_dir()
    except BrokerNotInstalled as exc:
        assert str(exc).endswith("apt-get install -y postgresql")  # noqa: PT017
    else:
        assert (found / "initdb").exists()
        assert (found / "pg_ctl").exists()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(()))
    with pytest.raises(BrokerNotInstalled, match="apt-get install -y postgresql"):
        kit.postgres_bin_dir()


def test_sqlite_needs_an_existing_file_unless_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    with pytest.raises(StoreError, match=r"no database at .*run `sharedstream init` first"):
        open_store(url)
    open_store(url, create=True).close()
    with open_store(url) as store:
        assert store.migrate() == LATEST


def test_only_sqlite_holds_a_one_triggerer_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    with triggerer_guard(url), pytest.raises(StoreError, match="already running"), \
            triggerer_guard(url):
        pytest.fail("a second triggerer must not get the lock")
    with triggerer_guard("postgresql://db/meta"), triggerer_guard("postgresql://db/meta"):
        pass  # several triggerers share a PostgreSQL database


def test_the_kit_runs_a_server_for_a_person_until_ctrl_c(tmp_path: Path) -> None:
    """``python -m sharedstream.testing.brokers.postgres``: the URL it prints takes
    ``sharedstream init --db``; Ctrl-C stops the server (nothing listens) and exits 0."""
    try:
        kit.postgres_bin_dir()
    except BrokerNotInstalled as exc:
        pytest.skip(str(exc))
    from tests.cli import cli_environment, run_sharedstream  # noqa: PLC0415 - one test needs them

    with subprocess.Popen(
            [sys.executable, "-m", "sharedstream.testing.brokers.postgres"], cwd=tmp_path,
            env=cli_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True) as server:
        try:
            assert server.stdout is not None
            first = server.stdout.readline()
            assert first.startswith("PostgreSQL running: postgresql://"), first
            url = first.removeprefix("PostgreSQL running: ").strip()
            init = run_sharedstream("init", "--db", url, cwd=tmp_path)
            assert init.returncode == 0, init.stderr
            assert f"database {url} ready (schema v{LATEST})" in init.stdout
            server.send_signal(signal.SIGINT)
            _, err = server.communicate(timeout=30)
            assert (server.returncode, err) == (0, "stopped PostgreSQL\n")
        finally:
            if server.poll() is None:
                server.kill()
    check = run_sharedstream("db", "check", cwd=tmp_path)
    assert check.returncode == 2  # the server went with it
    assert "cannot connect" in check.stderr
