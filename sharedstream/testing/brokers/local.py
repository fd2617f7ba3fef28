"""The kit's brokers for a person at a terminal (``sharedstream broker start``).

One :class:`LocalBroker` per broker, from :data:`LOCAL_BROKERS`: how to
start it (the kit's ``start_*`` of this package, on ``127.0.0.1``, a given
port or a free one), how to stop it, how to create a stream on it, and the
Airflow-style connection that reaches it - the one thing a user copies,
as an environment variable or a config-file table, for ``sharedstream
send --conn-id`` and for triggers (``conn_id=``) alike.

Streams (``--create NAME``): a Kafka topic of one partition, an SQS queue
(FIFO when the name ends in ``.fifo``), a Pub/Sub topic with a
subscription of the same name (message ordering on), a Service Bus queue
(a spec of the kit's server: ``NAME[:sessions,lock_duration=5,...]``).

Invariants: :meth:`LocalBroker.stop` is idempotent and quick (Tansu is
killed at once: its storage is in memory, and it may ignore SIGTERM while
a consumer is connected), and never leaves the child process behind. SDKs
are imported only inside the functions that need them.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharedstream.testing.brokers.moto import start_moto, stop_moto
from sharedstream.testing.brokers.process import stop_process
from sharedstream.testing.brokers.pubsub import start_pubsub, stop_pubsub
from sharedstream.testing.brokers.servicebus import start_servicebus, stop_servicebus
from sharedstream.testing.brokers.tansu import start_tansu, tansu_binary

__all__ = ["LOCAL_BROKERS", "LOCAL_PROJECT", "LocalBroker", "RunningBroker"]

LOCAL_PROJECT = "local"
"""The Google Cloud project of the local Pub/Sub test server's connection (any name works)."""
_LOCAL_KEYS = {"login": "test", "password": "test"}
"""moto takes any keys; botocore needs some."""


@dataclass
class RunningBroker:
    """A started local broker: its process, where it listens, and its connection."""

    name: str
    process: subprocess.Popen[bytes]
    address: str
    """Where it listens: a ``host:port`` (Kafka, Pub/Sub) or an endpoint URL (``http://``,
    ``sb://``)."""
    connection: dict[str, Any]
    """Its Airflow-style connection (``conn_type``, fields, ``extra``), as JSON or TOML."""
    stop: Callable[[subprocess.Popen[bytes]], None]

    def close(self) -> None:
        """Stop the broker's process (SIGTERM, a kill if it lingers); idempotent."""
        self.stop(self.process)


@dataclass(frozen=True)
class LocalBroker:
    """How to run one broker of the kit locally; see the module docstring."""

    name: str
    start: Callable[[Path, int | None, Sequence[str]], RunningBroker]
    """``(workdir, port, streams)``: start it (its log in ``workdir``); streams may be
    created here (Service Bus takes them at start) or by :attr:`create`."""
    create: Callable[[RunningBroker, Sequence[str]], None] | None
    """Create streams on the running broker (``None``: :attr:`start` did)."""
    send_options: Callable[[str], str]
    """The ``sharedstream send`` options naming a stream (``--topic orders``)."""


# -- Kafka (Tansu) ------------------------------------------------------------------------


def _stop_tansu(process: subprocess.Popen[bytes]) -> None:
    stop_process(process, timeout=1.0)


def _start_kafka(workdir: Path, port: int | None, _streams: Sequence[str]) -> RunningBroker:
    process, address = start_tansu(tansu_binary(), workdir, port=port)
    return RunningBroker("kafka", process, address,
                         {"conn_type": "kafka", "extra": {"bootstrap.servers": address}},
                         _stop_tansu)


def _create_kafka(broker: RunningBroker, streams: Sequence[str]) -> None:
    async def create() -> None:
        admin_module: Any = importlib.import_module("aiokafka.admin")
        admin = admin_module.AIOKafkaAdminClient(bootstrap_servers=broker.address)
        await admin.start()
        try:
            await admin.create_topics([admin_module.NewTopic(name, num_partitions=1,
                                                             replication_factor=1)
                                       for name in streams])
        finally:
            await admin.close()

    asyncio.run(create())


# -- SQS (moto) -----------------------------------------------------------------------------


def _start_sqs(workdir: Path, port: int | None, _streams: Sequence[str]) -> RunningBroker:
    process, endpoint = start_moto(workdir, port=port)
    return RunningBroker("sqs", process, endpoint,
                         {"conn_type": "aws", **_LOCAL_KEYS,
                          "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}},
                         stop_moto)


def _create_sqs(broker: RunningBroker, streams: Sequence[str]) -> None:
    async def create() -> None:
        session = importlib.import_module("aiobotocore.session").get_session()
        async with session.create_client(
                "sqs", region_name="us-east-1", endpoint_url=broker.address,
                aws_access_key_id=_LOCAL_KEYS["login"],
                aws_secret_access_key=_LOCAL_KEYS["password"]) as client:
            for name in streams:
                fifo = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
                await client.create_queue(QueueName=name, Attributes=fifo)

    asyncio.run(create())


# -- Pub/Sub (the kit's test server) ------------------------------------------------------


def _start_pubsub(workdir: Path, port: int | None, _streams: Sequence[str]) -> RunningBroker:
    process, host = start_pubsub(workdir, port=port)
    return RunningBroker("pubsub", process, host,
                         {"conn_type": "google_cloud_platform",
                          "extra": {"project": LOCAL_PROJECT, "emulator_host": host}},
                         stop_pubsub)


def _create_pubsub(broker: RunningBroker, streams: Sequence[str]) -> None:
    from sharedstream.producers.pubsub import pubsub_clients  # noqa: PLC0415 - the extra

    async def create() -> None:
        publisher = pubsub_clients(broker.address, "publisher")
        subscriber = pubsub_clients(broker.address, "subscriber")
        try:
            for name in streams:
                topic = f"projects/{LOCAL_PROJECT}/topics/{name}"
                await publisher.create_topic(name=topic)
                await subscriber.create_subscription(request={
                    "name": f"projects/{LOCAL_PROJECT}/subscriptions/{name}", "topic": topic,
                    "enable_message_ordering": True})
        finally:
            for client in (publisher, subscriber):
                await client.transport.close()

    asyncio.run(create())


# -- Service Bus (the kit's test server) --------------------------------------------------


def _start_servicebus(workdir: Path, port: int | None, streams: Sequence[str]) -> RunningBroker:
    from sharedstream.testing.servicebus.config import document_from_specs  # noqa: PLC0415

    try:
        entities = document_from_specs(queues=streams)
    except ValueError as exc:
        from sharedstream.testing.brokers.process import LocalBrokerError  # noqa: PLC0415

        raise LocalBrokerError(f"--create: {exc}") from None
    process, connection_string = start_servicebus(workdir, entities=entities, port=port)
    endpoint = connection_string.split(";", 1)[0].removeprefix("Endpoint=")
    return RunningBroker("servicebus", process, endpoint,
                         {"conn_type": "azure_service_bus", "schema": connection_string},
                         stop_servicebus)


LOCAL_BROKERS: Mapping[str, LocalBroker] = {
    "kafka": LocalBroker("kafka", _start_kafka, _create_kafka, lambda name: f"--topic {name}"),
    "sqs": LocalBroker("sqs", _start_sqs, _create_sqs, lambda name: f"--queue {name}"),
    "pubsub": LocalBroker("pubsub", _start_pubsub, _create_pubsub,
                          lambda name: f"--topic {name}"),
    "servicebus": LocalBroker("servicebus", _start_servicebus, None,
                              lambda name: f"--queue {name.partition(':')[0]}"),
}
"""``sharedstream broker start`` name -> its :class:`LocalBroker`."""


def connection_json(connection: Mapping[str, Any]) -> str:
    """The connection as the JSON an environment variable holds (``SHAREDSTREAM_CONN_<ID>``)."""
    return json.dumps(dict(connection), separators=(", ", ": "))
