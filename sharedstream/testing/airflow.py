"""A real Apache Airflow 3 for tests and benchmarks: its own virtualenv, its own home, its REST API.

:func:`airflow_venv` (from :mod:`sharedstream.testing.airflow_venv`)
installs ``apache-airflow==<version>`` from the package index into a
virtualenv of its own, cached between runs. :func:`airflow_server` (or
:class:`AirflowServer` as a context manager) runs that Airflow on a DAGs
folder you give: a SQLite
metadata database in a temporary ``AIRFLOW_HOME``, ``airflow db migrate``,
then one process each for the API server, the scheduler and the DAG
processor (and the triggerer when asked), all configured by environment.
The server object speaks to the REST API with the standard library only.
For a PostgreSQL metadata database instead, give the server the ``extra``
and ``environment`` that :func:`postgres_metadata` returns for the
database's URL (:data:`POSTGRES_EXTRA`, and
``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` set to :func:`postgres_metadata_conn`
of it).

Guarantees:

1. Airflow's pins never meet ours: nothing here imports Airflow, and its
   processes run from its own virtualenv, with no inherited ``AIRFLOW*``,
   ``PYTHONPATH``, ``PYTHONHOME`` or ``VIRTUAL_ENV`` variable.
2. The virtualenv is complete or absent, built by one process at a time;
   an install that fails raises :class:`~.brokers.process.BrokerNotInstalled`
   (a test should skip) naming the command and pip's last line.
3. Every component listens on ``127.0.0.1`` only, on ports chosen free just
   before the start, and runs in its own session (process group), its output
   in ``<home>/logs-of-processes/<component>.log``.
4. :meth:`AirflowServer.start` returns only once ``/api/v2/monitor/health``
   reports the metadatabase and every started component healthy; if that
   does not happen in time, a component exits, or the wait is interrupted,
   whatever was started is stopped before the exception
   (:class:`BrokerDidNotStart`, naming each log and its last line) leaves,
   and the home directory is kept for those logs.
5. :meth:`AirflowServer.stop` is idempotent and bounded: SIGTERM to every
   process group, one shared wait, then SIGKILL; the home directory is
   removed unless ``keep=True``.
6. Once started, a component that exits by itself is started again within
   a second, as a process supervisor would (an SQLite Airflow's scheduler
   exits on a long ``database is locked``); :attr:`AirflowServer.restarts`
   counts it. The SQLite database is in WAL mode, which makes that rare.
7. Once started, a scheduler the health endpoint reports unhealthy (no
   heartbeat) for ``hang_timeout`` s while its process runs is stopped and
   started again, as a liveness probe would: a scheduler that hung after an
   ``httpx.ReadTimeout`` from its own API server on a loaded machine left
   every later run ``queued``. Counted in :attr:`AirflowServer.restarts` too.

Per server, the API's ``admin`` gets a generated password, and the fernet
key and API and JWT secrets are generated once and shared by the components
(tasks reach the execution API only if they agree). A new DAG file is parsed
within about a second: the DAG processor lists the folder every second.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from sharedstream.testing.airflow_venv import (
    DEFAULT_AIRFLOW_VERSION,
    airflow_venv,
    airflow_venv_path,
    last_line,
    run_logged,
)
from sharedstream.testing.brokers.process import (
    BrokerDidNotStart,
    LocalBrokerError,
    free_port,
    start_process,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_AIRFLOW_VERSION",
    "DEFAULT_COMPONENTS",
    "POSTGRES_EXTRA",
    "AirflowApiError",
    "AirflowServer",
    "airflow_server",
    "airflow_venv",
    "airflow_venv_path",
    "postgres_metadata",
    "postgres_metadata_conn",
]

COMPONENTS = ("scheduler", "dag-processor", "triggerer")
"""What may run besides the API server (which always runs), by ``airflow`` subcommand name."""

DEFAULT_COMPONENTS = ("scheduler", "dag-processor")
"""What runs besides the API server unless told otherwise."""

POSTGRES_EXTRA = ("psycopg2-binary", "asyncpg")
"""What an Airflow on a PostgreSQL metadata DB needs in its virtualenv (``extra``): psycopg2
for its sync engine (the driver Airflow's "Set up a Database Backend" recommends), asyncpg for
its async one (Airflow 3 derives ``postgresql+asyncpg://`` from the sync URL and does not start
without it)."""

_WATCHED_FOR_HANGS = ("scheduler",)
"""Components a missed heartbeat restarts (guarantee 7): a busy triggerer misses its
heartbeat for 30 s under load without being hung (seen in the Airflow benchmark)."""
_REQUEST_TIMEOUT = 30.0
_ERROR_LINE = re.compile(r"\[(error|critical)\s*\]|^\s*[A-Za-z_][\w.]*(Error|Exception)\b.*:")
_READ_TRIES = 4
"""Tries of a ``GET`` answered 5xx (:meth:`AirflowServer.request`): CI once saw a lone
``500 Internal Server Error`` to a read of asset events, the database under load."""
_STOP_TIMEOUT = 10.0
_PAGE = 100  # the API's default [api] maximum_page_limit
_SIMPLE_AUTH = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"


def postgres_metadata_conn(url: str) -> str:
    """``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` for the PostgreSQL database ``url`` names.

    ``url`` is a libpq-style ``postgresql://`` URL (as
    :func:`~sharedstream.testing.brokers.postgres.fresh_database` yields);
    the result names psycopg2's driver (give the server :data:`POSTGRES_EXTRA`).
    Raises ``ValueError`` for any other scheme.
    """
    if not url.startswith("postgresql://"):
        raise ValueError(f"not a postgresql:// URL: {url.split(':', 1)[0]}://...")
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def postgres_metadata(url: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """``(extra, environment)`` of an Airflow whose metadata DB is the PostgreSQL database ``url``.

    Give both to :class:`AirflowServer` (add your own to them as needed):
    :data:`POSTGRES_EXTRA` for its virtualenv, and
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` (:func:`postgres_metadata_conn`
    of ``url``). Raises ``ValueError`` for a URL that is not ``postgresql://``.
    """
    return POSTGRES_EXTRA, {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres_metadata_conn(url)}


class AirflowApiError(LocalBrokerError):
    """Airflow's API answered a kit call with something unusable (``status``, ``body``)."""

    def __init__(self, what: str, status: int, body: Any) -> None:
        super().__init__(f"{what}: HTTP {status}: {str(body)[:300]}")
        self.status = status
        self.body = body


class AirflowServer:
    """One Airflow 3 running on ``dags_folder``: start it, call its API, stop it.

    Construct, then :meth:`start` (or use it as a context manager, which
    starts and stops). ``components`` run besides the API server (any of
    :data:`COMPONENTS`); ``extra`` are more requirements for the virtualenv
    (a provider); ``environment`` goes into the components' environment
    last (``AIRFLOW_CONN_*``, settings of your own, what a DAG file reads);
    ``keep`` leaves :attr:`home` in place after :meth:`stop`; ``hang_timeout``
    is how long a running component may be reported unhealthy before it is
    started again (guarantee 7 of the module). :meth:`request`
    and :meth:`token` may be called from several threads; starting,
    restarting and stopping are for one thread.

    Attributes: ``url`` (``http://127.0.0.1:<port>``, set by :meth:`start`),
    ``username`` and ``password`` (the API's admin), ``home``
    (``AIRFLOW_HOME``: the SQLite DB, task logs under ``logs``, the
    components' under ``logs-of-processes``), ``dags_folder``, ``version``.
    """

    username = "admin"

    def __init__(self, dags_folder: Path, *, version: str = DEFAULT_AIRFLOW_VERSION,
                 components: Collection[str] = DEFAULT_COMPONENTS,
                 extra: Sequence[str] = (), environment: Mapping[str, str] | None = None,
                 keep: bool = False, start_timeout: float = 120.0,
                 hang_timeout: float = 30.0) -> None:
        unknown = set(components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown Airflow components {sorted(unknown)}; known: {COMPONENTS}")
        self.dags_folder = Path(dags_folder).resolve()
        self.version = version
        self.password = secrets.token_urlsafe(18)
        self.home = Path()
        self.url = ""
        self._components = [name for name in COMPONENTS if name in components]
        self._extra, self._environment = tuple(extra), dict(environment or {})
        self._keep, self._start_timeout, self._hang_timeout = keep, start_timeout, hang_timeout
        self._unhealthy_since: dict[str, float] = {}
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._env: dict[str, str] = {}
        self._airflow = ""
        self._token: str | None = None
        self._token_lock = threading.Lock()
        self._lifecycle = threading.Lock()  # starting and stopping components
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.restarts: dict[str, int] = {}
        """Components started again after they exited by themselves, by name (see
        :meth:`_keep_alive`)."""
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy

    # -- life cycle --

    def _sqlite_wal(self) -> None:
        """Put an SQLite metadata database in WAL mode (it stays so): readers stop blocking writers.

        Airflow 3 sets WAL itself on each connection it opens; this makes the
        file WAL from the migration on, before any component connects.

        A burst of 100 run creations while runs executed got seven ``500 database is
        locked`` and killed the scheduler in rollback mode; none in WAL (300 still can).
        """
        url = self._env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        if url.startswith("sqlite:///"):
            with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
                db.execute("PRAGMA journal_mode=WAL").fetchall()

    def start(self) -> AirflowServer:
        """Install (first use only), migrate, start every component; return once all are healthy.

        Call once. Raises :class:`BrokerNotInstalled` (the install failed: a
        test should skip) or :class:`BrokerDidNotStart` (``airflow db
        migrate`` failed, a component exited, or health was not reported
        within ``start_timeout`` s; the message names the logs and their last
        lines). Every component is stopped before any exception leaves; the
        home directory is then kept, for those logs.
        """
        if self.url:
            raise RuntimeError("AirflowServer.start() was already called")
        venv = airflow_venv(self.version, extra=self._extra)
        self._airflow = str(venv / "bin" / "airflow")
        self.home = Path(tempfile.mkdtemp(prefix="sharedstream-airflow-"))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        try:
            self._env = self._environment_for(venv, port)
            run_logged([self._airflow, "db", "migrate"], self._log("db-migrate"), self._env,
                        timeout=self._start_timeout, failure=BrokerDidNotStart)
            self._sqlite_wal()
            deadline = time.monotonic() + self._start_timeout
            for name in ["api-server", *self._components]:
                self._start_component(name)
            self._wait_healthy(deadline)
        except BaseException:  # an error, a timeout or Ctrl-C: leave no component behind
            _stop_groups(list(self._processes.values()))
            self._processes.clear()
            raise  # the home directory stays: the message names logs in it
        self._watchdog = threading.Thread(target=self._keep_alive, daemon=True,
                                          name="airflow-kit-watchdog")
        self._watchdog.start()
        return self

    def _keep_alive(self) -> None:
        """Start again, as a process supervisor would, a component that exited or hung.

        An SQLite Airflow's scheduler exits on a long ``database is locked``
        (seen after a burst of run creations, and after an API server restart
        in about one session in ten), and once hung with no heartbeat after an
        ``httpx.ReadTimeout`` from its API server on a loaded machine. Each
        restart is counted in :attr:`restarts` and said on stderr; the old
        process's log is kept as ``<component>.log.<n>``.
        """
        while not self._stopping.wait(1.0):
            hung = self._hung_components()
            with self._lifecycle:
                if self._stopping.is_set():
                    return
                for name, process in list(self._processes.items()):
                    if process.poll() is None and name not in hung:
                        continue
                    if process.poll() is None:
                        why = f"reported unhealthy for {self._hang_timeout:.0f} s"
                        _stop_groups([process])
                    else:
                        why = f"exited with {process.returncode}"
                    self._unhealthy_since.pop(name, None)
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    log = self._log(name)
                    with contextlib.suppress(OSError):
                        log.rename(log.with_name(f"{log.name}.{self.restarts[name]}"))
                    print(f"airflow kit: {name} {why}; starting it again "
                          f"(restart {self.restarts[name]})", file=sys.stderr)
                    self._start_component(name)

    def _hung_components(self) -> set[str]:
        """Components the health endpoint has called unhealthy for ``hang_timeout`` s, by name.

        A component not reported (the API server is down, or restarting) keeps
        its clock: only an answer saying "healthy" resets it.
        """
        health = self._health()
        if not isinstance(health, dict):
            return set()
        now, hung = time.monotonic(), set()
        for name in set(self._components) & set(_WATCHED_FOR_HANGS):
            report = health.get(name.replace("-", "_"))
            if isinstance(report, dict) and report.get("status") == "healthy":
                self._unhealthy_since.pop(name, None)
            elif now - self._unhealthy_since.setdefault(name, now) >= self._hang_timeout:
                hung.add(name)
        return hung

    def restart_api_server(self) -> None:
        """Stop the API server's process group, start it again on the same port, wait until healthy.

        For tests of a dispatcher that must survive the API going away; call
        after :meth:`start`. Takes about 8 s; the token stays valid (the JWT
        secret is fixed). Raises :class:`BrokerDidNotStart` as :meth:`start`
        does (the other components keep running).
        """
        with self._lifecycle:
            _stop_groups([self._processes.pop("api-server")])
            self._start_component("api-server")
        self._wait_healthy(time.monotonic() + self._start_timeout)

    def stop(self) -> None:
        """Stop every component (SIGTERM to its group, a shared bounded wait, SIGKILL); idempotent.

        Also removes the home directory (DB, logs) unless ``keep=True``.
        Safe to call after a failed or partial :meth:`start`.
        """
        self._stopping.set()
        with self._lifecycle:
            processes, self._processes = list(self._processes.values()), {}
        _stop_groups(processes)
        if not self._keep and self.home != Path() and self.home.exists():
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> AirflowServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _environment_for(self, venv: Path, port: int) -> dict[str, str]:
        passwords = self.home / "simple_auth_manager_passwords.json"
        passwords.write_text(json.dumps({self.username: self.password}))
        inherited = {key: value for key, value in os.environ.items()
                     if not key.startswith("AIRFLOW")
                     and key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        return {
            **inherited,
            "PATH": os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", os.defpath)]),
            "VIRTUAL_ENV": str(venv),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": _SIMPLE_AUTH,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.username}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # New files are found at the next listing of the folder; list it every second.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(self.home / "bundles"),
            **self._environment,
        }

    def _log(self, name: str) -> Path:
        return self.home / "logs-of-processes" / f"{name}.log"

    def _start_component(self, name: str) -> None:
        # start_process for its guarantees (own session, log file); readiness is the health wait.
        self._processes[name] = start_process(
            f"Airflow's {name}", [self._airflow, name], log_path=self._log(name),
            ready=lambda: True, env=self._env)

    def _wait_healthy(self, deadline: float) -> None:
        wanted = ["metadatabase", *(name.replace("-", "_") for name in self._components)]
        health: Any = None
        while True:
            for name, process in self._processes.items():
                if process.poll() is not None:
                    raise BrokerDidNotStart(f"Airflow's {name} exited with {process.returncode}: "
                                            f"{last_line(self._log(name))} (see {self._log(name)})")
            health = self._health()
            if isinstance(health, dict) and all(
                    isinstance(health.get(key), dict) and health[key].get("status") == "healthy"
                    for key in wanted):
                return
            if time.monotonic() > deadline:
                logs = "; ".join(f"{self._log(name)}: {last_line(self._log(name))}"
                                 for name in self._processes)
                raise BrokerDidNotStart(f"Airflow was not healthy within {self._start_timeout:.0f}"
                                        f" s (last health: {json.dumps(health)}); logs: {logs}")
            time.sleep(0.25)

    def _health(self) -> Any:
        try:
            status, body = self._send("GET", "/api/v2/monitor/health", None, None, timeout=2.0)
        except OSError:  # not listening yet, or restarting: the caller polls again
            return None
        return body if status == 200 else None

    # -- the API --

    def token(self) -> str:
        """A JWT for ``admin`` (``POST /auth/token``), fetched once and cached.

        A :meth:`request` answered 401 drops the cached token and fetches a
        new one. Raises :class:`AirflowApiError` when the API refuses the
        credentials, ``OSError`` when it does not answer.
        """
        with self._token_lock:
            if self._token is None:
                body = {"username": self.username, "password": self.password}
                status, answer = self._send("POST", "/auth/token", body, None)
                if status not in (200, 201) or not isinstance(answer, dict) or not isinstance(
                        answer.get("access_token"), str):
                    raise AirflowApiError("POST /auth/token", status, answer)
                self._token = answer["access_token"]
            return self._token

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the API as ``admin``: ``path`` is from the root (``/api/v2/...``), ``body`` JSON.

        Returns the HTTP status and the parsed JSON answer (the text when it
        is not JSON, ``None`` when empty); never raises for a status code.
        On 401 it fetches a new token and sends once more. A ``GET`` answered
        5xx is asked again, 1 s apart, up to :data:`_READ_TRIES` tries in
        all (a read changes nothing, and an SQLite Airflow on a loaded
        machine answers 500 now and then); any other method's 5xx comes back
        as it came (see :meth:`create_run`). Raises ``OSError``
        (``urllib.error.URLError`` included) when the API does not answer
        within 30 s, and what :meth:`token` raises.
        """
        tries = _READ_TRIES if method == "GET" else 1
        for attempt in range(tries):
            status, answer = self._signed_in(method, path, body)
            if status < 500 or attempt == tries - 1:
                break
            time.sleep(1)
        return status, answer

    def _signed_in(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        token = self.token()
        status, answer = self._send(method, path, body, token)
        if status == 401:
            with self._token_lock:
                if self._token == token:
                    self._token = None
            status, answer = self._send(method, path, body, self.token())
        return status, answer

    def _send(self, method: str, path: str, body: Any, token: str | None,
              timeout: float = _REQUEST_TIMEOUT) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, data, headers, method=method)  # noqa: S310 - our own http URL
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return response.status, _parsed(response.read())
        except urllib.error.HTTPError as error:
            with error:
                return error.code, _parsed(error.read())
        except http.client.HTTPException as exc:  # a torn answer (a restart): as a dropped line
            raise ConnectionError(f"{method} {path}: {exc!r}") from exc

    def pid(self, component: str) -> int | None:
        """The process id of a running component (``"triggerer"``, ...), or ``None``.

        The leader of the component's process group (its children, such as
        the triggerer's trigger runner, are in that group). A component
        started again after it exited or hung has a new id: ask again.
        """
        with self._lifecycle:
            process = self._processes.get(component)
            return process.pid if process is not None and process.poll() is None else None

    def errors(self, component: str = "api-server", limit: int = 20) -> list[str]:
        """The last ``limit`` error lines of ``component``'s log, oldest first.

        Its ``[error]`` and ``[critical]`` records and the last line of each
        traceback (``...Error: why``), each cut at 300 characters; empty when
        there are none or no log. For a failure's report: a bare ``500
        Internal Server Error`` says why only here.
        """
        try:
            text = self._log(component).read_text(errors="replace")
        except OSError:
            return []
        found = [line[:300] for line in text.splitlines() if _ERROR_LINE.search(line)]
        return found[-limit:]

    def connection_uri(self) -> str:
        """The API as an ``AIRFLOW_CONN_*``-style URI: ``http://admin:<password>@127.0.0.1:<port>``."""
        return self.url.replace("://", f"://{self.username}:{quote(self.password, safe='')}@", 1)

    def wait_for_dag(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until ``GET /api/v2/dags/{dag_id}`` answers 200, not paused; return that DAG.

        Call after writing its file into :attr:`dags_folder`. Raises
        ``TimeoutError`` after ``timeout`` s, naming the last answer and
        the DAG processor's import errors (a file that does not parse).
        """
        deadline = time.monotonic() + timeout
        while True:
            status, dag = self.request("GET", _dag_path(dag_id))
            if status == 200 and isinstance(dag, dict) and dag.get("is_paused") is False:
                return dag
            if time.monotonic() > deadline:
                _, errors = self.request("GET", "/api/v2/importErrors")
                raise TimeoutError(f"DAG {dag_id!r} not ready within {timeout:.0f} s (last answer:"
                                   f" HTTP {status} {str(dag)[:200]}; import errors: "
                                   f"{_import_errors(errors)}; see {self._log('dag-processor')})")
            time.sleep(0.25)

    def create_run(self, dag_id: str, run_id: str, conf: Mapping[str, Any],
                   attempts: int = 4) -> tuple[int, Any]:
        """``POST /api/v2/dags/{dag_id}/dagRuns`` (no logical date); the status and the answer.

        An SQLite Airflow answers ``500 Database error`` now and then on a
        loaded machine (its database locked past its 5 s wait): that answer
        is asked again, 2 s later, up to ``attempts`` tries in all. A
        ``409`` after such a retry is read back: when the run there has
        ``conf``, an earlier try committed it and the answer is that run
        with ``200``; otherwise the ``409`` stands (the run was someone
        else's). Any other status is returned as it came.
        """
        path = f"{_dag_path(dag_id)}/dagRuns"
        body = {"dag_run_id": run_id, "logical_date": None, "conf": dict(conf)}
        retried = False
        for attempt in range(attempts):
            status, answer = self.request("POST", path, body)
            if not (status == 500 and "Database error" in str(answer)) or attempt == attempts - 1:
                break
            retried = True
            time.sleep(2)
        if status == 409 and retried:
            read, found = self.request("GET", f"{path}/{quote(run_id, safe='')}")
            if read == 200 and isinstance(found, dict) and found.get("conf") == body["conf"]:
                return read, found
        return status, answer

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Every run of ``dag_id``, oldest first (all pages); raises :class:`AirflowApiError`."""
        runs: list[dict[str, Any]] = []
        while True:
            path = f"{_dag_path(dag_id)}/dagRuns?limit={_PAGE}&offset={len(runs)}&order_by=id"
            status, page = self.request("GET", path)
            if status != 200 or not isinstance(page, dict):
                raise AirflowApiError(f"GET {path}", status, page)
            runs.extend(page["dag_runs"])
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return runs

    def wait_for_runs(self, dag_id: str, count: int, states: Collection[str] = ("success",),
                      timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until at least ``count`` runs of ``dag_id`` are in ``states``; return those runs.

        Raises ``TimeoutError`` after ``timeout`` s, saying how many runs
        are in which state (failed tasks' logs are under ``<home>/logs``).
        """
        deadline = time.monotonic() + timeout
        while True:
            runs = self.dag_runs(dag_id)
            done = [run for run in runs if run.get("state") in states]
            if len(done) >= count:
                return done
            if time.monotonic() > deadline:
                seen = dict(Counter(str(run.get("state")) for run in runs))
                raise TimeoutError(f"{len(done)} of {count} runs of {dag_id!r} in {sorted(states)}"
                                   f" after {timeout:.0f} s (runs by state: {seen}; task logs "
                                   f"under {self.home / 'logs'})")
            time.sleep(0.25)


def _dag_path(dag_id: str) -> str:
    """``/api/v2/dags/{dag_id}``, the id quoted."""
    return f"/api/v2/dags/{quote(dag_id, safe='')}"


def _parsed(raw: bytes) -> Any:
    text = raw.decode(errors="replace")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def _import_errors(answer: Any) -> str:
    if not isinstance(answer, dict) or not answer.get("import_errors"):
        return "none"
    return " | ".join(f"{error.get('filename')}: {str(error.get('stack_trace')).strip()[-200:]}"
                      for error in answer["import_errors"][:3])


def _stop_groups(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process's group, wait for all (one bounded wait), then SIGKILL what is left."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        # The leader may be gone while its children (workers, parsers) linger: kill the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=_STOP_TIMEOUT)


@contextlib.contextmanager
def airflow_server(dags_folder: Path, *, version: str = DEFAULT_AIRFLOW_VERSION,
                   components: Collection[str] = DEFAULT_COMPONENTS,
                   extra: Sequence[str] = (), environment: Mapping[str, str] | None = None,
                   keep: bool = False, start_timeout: float = 120.0,
                   hang_timeout: float = 30.0) -> Iterator[AirflowServer]:
    """Run Airflow on ``dags_folder`` for the ``with`` block; yields the :class:`AirflowServer`.

    The arguments are :class:`AirflowServer`'s; raises what its ``start``
    raises. The server is stopped when the block ends, however it ends.
    """
    server = AirflowServer(dags_folder, version=version, components=components, extra=extra,
                           environment=environment, keep=keep, start_timeout=start_timeout,
                           hang_timeout=hang_timeout)
    with server:
        yield server
