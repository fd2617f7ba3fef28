"""A definitions file written for Airflow's providers, ported by the import rule, run for real.

``PROVIDER_DEFINITIONS`` is written as for Airflow 3 (``airflow.sdk``, the
Kafka and Amazon providers' shared-stream triggers, ``EmptyOperator``, a
``@dag`` with a ``@task``). The test ports it mechanically - ``airflow.`` ->
``sharedstream.airflow.`` on import lines, nothing else - and runs one real
``sharedstream triggerer`` on it against a Tansu Kafka broker and moto's SQS,
with connections from ``AIRFLOW_CONN_*`` variables (JSON for Kafka, URI for
AWS). One run checks:

* the events stored carry the providers' payloads (the decoded value, the body);
* a subclass overriding ``filter_shared_stream`` sees the raw ``bytes`` values,
  filters them, and its reject sends the record to ``dlq_topic``;
* once offsets are committed past every record and SQS messages deleted,
  every event derived from them is already stored (read while the
  triggerer still runs);
* a missing connection and one with ``enable.auto.commit`` true fail their
  own triggers with one line each, while the other streams run on (the
  connections are read when each stream opens, not when its producer is
  built);
* all of it with traces on (a span per record and message, on stdout).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.harness import Stream
from tests.cli import ROOT, TriggererCli
from tests.kafka.conftest import KafkaHarness
from tests.sqs.conftest import REGION, SqsHarness

PROVIDER_DEFINITIONS = '''\
import json
import os

from airflow.providers.amazon.aws.triggers.shared_stream import SqsSharedStreamTrigger
from airflow.providers.apache.kafka.triggers.shared_stream import KafkaSharedStreamTrigger
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher, dag, task
from airflow.triggers.base import TriggerEvent
from airflow.triggers.shared_stream import reject_shared_stream_event

TOPIC = os.environ["PROVIDER_TEST_TOPIC"]
DLQ = os.environ["PROVIDER_TEST_DLQ"]


class PaidOrders(KafkaSharedStreamTrigger):
    """Fires for paid orders; a value that is not JSON is rejected."""

    async def filter_shared_stream(self, shared_stream):
        async for value in shared_stream:
            try:
                order = json.loads(value)
            except ValueError:
                reject_shared_stream_event("not JSON")
                continue
            if order["status"] == "paid":
                yield TriggerEvent({"id": order["id"], "raw": type(value).__name__})


kafka = {"topics": [TOPIC], "kafka_config_id": "kafka_test", "poll_timeout": 0.2,
         "dlq_topic": DLQ}
orders = Asset("orders", watchers=[
    AssetWatcher("all", trigger=KafkaSharedStreamTrigger(**kafka))])
paid = Asset(name="paid_orders", uri="kafka://orders/paid", watchers=[
    AssetWatcher("paid", trigger=PaidOrders(**kafka))])
messages = Asset(uri="sqs://messages", watchers=[AssetWatcher("all", trigger=(
    SqsSharedStreamTrigger(sqs_queue=os.environ["PROVIDER_TEST_QUEUE"],
                           aws_conn_id="aws_test", wait_time_seconds=1, visibility_timeout=10)))])
broken = Asset("broken", watchers=[
    AssetWatcher("missing", trigger=KafkaSharedStreamTrigger(
        topics=[TOPIC], kafka_config_id="kafka_missing")),
    AssetWatcher("lossy", trigger=KafkaSharedStreamTrigger(
        topics=[TOPIC], kafka_config_id="kafka_lossy")),
])

with DAG(dag_id="ship", schedule=[paid], description="ship paid orders", tags=["shop"],
         default_args={"retries": 2}):
    EmptyOperator(task_id="start") >> [EmptyOperator(task_id="pack")] >> EmptyOperator(
        task_id="end")


@dag(schedule=messages, max_active_runs=1)
def archive():
    @task
    def store(body):
        raise RuntimeError("sharedstream runs no task")

    store("x") >> store("y")


archive()
'''

IMPORT_LINE = re.compile(r"^(\s*(?:from|import)\s+)airflow\.", re.MULTILINE)


def port(source: str) -> str:
    """The one mechanical rule: ``airflow.`` -> ``sharedstream.airflow.`` on import lines."""
    return IMPORT_LINE.sub(r"\1sharedstream.airflow.", source)


RECORDS = [b'{"id": 1, "status": "paid"}', b'{"id": 2, "status": "open"}', b"not json",
           b'{"id": 3, "status": "paid"}']
BODIES = ["hello", "world"]


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within: float,
                     alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert alive(), f"the triggerer exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def connections(bootstrap: str, group: str, sqs_endpoint: str) -> dict[str, str]:
    """``AIRFLOW_CONN_*`` variables: Kafka as JSON (a confluent config dict), AWS as a URI."""
    config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "session.timeout.ms": 2000,
              "heartbeat.interval.ms": 400, "statistics.interval.ms": 0}
    endpoint = sqs_endpoint.replace(":", "%3A").replace("/", "%2F")
    return {
        "AIRFLOW_CONN_KAFKA_TEST": json.dumps({"conn_type": "kafka", "extra": config}),
        "AIRFLOW_CONN_KAFKA_LOSSY": json.dumps(
            {"conn_type": "kafka", "extra": {**config, "enable.auto.commit": "true"}}),
        "AIRFLOW_CONN_AWS_TEST": (f"aws://test:test@/?region_name={REGION}"
                                  f"&endpoint_url={endpoint}"),
    }


@pytest.mark.timeout(90)
async def test_a_provider_style_definitions_file_runs_with_its_imports_ported(
    kafka_bootstrap: str, sqs_endpoint: str, tmp_path: Path,
) -> None:
    definitions = tmp_path / "provider_defs.py"
    definitions.write_text(port(PROVIDER_DEFINITIONS))
    assert "from airflow" not in definitions.read_text()

    kafka, sqs = KafkaHarness(kafka_bootstrap), SqsHarness(sqs_endpoint, fifo=False)
    await kafka.start()
    await sqs.start()
    try:
        topic = await kafka.create_stream()
        assert topic.dead_letter is not None
        queue = await sqs.create_stream(dead_letter=False)
        await kafka.produce(topic, RECORDS)
        await sqs.produce(queue, [body.encode() for body in BODIES])
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PROVIDER_TEST_TOPIC": topic.name,
               "PROVIDER_TEST_DLQ": topic.dead_letter, "PROVIDER_TEST_QUEUE": queue.name,
               **connections(kafka_bootstrap, topic.group, sqs_endpoint),
               # traced: each raw event's carrier is read from the whole message, not from
               # the value or body the providers' streams hand on
               "SHAREDSTREAM__TRACES__ENABLED": "true",
               "SHAREDSTREAM__TRACES__EXPORTER": "console"}
        env.pop("AIRFLOW_CONN_KAFKA_MISSING", None)
        env.pop("SHAREDSTREAM_CONN_KAFKA_MISSING", None)
        cli = TriggererCli(tmp_path, env, definitions)
        cli.run("init", "--path", str(cli.config))
        process = cli.start(0)
        try:
            alive = lambda: process.poll() is None  # noqa: E731
            await eventually(lambda: done(kafka, topic, sqs, queue), "commits and deletes",
                             60, alive)
            # Committed and deleted, so already stored: read while the triggerer still runs.
            check_events(cli, sqs, queue)
            await eventually(lambda: failed_triggers(cli, 2), "the refused triggers", 20, alive)
            process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.wait, 30) == 0, cli.log(0)[-2000:]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        check_events(cli, sqs, queue)  # nothing more, nothing twice after the shutdown
        check_refusals(cli)
        letters = await kafka.dead_letters(topic)
        assert [(letter.value, letter.source, letter.reason) for letter in letters] == [
            (b"not json", f"{topic.name}/0/2", "rejected")]
    finally:
        await kafka.close()
        await sqs.close()


async def done(kafka: KafkaHarness, topic: Stream, sqs: SqsHarness, queue: Stream) -> bool:
    return (await kafka.committed(topic) == len(RECORDS)
            and await sqs.committed(queue) == len(BODIES))


async def failed_triggers(cli: TriggererCli, count: int) -> bool:
    listed = json.loads(await asyncio.to_thread(cli.run, "triggers", "list", "--json"))
    return sum(1 for t in listed if t["state"] == "failed") == count


def check_events(cli: TriggererCli, sqs: SqsHarness, queue: Stream) -> None:
    """Every record and message stored as the providers' payloads, once per watcher."""
    events: list[dict[str, Any]] = json.loads(
        cli.run("events", "list", "--json", "--limit", "1000"))
    stored = Counter((asset, json.dumps(e["payload"], sort_keys=True))
                     for e in events for asset in e["assets"])
    wanted = Counter(
        [("orders", json.dumps(value.decode())) for value in RECORDS]
        + [("paid_orders", json.dumps({"id": i, "raw": "bytes"}, sort_keys=True))
           for i in (1, 3)]
        + [("sqs://messages", json.dumps(body)) for body in BODIES])
    assert stored == wanted
    assert len(sqs.sent[queue.name]) == len(BODIES)
    ship = json.loads(cli.run("runs", "list", "--json", "--dag", "ship"))
    archive = json.loads(cli.run("runs", "list", "--json", "--dag", "archive"))
    assert ship
    assert archive


def check_refusals(cli: TriggererCli) -> None:
    """The two refused triggers: failed with one line each, said once in the log."""
    listed = json.loads(cli.run("triggers", "list", "--json"))
    errors = sorted(str(t["last_error"]) for t in listed if t["state"] == "failed")
    assert len(errors) == 2, listed
    assert "connection 'kafka_missing' not found" in errors[0]
    assert "must set enable.auto.commit=false" in errors[1]
    assert all("\n" not in error for error in errors)
    log = cli.log(0)
    assert "Traceback" not in log
    assert any("kafka_missing" in line for line in log.splitlines())
    assert any("enable.auto.commit" in line for line in log.splitlines())
    running = [t for t in listed if t["state"] != "failed"]
    assert len(running) == 3, listed
