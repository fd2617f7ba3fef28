"""Brokers in containers through testcontainers, when a Docker engine answers.

For brokers that publish an image (Apache Kafka, LocalStack for SQS,
Google's Pub/Sub emulator from the gcloud CLI image). The
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
import shutil
import subprocess
import time
from collections.abc import Iterator
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
    "NoDockerEngine",
    "containers_unavailable",
    "docker_unavailable",
    "kafka_container",
    "localstack_container",
    "pubsub_container",
]

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
LOCALSTACK_IMAGE = "localstack/localstack:3.8"
PUBSUB_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"


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
