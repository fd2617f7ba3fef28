"""Brokers in containers through testcontainers, when a Docker engine answers.

For brokers that publish an image (Apache Kafka, LocalStack for SQS,
Google's Pub/Sub emulator from the gcloud CLI image, Microsoft's Service Bus
emulator with the SQL Server it needs). The
``testcontainers`` package is optional and imported only when a container is
asked for; without it, or without a Docker engine, the context managers
raise :class:`NoDockerEngine` *before* starting anything, with a message
saying which of the two is missing (the fixtures skip with it). Where there
is no Docker, use the local processes (:mod:`.tansu`, :mod:`.moto`,
:mod:`.fauxqs`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sharedstream.testing.brokers.process import (
    BrokerDidNotStart,
    BrokerNotInstalled,
    port_answers,
)

__all__ = [
    "KAFKA_IMAGE",
    "LOCALSTACK_IMAGE",
    "PUBSUB_IMAGE",
    "SERVICEBUS_EMULATOR_IMAGE",
    "SQL_SERVER_IMAGE",
    "NoDockerEngine",
    "containers_unavailable",
    "docker_unavailable",
    "kafka_container",
    "localstack_container",
    "pubsub_container",
    "servicebus_emulator_container",
]

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
LOCALSTACK_IMAGE = "localstack/localstack:3.8"
PUBSUB_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"
SERVICEBUS_EMULATOR_IMAGE = "mcr.microsoft.com/azure-messaging/servicebus-emulator:latest"
SQL_SERVER_IMAGE = "mcr.microsoft.com/mssql/server:2022-latest"
"""The emulator keeps its entities and messages in a SQL Server (or Azure SQL Edge)."""


class NoDockerEngine(BrokerNotInstalled):
    """No container can run here: no Docker engine answers, or testcontainers is missing."""


def docker_unavailable() -> str | None:
    """Why no Docker engine can be used here, or ``None`` when one answers a ping."""
    try:
        docker: Any = importlib.import_module("docker")  # the client testcontainers uses
    except ImportError:
        docker = None
    if docker is not None:
        client = None
        try:
            client = docker.from_env(timeout=10)
            client.ping()
        except Exception as exc:  # noqa: BLE001 - whatever fails, there is no engine to use
            return f"no Docker engine answers ({type(exc).__name__}: {exc})"
        finally:
            if client is not None:
                client.close()  # its socket, also after a failed ping
        return None
    cli = shutil.which("docker")
    if cli is None:
        return "no Docker client (neither the docker package nor the docker CLI)"
    try:
        info = subprocess.run([cli, "info"], capture_output=True, timeout=10, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine answers (docker info: {exc})"
    return None if info.returncode == 0 else "no Docker engine answers (docker info failed)"


def containers_unavailable() -> str | None:
    """Why the container backends cannot run here (``None`` when they can)."""
    try:
        importlib.import_module("testcontainers")
    except ImportError:
        return "the testcontainers package is not installed (pip install testcontainers)"
    return docker_unavailable()


def _testcontainers_module(name: str) -> Any:
    why_not = containers_unavailable()
    if why_not is not None:
        raise NoDockerEngine(f"cannot run a {name} container: {why_not}")
    try:  # testcontainers >= 4.10 moved the modules; the old paths still work, deprecated
        return importlib.import_module(f"testcontainers.community.{name}")
    except ImportError:
        return importlib.import_module(f"testcontainers.{name}")


@contextlib.contextmanager
def kafka_container(image: str = KAFKA_IMAGE) -> Iterator[str]:
    """A single-node Kafka (KRaft) container for the ``with`` block; yields its ``host:port``.

    Raises :class:`NoDockerEngine` before starting anything when it cannot run.
    """
    container = _testcontainers_module("kafka").KafkaContainer(image).with_kraft()
    try:  # stopping a container that never started is harmless
        container.start(timeout=180)
        yield str(container.get_bootstrap_server())
    finally:
        container.stop()


@contextlib.contextmanager
def localstack_container(
    image: str = LOCALSTACK_IMAGE, *, region: str = "us-east-1",
) -> Iterator[str]:
    """LocalStack (SQS only) for the ``with`` block; yields its endpoint URL.

    Raises :class:`NoDockerEngine` before starting anything when it cannot run.
    """
    container = _testcontainers_module("localstack").LocalStackContainer(
        image=image, region_name=region)
    container.with_services("sqs")
    try:
        container.start(timeout=180)  # returns once LocalStack logs "Ready."
        yield str(container.get_url())
    finally:
        container.stop()


@contextlib.contextmanager
def pubsub_container(image: str = PUBSUB_IMAGE, *, project: str = "sharedstream",
                     timeout: float = 180.0) -> Iterator[str]:
    """Google's Pub/Sub emulator (``gcloud beta emulators pubsub``) for the ``with`` block.

    Yields its ``host:port``, for ``PUBSUB_EMULATOR_HOST`` or a trigger's
    ``emulator_host``; returns once the port accepts connections. Raises
    :class:`NoDockerEngine` before starting anything when it cannot run.
    """
    container = _testcontainers_module("google").PubSubContainer(image=image, project=project)
    try:
        container.start()
        host = str(container.get_pubsub_emulator_host())
        name, _, port = host.rpartition(":")
        deadline = time.monotonic() + timeout
        while not port_answers(int(port), host=name):
            if time.monotonic() > deadline:
                raise BrokerDidNotStart(f"the Pub/Sub emulator container did not answer on "
                                        f"{host} within {timeout:.0f} s")
            time.sleep(0.5)
        yield host
    finally:
        container.stop()


@contextlib.contextmanager
def servicebus_emulator_container(
    entities: Mapping[str, Any], *, image: str = SERVICEBUS_EMULATOR_IMAGE,
    sql_image: str = SQL_SERVER_IMAGE, timeout: float = 300.0,
) -> Iterator[str]:
    """Microsoft's Service Bus emulator for the ``with`` block; yields its connection string.

    ``entities`` is an entities document (:mod:`sharedstream.testing.servicebus.config`),
    turned into the emulator's ``Config.json``
    (:func:`~sharedstream.testing.servicebus.emulator_config.emulator_config`):
    the emulator creates entities only from that file, at start. Starts a
    SQL Server container and the emulator on a network of their own
    (running them accepts both images' EULAs), waits for the emulator's
    "Successfully Up" line, then until the first entity answers a peek (it
    finishes creating entities after that line). Raises ``ValueError`` for
    entities the emulator cannot take and :class:`NoDockerEngine`, both
    before starting anything. Not exercised by this repository's CI, which
    has no Docker engine.
    """
    from sharedstream.testing.servicebus.emulator_config import (  # noqa: PLC0415 - test kit only
        emulator_config,
    )

    config = emulator_config(entities)
    why_not = containers_unavailable()
    if why_not is not None:
        raise NoDockerEngine(f"cannot run the Service Bus emulator: {why_not}")
    core: Any = importlib.import_module("testcontainers.core.container")
    networks: Any = importlib.import_module("testcontainers.core.network")
    waiting: Any = importlib.import_module("testcontainers.core.waiting_utils")
    password = f"Ss-{secrets.token_hex(12)}!"  # SQL Server's policy: upper, lower, digit, symbol
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sb-emulator-")))
        (folder / "Config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        network = stack.enter_context(networks.Network())
        sql = (core.DockerContainer(sql_image).with_network(network)
               .with_network_aliases("sqlserver")
               .with_env("ACCEPT_EULA", "Y").with_env("MSSQL_SA_PASSWORD", password))
        stack.enter_context(sql)
        emulator = (core.DockerContainer(image).with_network(network)
                    .with_env("ACCEPT_EULA", "Y").with_env("SQL_SERVER", "sqlserver")
                    .with_env("MSSQL_SA_PASSWORD", password)
                    .with_volume_mapping(str(folder / "Config.json"),
                                         "/ServiceBus_Emulator/ConfigFiles/Config.json", "ro")
                    .with_exposed_ports(5672))
        stack.enter_context(emulator)
        started = time.monotonic()
        waiting.wait_for_logs(emulator, "Emulator Service is Successfully Up", timeout=timeout)
        connection_string = (
            f"Endpoint=sb://{emulator.get_container_host_ip()}:{emulator.get_exposed_port(5672)};"
            "SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;"
            "UseDevelopmentEmulator=true;")
        _wait_for_entities(connection_string, entities, started + timeout)
        yield connection_string


def _wait_for_entities(connection_string: str, entities: Mapping[str, Any],
                       deadline: float) -> None:
    """Peek the document's first queue (or subscription) until it answers, or raise."""
    queues, topics = list(entities.get("queues", ())), list(entities.get("topics", ()))
    if not queues and not topics:
        return
    sdk: Any = importlib.import_module("azure.servicebus")
    while True:
        try:
            with sdk.ServiceBusClient.from_connection_string(connection_string) as client:
                if queues:
                    receiver = client.get_queue_receiver(queues[0]["name"], max_wait_time=1,
                            keep_alive=None)
                else:
                    receiver = client.get_subscription_receiver(
                        topics[0]["name"], topics[0]["subscriptions"][0]["name"],
                        max_wait_time=1, keep_alive=None)
                with receiver:
                    receiver.peek_messages(max_message_count=1)
        except Exception as exc:  # not ready yet, whatever the SDK raised: try again
            if time.monotonic() > deadline:
                raise BrokerDidNotStart(f"the Service Bus emulator's entities did not answer "
                                        f"in time: {type(exc).__name__}: {exc}") from exc
            time.sleep(2.0)
        else:
            return
