"""Real brokers on this machine for tests, benchmarks and the demo: start, yield the address, stop.

Each broker is a context manager that starts it on a free ``127.0.0.1``
port, yields what a client connects to, and stops it when the block ends,
however it ends (an error, ``KeyboardInterrupt``):

* ``tansu_broker()`` - Tansu (Kafka protocol): the bootstrap ``"127.0.0.1:<port>"``;
* ``moto_server()`` - moto (SQS, S3): the endpoint ``"http://127.0.0.1:<port>"``;
* ``fauxqs_server()`` - fauxqs (SQS, fast; installed from npm on first use): the
  endpoint URL;
* ``pubsub_server()`` - the kit's Google Pub/Sub test server
  (:mod:`sharedstream.testing.pubsub`): the ``"127.0.0.1:<port>"`` to put in
  ``PUBSUB_EMULATOR_HOST``;
* ``servicebus_server()`` - the kit's Azure Service Bus test server
  (:mod:`sharedstream.testing.servicebus`): its connection string;
* ``kafka_container()``, ``localstack_container()``, ``pubsub_container()`` -
  Kafka, LocalStack's SQS and Google's Pub/Sub emulator in Docker through
  testcontainers: the bootstrap, the endpoint URL, the emulator's host.

What a broker needs but is missing raises :class:`BrokerNotInstalled`
(:class:`NoDockerEngine` for the containers) with the install hint; a broker
that is installed but does not come up raises :class:`BrokerDidNotStart`.
The lower-level ``start_*``/``stop_*`` pairs return the process, for a
caller that must stop the broker from elsewhere (a signal handler, a
restart test). For pytest, see :mod:`sharedstream.testing.fixtures`.

Nothing here imports a broker SDK at import time: botocore and
testcontainers are imported only inside the functions that need them, and
the Pub/Sub test server imports gRPC and the Google client only in its own
process.
"""

from __future__ import annotations

from sharedstream.testing.brokers import containers
from sharedstream.testing.brokers.containers import (
    NoDockerEngine,
    containers_unavailable,
    docker_unavailable,
    kafka_container,
    localstack_container,
    pubsub_container,
)
from sharedstream.testing.brokers.fauxqs import (
    ensure_fauxqs,
    fauxqs_server,
    start_fauxqs,
    stop_fauxqs,
)
from sharedstream.testing.brokers.moto import moto_server, start_moto, stop_moto
from sharedstream.testing.brokers.process import (
    BrokerDidNotStart,
    BrokerNotInstalled,
    LocalBrokerError,
    free_port,
)
from sharedstream.testing.brokers.pubsub import pubsub_server, start_pubsub, stop_pubsub
from sharedstream.testing.brokers.servicebus import (
    servicebus_server,
    start_servicebus,
    stop_servicebus,
)
from sharedstream.testing.brokers.tansu import start_tansu, stop_tansu, tansu_binary, tansu_broker

__all__ = [
    "BrokerDidNotStart",
    "BrokerNotInstalled",
    "LocalBrokerError",
    "NoDockerEngine",
    "containers",
    "containers_unavailable",
    "docker_unavailable",
    "ensure_fauxqs",
    "fauxqs_server",
    "free_port",
    "kafka_container",
    "localstack_container",
    "moto_server",
    "pubsub_container",
    "pubsub_server",
    "servicebus_server",
    "start_fauxqs",
    "start_moto",
    "start_pubsub",
    "start_servicebus",
    "start_tansu",
    "stop_fauxqs",
    "stop_moto",
    "stop_pubsub",
    "stop_servicebus",
    "stop_tansu",
    "tansu_binary",
    "tansu_broker",
]
