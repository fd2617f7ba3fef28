"""Sending to a Kafka topic with ``aiokafka`` (``sharedstream send --broker kafka``, the demo).

Where to connect is the Kafka trigger's: ``bootstrap_servers`` and the
security settings of a ``kafka`` connection (``conn_id``, read by
:func:`~sharedstream.triggers.kafka.kafka_settings_from_connection`), with
the producer settings the dead-letter and re-drive producers use
(:func:`~sharedstream.producers._kafka_types.sending_config`: every replica
acknowledges, no idempotence, which Tansu lacks). Each message becomes one
record: its ``key`` the record key, its ``properties`` the headers (UTF-8).
A batch is sent without waiting record by record, then awaited as a whole,
so records keep their order within a partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.brokerkit.sending import OutgoingMessage, SendConnectError, SendFailed
from sharedstream.connections.settings import resolve_inline
from sharedstream.producers._kafka_types import KafkaConfigError, KafkaSettings, sending_config
from sharedstream.triggers.kafka import kafka_settings_from_connection

__all__ = ["DEFAULT_BOOTSTRAP", "KafkaSender"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
"""Where ``send`` connects when neither ``--bootstrap-servers`` nor a connection says."""

_sdk = OptionalSdk(broker="Kafka", package="aiokafka", extra="kafka", error=KafkaConfigError,
                   user="sending to Kafka")


class KafkaSender:
    """Records to one topic, through one ``AIOKafkaProducer``."""

    broker: ClassVar[str] = "kafka"
    options: ClassVar[frozenset[str]] = frozenset(
        {"topic", "key", "bootstrap_servers", "conn_id"})
    key_option: ClassVar[str | None] = "key"
    batch_size: ClassVar[int] = 500

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        """Send to ``topic`` with the connection and security of ``settings`` (no I/O yet)."""
        _sdk()
        self.settings, self.topic = settings, topic
        self._producer: Any = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> KafkaSender:
        """``topic`` (required), ``bootstrap_servers`` and/or ``conn_id``."""
        if not options.get("topic"):
            raise KafkaConfigError("sending to Kafka needs --topic")
        inline = {"bootstrap_servers": options.get("bootstrap_servers"),
                  "conn_id": options.get("conn_id")}
        found = resolve_inline(inline, kafka_settings_from_connection, mappings=("security",))
        settings = KafkaSettings(
            bootstrap_servers=found.get("bootstrap_servers") or DEFAULT_BOOTSTRAP,
            topics=(options["topic"],), group_id="sharedstream-send",
            client_id=found.get("client_id"), security=dict(found.get("security") or {}))
        return cls(settings, options["topic"])

    @property
    def destination(self) -> str:
        """``kafka topic <topic>``."""
        return f"kafka topic {self.topic}"

    def _address(self) -> str:
        servers = self.settings.bootstrap_servers
        return servers if isinstance(servers, str) else ",".join(servers)

    async def open(self) -> None:
        """Start the producer (it reads the cluster's metadata from the bootstrap servers)."""
        aiokafka = _sdk()
        errors = _sdk("aiokafka.errors")
        try:
            self._producer = aiokafka.AIOKafkaProducer(
                **sending_config(self.settings, "send"), linger_ms=5)
        except (TypeError, ValueError, errors.KafkaError) as exc:
            raise KafkaConfigError(f"invalid Kafka producer settings: {exc}") from exc
        try:
            await self._producer.start()
        except errors.KafkaError as exc:
            raise SendConnectError(f"cannot reach Kafka at {self._address()} "
                                   f"({type(exc).__name__})") from exc

    async def send(self, batch: Sequence[OutgoingMessage]) -> None:
        """Send every record of ``batch``, then wait for all their acknowledgements."""
        errors = _sdk("aiokafka.errors")
        try:
            pending = [
                await self._producer.send(
                    self.topic, message.body,
                    key=None if message.key is None else message.key.encode(),
                    headers=[(name, value.encode()) for name, value in message.properties])
                for message in batch
            ]
            await asyncio.gather(*pending)
        except errors.KafkaTimeoutError as exc:
            raise SendFailed(f"Kafka at {self._address()} did not take the records for topic "
                             f"{self.topic!r} in time (does the topic exist?)") from exc
        except errors.KafkaError as exc:
            raise SendFailed(f"Kafka at {self._address()} failed a record for topic "
                             f"{self.topic!r}: {exc}") from exc

    async def close(self) -> None:
        """Stop the producer (it flushes what is pending); idempotent."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
