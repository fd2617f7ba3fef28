"""A real triggerer whose SQS watchers get keys, region and endpoint from a connection.

The triggerer process has no AWS credentials of its own (no ``AWS_*``
variables, no credentials or config file, no instance metadata): the keys
can only come from the ``AIRFLOW_CONN_AWS_E2E`` connection, so a stored
event proves they did.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sharedstream.testing.harness import opened
from tests.cli import ROOT, TriggererCli
from tests.sqs.conftest import SqsHarness

DEFS = Path(__file__).with_name("connection_defs.py")
COUNT = 10


def no_aws_credentials(tmp_path: Path) -> dict[str, str]:
    """``os.environ`` without any way for botocore to find credentials by itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    missing = str(tmp_path / "no-such-aws-file")
    return {**env, "AWS_SHARED_CREDENTIALS_FILE": missing, "AWS_CONFIG_FILE": missing,
            "AWS_EC2_METADATA_DISABLED": "true"}


async def test_watchers_take_credentials_from_the_connection(
    sqs_endpoint: str, tmp_path: Path,
) -> None:
    async with opened(SqsHarness(sqs_endpoint, fifo=False)) as harness:
        stream = await harness.create_stream(dead_letter=False)
        kinds = ["order" if i % 2 else "refund" for i in range(COUNT)]
        await harness.produce(stream, [json.dumps({"id": i, "kind": k}).encode()
                                       for i, k in enumerate(kinds)])
        uri = (f"aws://test-key:test%2Fsecret@/?region_name=us-east-1&"
               f"endpoint_url={quote(sqs_endpoint, safe='')}")
        env = {**no_aws_credentials(tmp_path), "PYTHONPATH": str(ROOT),
               "CONN_TEST_QUEUE": stream.name, "AIRFLOW_CONN_AWS_E2E": uri}
        cli = TriggererCli(tmp_path, env, DEFS)
        cli.run("init", "--path", str(cli.config))
        process = cli.start(0)
        try:
            deadline = time.monotonic() + 60
            events: list[dict[str, Any]] = []
            while len(events) < COUNT:
                assert process.poll() is None, cli.log(0)
                assert time.monotonic() < deadline, cli.log(0)
                await asyncio.sleep(0.3)
                events = json.loads(cli.run("events", "list", "--json"))
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, cli.log(0)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert Counter(asset for e in events for asset in e["assets"]) == {
            "orders": COUNT // 2, "refunds": COUNT // 2}
        attributes = await harness.client.get_queue_attributes(
            QueueUrl=stream.name, AttributeNames=["ApproximateNumberOfMessages",
                                                  "ApproximateNumberOfMessagesNotVisible"])
        assert set(attributes["Attributes"].values()) == {"0"}  # every message deleted
