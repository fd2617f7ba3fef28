"""A real triggerer whose Kafka watchers get their broker from an Airflow-style connection.

The connection is an ``AIRFLOW_CONN_KAFKA_E2E`` environment variable of the
triggerer process (JSON form, librdkafka names); nothing about the broker is
in the definitions. A watcher naming a connection nobody defined is marked
failed with the one-line ``ConnectionNotFound`` message, and the others run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from sharedstream.testing.harness import Stream
from tests.cli import ROOT, TriggererCli
from tests.kafka.conftest import KafkaHarness

DEFS = Path(__file__).with_name("connection_defs.py")
COUNT = 20


def connection_cli(harness: KafkaHarness, stream: Stream, workdir: Path) -> TriggererCli:
    """The CLI in ``workdir`` (initialised) on ``connection_defs.py``, the watchers' broker in
    ``AIRFLOW_CONN_KAFKA_E2E`` (JSON form, librdkafka names), their topic ``stream``'s."""
    connection = {"conn_type": "kafka", "extra": {
        "bootstrap.servers": harness.bootstrap, "group.id": stream.group,
        "session.timeout.ms": 2000, "heartbeat.interval.ms": 400}}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONN_TEST_TOPIC": stream.name,
           "AIRFLOW_CONN_KAFKA_E2E": json.dumps(connection)}
    cli = TriggererCli(workdir, env, DEFS)
    cli.run("init", "--path", str(cli.config))
    return cli


async def test_watchers_run_on_a_connection_from_the_environment(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    stream = await harness.create_stream(dead_letter=False)
    cli = connection_cli(harness, stream, tmp_path)
    kinds = ["order" if i % 2 else "refund" for i in range(COUNT)]
    await harness.produce(stream, [json.dumps({"id": i, "kind": k}).encode()
                                   for i, k in enumerate(kinds)])
    async def all_committed() -> bool:
        return await harness.committed(stream) >= COUNT

    with cli.running(0) as process:
        await cli.until(0, process, all_committed)

    events: list[dict[str, Any]] = json.loads(cli.run("events", "list", "--json"))
    assert Counter(asset for e in events for asset in e["assets"]) == {
        "orders": COUNT // 2, "refunds": COUNT // 2}
    triggers = {t["watchers"][0]: t for t in json.loads(cli.run("triggers", "list", "--json"))}
    assert triggers["orders/all"]["state"] == triggers["refunds/all"]["state"] == "active"
    lost = triggers["lost/all"]
    message = ("connection 'no_such_conn' not found: no environment variable "
               "SHAREDSTREAM_CONN_NO_SUCH_CONN or AIRFLOW_CONN_NO_SUCH_CONN, and no "
               f"[connections.no_such_conn] table in config file {cli.config}")
    assert lost["state"] == "failed"
    assert lost["last_error"] == f"ConnectionNotFound: {message}"
    assert message in cli.log(0)
