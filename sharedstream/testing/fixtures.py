"""Real local brokers as pytest fixtures: an opt-in plugin, never loaded on its own.

Enable it in your top-level ``conftest.py`` (or with ``-p``)::

    pytest_plugins = ["sharedstream.testing.fixtures"]

Each fixture is session-scoped: the broker starts once, on a free loopback
port, on first use, and is stopped when the session ends (also on an error
or Ctrl-C). A broker that is not installed here skips the tests that need
it, saying what to install; one that is installed but does not start fails
them.

========================  =====================================================
fixture                   value
========================  =====================================================
``tansu_bootstrap``       Tansu's Kafka bootstrap, ``"127.0.0.1:<port>"``
``moto_endpoint``         moto's SQS/S3 endpoint, ``"http://127.0.0.1:<port>"``
``fauxqs_endpoint``       fauxqs's SQS endpoint (installed from npm on first use)
``pubsub_emulator_host``  a Pub/Sub server's ``"host:port"``, also set as
                          ``PUBSUB_EMULATOR_HOST`` for the session (the kit's
                          test server, or the emulator already named there)
``servicebus_connection_string``
                          a Service Bus connection string: the kit's test
                          server with the entities of ``servicebus_entities``
                          (override it), or the namespace named by
                          ``SHAREDSTREAM_SERVICEBUS_CONNECTION_STRING``
``kafka_container``       a Kafka container's bootstrap (Docker only)
``localstack_endpoint``   LocalStack's SQS endpoint in a container (Docker only)
``postgres_url``          a PostgreSQL server's admin URL for the session
                          (``$SHAREDSTREAM_TEST_POSTGRES_URL``, or a throwaway
                          cluster started with ``initdb`` + ``pg_ctl``)
``postgres_database``     the URL of an empty database on it, dropped after the test
``airflow_server``        a real Apache Airflow 3 (:mod:`sharedstream.testing.airflow`,
                          installed from PyPI into its own virtualenv on first
                          use): an ``AirflowServer`` on the session's
                          ``dags_folder``; its metadata in SQLite, or in
                          PostgreSQL where ``$SHAREDSTREAM_AIRFLOW_DB`` is
                          ``postgresql``
========================  =====================================================

PostgreSQL and Airflow are the exceptions to the skip rule: where ``CI`` is
set in the environment, a missing PostgreSQL or an Airflow that cannot be
installed fails the tests instead of skipping them (CI provides both; a
skip there would hide a gap).

:func:`running_or_skip` is the same skip rule for a ``conftest.py`` that
starts a broker its own way.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, TypeVar

import pytest

from sharedstream.testing import airflow as airflow_kit
from sharedstream.testing.brokers import (
    BrokerNotInstalled,
    containers,
    fauxqs_server,
    moto_server,
    pubsub_server,
    tansu_broker,
)
from sharedstream.testing.brokers.postgres import fresh_database, postgres_server
from sharedstream.testing.brokers.servicebus import servicebus_server

__all__ = [
    "airflow_database",
    "airflow_server",
    "fauxqs_endpoint",
    "kafka_container",
    "localstack_endpoint",
    "moto_endpoint",
    "postgres_database",
    "postgres_url",
    "pubsub_emulator_host",
    "running_or_skip",
    "servicebus_connection_string",
    "servicebus_entities",
    "tansu_bootstrap",
]

POSTGRES_URL_ENV = "SHAREDSTREAM_TEST_POSTGRES_URL"
"""Names an existing PostgreSQL server (a role that may create databases) to test against."""

AIRFLOW_DB_ENV = "SHAREDSTREAM_AIRFLOW_DB"
"""Where the ``airflow_server`` fixture's Airflow keeps its metadata: ``sqlite`` (unset: the
default) or ``postgresql`` (a fresh database on a server found or started as ``postgres_url``
does)."""

AIRFLOW_DBS = ("sqlite", "postgresql")

SERVICEBUS_ENV = "SHAREDSTREAM_SERVICEBUS_CONNECTION_STRING"
"""Names a real namespace or the official emulator to use instead of the kit's test server."""


_T = TypeVar("_T")


def _skip(exc: BrokerNotInstalled) -> NoReturn:
    pytest.skip(str(exc))


@contextlib.contextmanager
def running_or_skip(broker: contextlib.AbstractContextManager[str]) -> Iterator[str]:
    """Enter ``broker`` and yield its address; skip the test if it is not installed.

    Only the start is guarded: an exception raised by the test itself, inside
    the block, passes through untouched.
    """
    with contextlib.ExitStack() as stack:
        try:
            address = stack.enter_context(broker)
        except BrokerNotInstalled as exc:
            _skip(exc)
        yield address


@contextlib.contextmanager
def _running_or_skip_unless_ci(what: str,
                               broker: contextlib.AbstractContextManager[_T]) -> Iterator[_T]:
    """:func:`running_or_skip`, but a failure where ``CI`` is set (CI must provide ``what``)."""
    with contextlib.ExitStack() as stack:
        try:
            value = stack.enter_context(broker)
        except BrokerNotInstalled as exc:
            if os.environ.get("CI"):
                pytest.fail(f"{what} is required where CI is set: {exc}")
            _skip(exc)
        yield value


@pytest.fixture(scope="session")
def tansu_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Tansu in memory for the session; its bootstrap ``host:port``."""
    with running_or_skip(tansu_broker(tmp_path_factory.mktemp("tansu"))) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The moto server for the session; its endpoint URL (any region and keys)."""
    with running_or_skip(moto_server(tmp_path_factory.mktemp("moto"))) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def fauxqs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fauxqs emulator for the session; its endpoint URL (any region and keys)."""
    workdir = tmp_path_factory.mktemp("fauxqs")
    with running_or_skip(fauxqs_server(workdir=workdir)) as endpoint:
        yield endpoint


def _answers(host: str) -> bool:
    address, _, port = host.rpartition(":")
    try:
        socket.create_connection((address.strip("[]") or "localhost", int(port)),
                                 timeout=1).close()
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="session")
def pubsub_emulator_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Pub/Sub server for the session; its ``host:port``, set as ``PUBSUB_EMULATOR_HOST``.

    When ``PUBSUB_EMULATOR_HOST`` already names a server that answers (Google's
    emulator from gcloud, a container), that one is used and nothing is
    started; when it names one that does not answer, the tests fail (unset it
    to get the kit's server). Otherwise the kit's test server
    (:mod:`sharedstream.testing.pubsub`) is started and the variable is set
    for the session, so every client created meanwhile talks to it; the old
    value comes back at the end.
    """
    given = os.environ.get("PUBSUB_EMULATOR_HOST")
    if given:
        if not _answers(given):
            pytest.fail(f"PUBSUB_EMULATOR_HOST={given} does not answer; start that emulator "
                        "or unset the variable to use the testing kit's Pub/Sub server")
        yield given
        return
    workdir = tmp_path_factory.mktemp("pubsub")
    with running_or_skip(pubsub_server(workdir)) as host, pytest.MonkeyPatch.context() as env:
        env.setenv("PUBSUB_EMULATOR_HOST", host)
        yield host


@pytest.fixture(scope="session")
def servicebus_entities() -> Mapping[str, Any]:
    """The queues, topics and subscriptions the kit's Service Bus server creates: none.

    Override it (session scope) in a ``conftest.py`` with an entities
    document (:mod:`sharedstream.testing.servicebus.config`) naming what
    the tests use. With ``SHAREDSTREAM_SERVICEBUS_CONNECTION_STRING`` set it
    is ignored: those entities must exist in that namespace.
    """
    return {}


@pytest.fixture(scope="session")
def servicebus_connection_string(tmp_path_factory: pytest.TempPathFactory,
                                 servicebus_entities: Mapping[str, Any]) -> Iterator[str]:
    """A Service Bus connection string for the session.

    ``SHAREDSTREAM_SERVICEBUS_CONNECTION_STRING`` when set (a real namespace,
    or the official emulator's ``...;UseDevelopmentEmulator=true;`` string):
    nothing is started. Otherwise the kit's test server
    (:mod:`sharedstream.testing.servicebus`) is started with the entities of
    ``servicebus_entities``, and stopped at the end of the session.
    """
    given = os.environ.get(SERVICEBUS_ENV)
    if given:
        yield given
        return
    workdir = tmp_path_factory.mktemp("servicebus")
    with running_or_skip(servicebus_server(workdir, entities=servicebus_entities)) as string:
        yield string


@pytest.fixture(scope="session")
def kafka_container() -> Iterator[str]:
    """A Kafka container for the session (skipped without Docker); its bootstrap."""
    with running_or_skip(containers.kafka_container()) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def localstack_endpoint() -> Iterator[str]:
    """LocalStack's SQS in a container for the session (skipped without Docker)."""
    with running_or_skip(containers.localstack_container()) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server for the session; its admin URL (a superuser, trust authentication).

    ``$SHAREDSTREAM_TEST_POSTGRES_URL`` names an existing server instead
    (its role must be allowed to create databases). Without PostgreSQL the
    tests skip, or fail where ``CI`` is set.
    """
    with _postgres_admin() as url:
        yield url


@contextlib.contextmanager
def _postgres_admin() -> Iterator[str]:
    """What ``postgres_url`` yields, for the block."""
    given = os.environ.get(POSTGRES_URL_ENV)
    if given:
        yield given
        return
    with _running_or_skip_unless_ci("PostgreSQL", postgres_server()) as url:
        yield url


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[str]:
    """The URL of a new, empty database on the session's server; dropped after the test."""
    with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def airflow_server(tmp_path_factory: pytest.TempPathFactory,
                   request: pytest.FixtureRequest) -> Iterator[airflow_kit.AirflowServer]:
    """A real Airflow 3 for the session (API server, scheduler, DAG processor), no DAGs at first.

    Tests write DAG files into ``server.dags_folder`` under names of their
    own, then call ``server.wait_for_dag(dag_id)`` (about a second). The
    version is ``$SHAREDSTREAM_AIRFLOW_VERSION`` (default 3.3.2); the first
    use installs it (about 30 s, cached; see
    :func:`~sharedstream.testing.airflow_venv.airflow_venv`), each start
    about 10 s more. Skipped when it cannot be installed, failed where ``CI`` is
    set; a start that fails fails the tests. When a test of the session
    failed, the API server's last error lines (``AirflowServer.errors()``)
    are printed before it stops: its log goes with its home directory.

    The metadata database is SQLite in Airflow's home unless
    ``$SHAREDSTREAM_AIRFLOW_DB`` is ``postgresql``: then a fresh database on
    a PostgreSQL server found or started as ``postgres_url`` does (the one
    ``$SHAREDSTREAM_TEST_POSTGRES_URL`` names, or a throwaway cluster of
    its own), dropped after Airflow stopped, with Airflow's PostgreSQL
    drivers in a virtualenv of their own
    (:func:`~sharedstream.testing.airflow.postgres_metadata`). Any other
    value fails the tests that use the fixture, naming the variable.
    """
    database = airflow_database()
    dags = tmp_path_factory.mktemp("airflow-dags")
    with contextlib.ExitStack() as stack:
        extra: tuple[str, ...] = ()
        environment: dict[str, str] = {}
        if database == "postgresql":
            admin = stack.enter_context(_postgres_admin())
            url = stack.enter_context(fresh_database(admin, prefix="airflow"))
            extra, environment = airflow_kit.postgres_metadata(url)
        server = stack.enter_context(_running_or_skip_unless_ci(
            "Apache Airflow",
            airflow_kit.airflow_server(dags, extra=extra, environment=environment)))
        yield server
        if request.session.testsfailed:
            _report_airflow_errors(request.config, server.errors())


def airflow_database() -> str:
    """``$SHAREDSTREAM_AIRFLOW_DB`` checked: ``sqlite`` (also when unset) or ``postgresql``.

    Raises ``ValueError`` naming the variable for any other value.
    """
    value = os.environ.get(AIRFLOW_DB_ENV, "").strip().lower() or "sqlite"
    if value not in AIRFLOW_DBS:
        raise ValueError(f"{AIRFLOW_DB_ENV}={os.environ[AIRFLOW_DB_ENV]!r}: "
                         f"choose {' or '.join(AIRFLOW_DBS)}")
    return value


def _report_airflow_errors(config: pytest.Config, errors: list[str]) -> None:
    """Write ``errors`` to the terminal, past pytest's capture.

    Captured, they would belong to the last test's teardown, shown only if
    that test failed.
    """
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not errors:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line(f"\nAirflow's API server's last error lines ({len(errors)}):")
        for line in errors:
            reporter.write_line(f"  {line}")
