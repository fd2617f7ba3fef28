"""A moto SQS server for the session, and the SQS harness of the conformance suite.

``moto_server`` (the ``moto[server]`` package) is started on a free loopback
port once per test session; every test makes its own queues. Without moto
or aiobotocore these tests skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from sharedstream import BaseEventTrigger
from sharedstream.producers.sqs import (
    DLQ_ATTRIBUTE_MESSAGE_ID,
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_TRIGGERS,
)
from sharedstream.testing.brokers import moto_server
from sharedstream.testing.fixtures import running_or_skip
from sharedstream.testing.harness import DeadLetter, Features, Stream, opened
from sharedstream.testing.scripts import ScriptedTrigger
from sharedstream.triggers.sqs import SqsSharedStreamTrigger

aiobotocore_session: Any = pytest.importorskip("aiobotocore.session")

REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
FAST = {"wait_time_seconds": 1, "visibility_timeout": 5, "receive_concurrency": 1}
"""Receive settings that keep tests quick (short long-polls, short visibility).

One receive at a time: moto's server can hand one message to two concurrent
receives (its receive does not lock the queue), which real SQS does only
rarely; the tests that count deliveries exactly would see that as a
duplicate. The end-to-end test runs the default concurrency (the store
de-duplicates)."""


@pytest.fixture(scope="session")
def sqs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's server on a free loopback port for the session, from the testing kit; its URL."""
    with running_or_skip(moto_server(tmp_path_factory.mktemp("moto"))) as endpoint:
        yield endpoint


class ConformanceSqsTrigger(ScriptedTrigger, SqsSharedStreamTrigger):
    """The SQS trigger with a scripted filter (see ``sharedstream.testing.scripts``)."""

    @classmethod
    def stream_of(cls, kwargs: dict[str, Any]) -> str:
        return str(kwargs["queue"]).rsplit("/", 1)[-1]

    def scripted_value(self, message: Any) -> bytes:
        return str(message.body).encode()


class SqsHarness:
    """The conformance harness over moto: one queue (and one dead-letter queue) per stream."""

    def __init__(self, endpoint: str, *, fifo: bool) -> None:
        self.endpoint, self.fifo = endpoint, fifo
        self.features = Features(
            ordered_lanes=fifo, ordered_delivery=fifo, refuses_lossy_settings=False,
        )
        self.client: Any = None
        self._exit = contextlib.AsyncExitStack()
        self.urls: dict[str, str] = {}
        self.sent: dict[str, list[str]] = {}  # queue -> message ids, in send order
        self.letters: dict[str, list[DeadLetter]] = {}

    async def start(self) -> None:
        session = aiobotocore_session.get_session()
        self.client = await self._exit.enter_async_context(session.create_client(
            "sqs", region_name=REGION, endpoint_url=self.endpoint, **CREDENTIALS))

    async def close(self) -> None:
        await self._exit.aclose()

    async def create_queue(self, name: str, **attributes: str) -> str:
        if self.fifo:
            name += ".fifo"
            attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true",
                          **attributes}
        response = await self.client.create_queue(QueueName=name, Attributes=attributes)
        url: str = response["QueueUrl"]
        self.urls[name] = url
        return url

    async def create_stream(self, *, dead_letter: bool = True) -> Stream:
        name = f"q-{uuid.uuid4().hex[:10]}"
        url = await self.create_queue(name)
        dlq = await self.create_queue(f"{name}-dlq") if dead_letter else None
        return Stream(name=url, dead_letter=dlq, group="")

    async def produce(self, stream: Stream, values: Sequence[bytes], *,
                      group: str = "g", attributes: dict[str, str] | None = None) -> None:
        ids = self.sent.setdefault(stream.name, [])
        for start in range(0, len(values), 10):
            entries: list[dict[str, Any]] = []
            for i, value in enumerate(values[start:start + 10]):
                entry: dict[str, Any] = {"Id": str(i), "MessageBody": value.decode()}
                if attributes:
                    entry["MessageAttributes"] = {
                        k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
                    }
                if self.fifo:
                    entry["MessageGroupId"] = group
                entries.append(entry)
            response = await self.client.send_message_batch(QueueUrl=stream.name,
                                                            Entries=entries)
            assert not response.get("Failed"), response
            by_id = {ok["Id"]: ok["MessageId"] for ok in response["Successful"]}
            ids.extend(by_id[str(i)] for i in range(len(entries)))

    def trigger_kwargs(self, stream: Stream, **overrides: Any) -> dict[str, Any]:
        return {
            "queue": stream.name, "endpoint_url": self.endpoint, "region_name": REGION,
            "credentials": dict(CREDENTIALS), "dead_letter_queue": stream.dead_letter,
            **FAST, **overrides,
        }

    def trigger(self, stream: Stream, *, script: str,
                max_redeliveries: int = 5) -> BaseEventTrigger:
        return ConformanceSqsTrigger(
            script=script, **self.trigger_kwargs(stream, max_redeliveries=max_redeliveries))

    def lossy_trigger(self, stream: Stream) -> BaseEventTrigger:  # pragma: no cover
        raise NotImplementedError("SQS has no setting that deletes before processing")

    async def counts(self, url: str) -> tuple[int, int, int]:
        """(visible, in flight, delayed) messages of a queue, read until two reads agree.

        moto's counts are exact, but it computes each one at its own instant
        (another server thread runs meanwhile): a message whose visibility
        changes between them is counted twice or not at all. A producer that
        keeps showing messages again (a held FIFO group) makes that common
        enough to matter, so one read is not trusted on its own.
        """
        last: tuple[int, int, int] | None = None
        for _ in range(50):
            response = await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed"])
            attributes = response["Attributes"]
            read = (int(attributes["ApproximateNumberOfMessages"]),
                    int(attributes["ApproximateNumberOfMessagesNotVisible"]),
                    int(attributes["ApproximateNumberOfMessagesDelayed"]))
            if read == last:
                return read
            last = read
            await asyncio.sleep(0.02)
        raise AssertionError(f"the counts of {url} did not settle: last read {last}")

    async def committed(self, stream: Stream) -> int:
        """How many of the stream's messages are deleted."""
        return len(self.sent.get(stream.name, [])) - sum(await self.counts(stream.name))

    async def drain(self, url: str) -> list[dict[str, Any]]:
        """Receive and delete everything currently visible in ``url``."""
        taken: list[dict[str, Any]] = []
        while True:
            response = await self.client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                MessageAttributeNames=["All"], AttributeNames=["All"])
            messages = response.get("Messages") or []
            if not messages:
                return taken
            for message in messages:
                await self.client.delete_message(QueueUrl=url,
                                                 ReceiptHandle=message["ReceiptHandle"])
            taken.extend(messages)

    async def dead_letters(self, stream: Stream) -> list[DeadLetter]:
        assert stream.dead_letter is not None
        letters = self.letters.setdefault(stream.dead_letter, [])
        for message in await self.drain(stream.dead_letter):
            attributes = message["MessageAttributes"]
            letters.append(DeadLetter(
                message["Body"].encode(), attributes[DLQ_ATTRIBUTE_MESSAGE_ID]["StringValue"],
                attributes[DLQ_ATTRIBUTE_REASON]["StringValue"],
                attributes.get(DLQ_ATTRIBUTE_TRIGGERS, {}).get("StringValue", "")))
        return list(letters)

    def producers_created(self, stream: Stream) -> int:
        return ConformanceSqsTrigger.producers.get(stream.name.rsplit("/", 1)[-1], 0)

    async def consumers_in_group(self, stream: Stream) -> int | None:
        return None  # SQS has no group membership to ask about

    def raw_event_name(self, stream: Stream, index: int) -> str:
        return self.sent[stream.name][index]


@pytest.fixture(params=["standard", "fifo"])
async def harness(request: pytest.FixtureRequest, sqs_endpoint: str) -> AsyncIterator[SqsHarness]:
    async with opened(SqsHarness(sqs_endpoint, fifo=request.param == "fifo")) as harness:
        yield harness

