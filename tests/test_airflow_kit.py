"""The testing kit's real Apache Airflow 3, as a test that dispatches DAG runs to it meets it.

The tests marked ``airflow`` (deselected by default: ``pytest -m airflow``)
share the session's ``airflow_server`` fixture: the first use installs
Airflow into its own virtualenv (about 30 s, cached), the start takes 10-20
s more. They drop one DAG file whose task writes its run's ``conf`` to a
file, create runs through the REST API and watch them finish, and restart
the API server under a live client.

The unit tests at the end need no Airflow: the PostgreSQL connection URL Airflow gets,
how the ``airflow_server`` fixture chooses its metadata database,
where the virtualenv cache lives,
that a complete one is reused without running pip, that two builders make
one virtualenv, and what a failed install says; a few lines of Python stand
in for pip.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from sharedstream.testing import airflow as airflow_kit
from sharedstream.testing.airflow import AirflowServer, airflow_venv, airflow_venv_path
from sharedstream.testing.airflow_venv import VENV_ENV
from sharedstream.testing.brokers import BrokerDidNotStart, BrokerNotInstalled
from sharedstream.testing.brokers.process import port_answers
from sharedstream.testing.fixtures import AIRFLOW_DB_ENV, airflow_database

DAG_ID = "kit_conf_writer"

DAG_FILE = '''
import json
import pathlib

from airflow.sdk import dag, get_current_context, task

OUT = pathlib.Path({out!r})


@dag(dag_id={dag_id!r}, schedule=None)
def conf_writer():
    @task
    def write_conf():
        conf = get_current_context()["dag_run"].conf
        (OUT / (conf["name"] + ".json")).write_text(json.dumps(conf))

    write_conf()


conf_writer()
'''


@pytest.fixture(scope="module")
def conf_writer(airflow_server: AirflowServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DAG ``kit_conf_writer``, parsed and unpaused; returns the folder its task writes to."""
    out = tmp_path_factory.mktemp("airflow-out")
    (airflow_server.dags_folder / f"{DAG_ID}.py").write_text(
        DAG_FILE.format(out=str(out), dag_id=DAG_ID))
    airflow_server.wait_for_dag(DAG_ID)
    return out


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_a_run_is_created_once_and_its_task_sees_the_first_conf(
        airflow_server: AirflowServer, conf_writer: Path) -> None:
    first = {"name": "x1", "amount": 42}
    status, created = airflow_server.create_run(DAG_ID, "x1", first)
    assert status == 200, created
    assert isinstance(created, dict)
    assert created["dag_run_id"] == "x1"
    assert created["conf"] == first

    status, answer = airflow_server.create_run(DAG_ID, "x1", {"name": "x1", "amount": 7})
    assert status == 409, answer

    [run] = [run for run in airflow_server.wait_for_runs(DAG_ID, 1, timeout=120)
             if run["dag_run_id"] == "x1"]
    assert run["conf"] == first
    assert json.loads((conf_writer / "x1.json").read_text()) == first


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_dag_runs_reads_every_page_oldest_first(
        airflow_server: AirflowServer, conf_writer: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index in range(3):
        status, answer = airflow_server.create_run(DAG_ID, f"page-{index}",
                                                   {"name": f"page-{index}"})
        assert status == 200, answer
    monkeypatch.setattr(airflow_kit, "_PAGE", 2)

    ids = [run["dag_run_id"] for run in airflow_server.dag_runs(DAG_ID)]

    assert [run_id for run_id in ids if run_id.startswith("page-")] == [
        "page-0", "page-1", "page-2"]
    assert len(ids) == len(set(ids))
    airflow_server.wait_for_runs(DAG_ID, len(ids), timeout=120)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def expired(token: str, secret: str) -> str:
    """``token`` with its times an hour ago, signed again with the server's secret (HS512)."""
    header, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims.update(iat=claims["iat"] - 7200, nbf=claims["nbf"] - 7200, exp=claims["iat"] - 3600)
    signed = f"{header}.{_b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret.encode(), signed.encode(), hashlib.sha512).digest()
    return f"{signed}.{_b64(signature)}"


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_an_expired_token_is_replaced(airflow_server: AirflowServer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    secret = airflow_server._env["AIRFLOW__API_AUTH__JWT_SECRET"]  # to forge an expired token
    stale = expired(airflow_server.token(), secret)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        direct.open(urllib.request.Request(  # noqa: S310 - the test's own http server
            f"{airflow_server.url}/api/v2/dags", headers={"Authorization": f"Bearer {stale}"}))
    with refused.value:
        assert refused.value.code == 401  # Airflow says "Token Expired" (403: a bad signature)
    monkeypatch.setattr(airflow_server, "_token", stale)

    status, _ = airflow_server.request("GET", "/api/v2/dags")

    assert status == 200
    assert airflow_server.token() != stale


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_the_connection_uri_names_the_api_and_its_admin(airflow_server: AirflowServer) -> None:
    uri = urlsplit(airflow_server.connection_uri())

    assert (uri.scheme, uri.hostname) == ("http", "127.0.0.1")
    assert f"http://127.0.0.1:{uri.port}" == airflow_server.url
    assert (uri.username, unquote(uri.password or "")) == ("admin", airflow_server.password)


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_pid_names_each_running_component_and_none_for_one_not_started(
        airflow_server: AirflowServer) -> None:
    pids = {component: airflow_server.pid(component)
            for component in ("api-server", "scheduler", "dag-processor")}

    assert len(set(pids.values())) == 3
    for pid in pids.values():
        assert pid is not None
        assert os.getsid(pid) == pid  # the leader of the component's own session

    assert airflow_server.pid("triggerer") is None


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_the_api_answers_again_after_a_restart(airflow_server: AirflowServer,
                                               conf_writer: Path) -> None:
    token = airflow_server.token()

    airflow_server.restart_api_server()

    assert airflow_server.request("GET", "/api/v2/monitor/health")[0] == 200
    status, answer = airflow_server.create_run(DAG_ID, "after-restart", {"name": "after-restart"})
    assert status == 200, answer
    assert airflow_server.token() == token  # the JWT secret outlives the process
    airflow_server.wait_for_runs(DAG_ID, len(airflow_server.dag_runs(DAG_ID)), timeout=120)
    assert json.loads((conf_writer / "after-restart.json").read_text())["name"] == "after-restart"


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_a_component_that_dies_at_start_is_named_and_nothing_is_left_running(
        airflow_server: AirflowServer, tmp_path: Path) -> None:
    broken = AirflowServer(tmp_path, environment={"AIRFLOW__CORE__EXECUTOR": "NoSuchExecutor"})

    with pytest.raises(BrokerDidNotStart) as raised:
        broken.start()

    log = broken.home / "logs-of-processes" / "scheduler.log"
    message = str(raised.value)
    assert message.startswith("Airflow's scheduler exited with 1: ")
    assert "NoSuchExecutor" in message
    assert str(log) in message
    assert log.is_file()  # kept for reading
    assert not port_answers(int(broken.url.rpartition(":")[2]))
    shutil.rmtree(broken.home)


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_a_hung_scheduler_is_started_again(airflow_server: AirflowServer, tmp_path: Path) -> None:
    # Its heartbeat is called stale after 5 s here (30 s by default), and the kit waits 5 s more.
    # It beats every second (5 s by default), so a busy machine's late beat does not read as
    # unhealthy at a threshold of one beat.
    hanging = AirflowServer(tmp_path, components=("scheduler",), hang_timeout=5.0, environment={
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1"})
    with hanging:
        os.killpg(hanging._processes["scheduler"].pid, signal.SIGSTOP)  # alive, and silent

        deadline = time.monotonic() + 90
        while hanging.restarts.get("scheduler", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert hanging.restarts == {"scheduler": 1}
        deadline = time.monotonic() + 120  # a new scheduler starts: as long as the first took
        while time.monotonic() < deadline:
            health = hanging.request("GET", "/api/v2/monitor/health")[1]
            if isinstance(health, dict) and health["scheduler"]["status"] == "healthy":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the scheduler did not become healthy again: {health}")
        assert (hanging.home / "logs-of-processes" / "scheduler.log.1").is_file()


# -- create_run's retries, without Airflow ---------------------------------------------------

DB_ERROR = {"detail": {"reason": "Database error", "statement": "hidden"}}
"""What an SQLite Airflow 3.3 answers when its database stays locked past 5 s (shortened)."""


def scripted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
             answers: list[tuple[int, object]]) -> tuple[AirflowServer, list[str]]:
    """An unstarted :class:`AirflowServer` whose ``request`` gives ``answers`` in turn (no sleeps);
    the list of ``"METHOD path"`` it was asked."""
    server = AirflowServer(tmp_path)
    asked: list[str] = []

    def request(method: str, path: str, body: object = None) -> tuple[int, object]:
        asked.append(f"{method} {path}")
        return answers.pop(0)

    monkeypatch.setattr(server, "request", request)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    return server, asked


def test_create_run_asks_again_through_database_errors(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = {"dag_run_id": "r 1", "conf": {"n": 1}}
    server, asked = scripted(monkeypatch, tmp_path, [(500, DB_ERROR), (500, DB_ERROR), (200, run)])

    assert server.create_run("my dag", "r 1", {"n": 1}) == (200, run)
    assert asked == ["POST /api/v2/dags/my%20dag/dagRuns"] * 3


def test_a_409_after_a_retry_is_the_earlier_try_when_the_conf_is_ours(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ours = {"dag_run_id": "r", "conf": {"n": 1}}
    server, asked = scripted(monkeypatch, tmp_path, [(500, DB_ERROR), (409, "exists"), (200, ours)])
    assert server.create_run("d", "r", {"n": 1}) == (200, ours)
    assert asked[-1] == "GET /api/v2/dags/d/dagRuns/r"

    theirs = {"dag_run_id": "r", "conf": {"n": 2}}
    server, _ = scripted(monkeypatch, tmp_path, [(500, DB_ERROR), (409, "exists"), (200, theirs)])
    assert server.create_run("d", "r", {"n": 1}) == (409, "exists")


def test_a_409_without_a_retry_and_other_errors_come_back_as_they_came(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server, asked = scripted(monkeypatch, tmp_path, [(409, "exists")])
    assert server.create_run("d", "r", {}) == (409, "exists")
    assert asked == ["POST /api/v2/dags/d/dagRuns"]  # not read back: nothing was retried

    server, asked = scripted(monkeypatch, tmp_path, [(500, "Internal Server Error")])
    assert server.create_run("d", "r", {}) == (500, "Internal Server Error")
    assert len(asked) == 1

    server, asked = scripted(monkeypatch, tmp_path, [(500, DB_ERROR)] * 4)
    assert server.create_run("d", "r", {}) == (500, DB_ERROR)  # four tries, then the last answer
    assert len(asked) == 4


def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
         answers: list[tuple[int, object]]) -> tuple[AirflowServer, list[str]]:
    """An unstarted :class:`AirflowServer` whose wire (``_send``) gives ``answers`` in turn, a
    token already fetched (no sleeps); the list of ``"METHOD path"`` sent."""
    server = AirflowServer(tmp_path)
    asked: list[str] = []

    def send(method: str, path: str, body: object, token: str | None,
             timeout: float = 30.0) -> tuple[int, object]:
        asked.append(f"{method} {path}")
        return answers.pop(0)

    monkeypatch.setattr(server, "_send", send)
    monkeypatch.setattr(server, "token", lambda: "a token")
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    return server, asked


def test_a_read_answered_500_is_asked_again_and_a_write_is_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    page = {"asset_events": [], "total_entries": 0}
    server, asked = sent(monkeypatch, tmp_path, [(500, "Internal Server Error"), (503, ""),
                                                 (200, page)])
    assert server.request("GET", "/api/v2/assets/events") == (200, page)
    assert asked == ["GET /api/v2/assets/events"] * 3

    server, asked = sent(monkeypatch, tmp_path, [(500, DB_ERROR)] * 4)
    assert server.request("GET", "/api/v2/x") == (500, DB_ERROR)  # four tries, the last answer
    assert len(asked) == 4

    server, asked = sent(monkeypatch, tmp_path, [(500, DB_ERROR), (404, "no such asset")])
    assert server.request("POST", "/api/v2/assets/events", {}) == (500, DB_ERROR)
    assert server.request("GET", "/api/v2/assets/9") == (404, "no such asset")  # not retried
    assert len(asked) == 2


def test_errors_are_the_logs_error_records_and_exception_lines(tmp_path: Path) -> None:
    server = AirflowServer(tmp_path)
    server.home = tmp_path / "home"
    log = server.home / "logs-of-processes" / "api-server.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join([
        "2026-11-29T15:16:28Z [info     ] request finished status_code=200",
        "2026-11-29T15:16:29Z [error    ] Error with id hii4gCPr, statement: INSERT ...",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked",
        "2026-11-29T15:16:30Z [info     ] request finished status_code=500",
        "    pydantic_core.ValidationError: 1 validation error for AssetEventResponse",
        "2026-11-29T15:16:31Z [critical ] the API server stops",
    ]))

    assert server.errors() == [
        "2026-11-29T15:16:29Z [error    ] Error with id hii4gCPr, statement: INSERT ...",
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked",
        "    pydantic_core.ValidationError: 1 validation error for AssetEventResponse",
        "2026-11-29T15:16:31Z [critical ] the API server stops"]
    assert server.errors(limit=1) == ["2026-11-29T15:16:31Z [critical ] the API server stops"]
    assert server.errors("scheduler") == []  # no such log


# -- the virtualenv cache, without Airflow ----------------------------------------------------

FAKE_PIP = textwrap.dedent("""
    import os, pathlib, sys, time
    with open(sys.argv[1], "a") as runs:
        runs.write(" ".join(sys.argv[2:]) + "\\n")
    time.sleep(0.5)
    (pathlib.Path(os.environ["VIRTUAL_ENV"]) / "bin" / "airflow").write_text("#!/bin/sh\\n")
""")

FAILING_PIP = textwrap.dedent("""
    import sys
    print("Collecting " + sys.argv[1])
    print("ERROR: No matching distribution found for " + sys.argv[1])
    sys.exit(1)
""")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory (``$XDG_CACHE_HOME``), no ``$SHAREDSTREAM_AIRFLOW_VENV``."""
    monkeypatch.delenv(VENV_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "sharedstream"


def test_the_cached_venv_is_named_after_version_extras_and_python(cache: Path) -> None:
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    kafka = "apache-airflow-providers-apache-kafka==2.1.0"

    plain = airflow_venv_path("3.3.2")
    with_kafka = airflow_venv_path("3.3.2", [kafka, "confluent-kafka"])

    assert plain == cache / f"airflow-3.3.2-{python}"
    assert with_kafka.parent == cache
    assert with_kafka.name.startswith("airflow-3.3.2-")
    assert with_kafka.name.endswith(f"-{python}")
    assert with_kafka != plain
    assert airflow_venv_path("3.3.2", ["confluent-kafka", kafka]) == with_kafka
    assert airflow_venv_path("3.3.2", [kafka]) != with_kafka


def test_a_postgresql_url_becomes_airflows_psycopg2_connection() -> None:
    url = "postgresql://postgres@127.0.0.1:5433/airflow_1"

    assert airflow_kit.postgres_metadata_conn(url) == (
        "postgresql+psycopg2://postgres@127.0.0.1:5433/airflow_1")
    assert "psycopg2-binary" in airflow_kit.POSTGRES_EXTRA
    assert "asyncpg" in airflow_kit.POSTGRES_EXTRA  # Airflow 3's async engine
    with pytest.raises(ValueError, match="not a postgresql:// URL: sqlite://"):
        airflow_kit.postgres_metadata_conn("sqlite:///airflow.db")

    extra, environment = airflow_kit.postgres_metadata(url)
    assert extra == airflow_kit.POSTGRES_EXTRA
    assert environment == {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
                           "postgresql+psycopg2://postgres@127.0.0.1:5433/airflow_1"}
    with pytest.raises(ValueError, match="not a postgresql:// URL"):
        airflow_kit.postgres_metadata("mysql://airflow")


@pytest.mark.parametrize(("value", "database"), [
    (None, "sqlite"), ("", "sqlite"), ("sqlite", "sqlite"),
    ("postgresql", "postgresql"), (" PostgreSQL ", "postgresql"),
])
def test_the_fixtures_metadata_database_is_chosen_by_the_environment(
        monkeypatch: pytest.MonkeyPatch, value: str | None, database: str) -> None:
    if value is None:
        monkeypatch.delenv(AIRFLOW_DB_ENV, raising=False)
    else:
        monkeypatch.setenv(AIRFLOW_DB_ENV, value)

    assert airflow_database() == database


def test_an_unknown_metadata_database_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AIRFLOW_DB_ENV, "mysql")

    with pytest.raises(ValueError, match=r"^SHAREDSTREAM_AIRFLOW_DB='mysql': "
                                         r"choose sqlite or postgresql$"):
        airflow_database()


def test_a_named_venv_with_airflow_is_used_as_is(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "my-airflow"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "airflow").write_text("#!/bin/sh\n")
    monkeypatch.setenv(VENV_ENV, str(venv))

    assert airflow_venv("0.0.0.dev0", pip=[sys.executable, "-c", "raise SystemExit(3)"]) == venv


def test_two_builders_make_one_venv_where_its_scripts_run(cache: Path, tmp_path: Path) -> None:
    runs = tmp_path / "pip-runs.txt"
    pip = [sys.executable, "-c", FAKE_PIP, str(runs)]
    results: list[Path] = []

    builders = [threading.Thread(target=lambda: results.append(airflow_venv("9.9.9", pip=pip)))
                for _ in range(2)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(timeout=60)

    venv = cache / f"airflow-9.9.9-py{sys.version_info.major}{sys.version_info.minor}"
    assert results == [venv, venv]
    assert runs.read_text().splitlines() == ["apache-airflow==9.9.9"]
    assert (venv / "bin" / "airflow").is_file()
    assert [path.name for path in cache.iterdir() if path.is_dir()] == [venv.name]
    pip_script = (venv / "bin" / "pip").read_text()
    assert str(venv / "bin" / "python") in pip_script
    assert ".building-" not in pip_script
    ran = subprocess.run([venv / "bin" / "pip", "--version"], capture_output=True, text=True,
                         check=True, timeout=60)
    assert str(venv) in ran.stdout  # the scripts moved with the virtualenv


def test_a_failed_install_says_why_in_one_line_and_leaves_nothing(cache: Path) -> None:
    with pytest.raises(BrokerNotInstalled) as raised:
        airflow_venv("0.0.0.dev0", pip=[sys.executable, "-c", FAILING_PIP])

    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("`python -c ")
    assert " apache-airflow==0.0.0.dev0` failed with exit code 1: " in message
    assert message.rpartition(" (see ")[0].endswith(
        "ERROR: No matching distribution found for apache-airflow==0.0.0.dev0")
    assert [path.name for path in cache.iterdir() if path.is_dir()] == []
