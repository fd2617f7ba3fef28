"""The SQS producer's broker backlog: the queue's counts and its dead-letter queue's, on moto.

Real parts: moto's SQS server (the testing kit's), aiobotocore, and the
producer's own poll. The messages the poll receives are never advanced, so
each is counted once, as visible or in flight; the dead-letter queue is the
producer's ``dead_letter_queue`` or, without one, the queue's
``RedrivePolicy`` target.
"""

from __future__ import annotations

import json
import uuid

from sharedstream.producers.sqs import SqsSettings, SqsSharedStreamProducer
from sharedstream.testing.harness import Stream, opened
from sharedstream.testing.runner import eventually_async
from tests.sqs.conftest import CREDENTIALS, REGION, SqsHarness
from tests.sqs.test_connected import polling


def producer(endpoint: str, url: str, dead_letter_queue: str | None = None,
             ) -> SqsSharedStreamProducer:
    return SqsSharedStreamProducer(SqsSettings(
        queue=url, region_name=REGION, endpoint_url=endpoint, credentials=CREDENTIALS,
        dead_letter_queue=dead_letter_queue, wait_time_seconds=1, receive_concurrency=1))


async def test_the_queue_counts_and_the_configured_dead_letter_queue(sqs_endpoint: str) -> None:
    name = f"backlog-{uuid.uuid4().hex[:8]}"
    async with opened(SqsHarness(sqs_endpoint, fifo=False)) as harness:
        url = await harness.create_queue(name)
        dlq = await harness.create_queue(f"{name}-dlq")
        await harness.produce(Stream(url, None, ""), [b"%d" % i for i in range(5)])
        await harness.produce(Stream(dlq, None, ""), [b"dead", b"letters"])
        sqs = producer(sqs_endpoint, url, dlq)
        async with polling(sqs):
            async def backlog() -> tuple[int, int] | None:
                try:
                    found = await sqs.broker_backlog()
                except Exception:  # noqa: BLE001 - not connected yet: ask again
                    return None
                counts = found[name]
                return counts["visible"] + counts["in_flight"], counts["dead_letter"]
            await eventually_async(backlog, (5, 2), within=20,
                                   what="five messages waiting or in flight, two dead")
            assert set(await sqs.broker_backlog()) == {name}  # one lane: the queue
        assert sqs.calls["GetQueueAttributes"] >= 2  # counted like every other call


async def test_the_redrive_policy_names_the_dead_letter_queue_when_the_producer_has_none(
    sqs_endpoint: str,
) -> None:
    name = f"redrive-{uuid.uuid4().hex[:8]}"
    async with opened(SqsHarness(sqs_endpoint, fifo=False)) as harness:
        dlq = await harness.create_queue(f"{name}-dlq")
        arn = (await harness.client.get_queue_attributes(
            QueueUrl=dlq, AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
        url = await harness.create_queue(name, RedrivePolicy=json.dumps(
            {"deadLetterTargetArn": arn, "maxReceiveCount": 5}))
        plain = await harness.create_queue(f"{name}-plain")
        await harness.produce(Stream(dlq, None, ""), [b"one", b"two", b"three"])
        redriven, alone = producer(sqs_endpoint, url), producer(sqs_endpoint, plain)
        async with polling(redriven), polling(alone):
            async def backlogs() -> tuple[object, object] | None:
                try:
                    return (await redriven.broker_backlog(), await alone.broker_backlog())
                except Exception:  # noqa: BLE001 - not connected yet: ask again
                    return None
            await eventually_async(backlogs, (
                {name: {"visible": 0, "in_flight": 0, "dead_letter": 3}},
                {f"{name}-plain": {"visible": 0, "in_flight": 0}},  # no dead-letter queue
            ), within=20, what="the redrive target's depth; none without one")
