"""A DAG file written for Airflow 3.4 with ``MessageQueueTrigger``, ported by imports, run for real.

``AIRFLOW_DAG`` uses common-messaging's ``MessageQueueTrigger`` as Airflow's
event-driven scheduling guide does: ``scheme="kafka"`` with an
``apply_function`` (a dotted path into a module beside the DAG file, as in
Airflow's DAG folder), the same topic watched again without one and once
more in common-messaging 2.1's spelling (``queue="kafka://..."``), and
``scheme="sqs"`` with a literal filter. The test ports it by the import rule
alone and runs one real ``sharedstream triggerer`` on it against a Tansu
broker and moto's SQS, with connections from ``AIRFLOW_CONN_*`` variables.

It checks what a user would notice:

* each watcher's events carry the payloads Airflow's provider triggers fire
  (``apply_function``'s result; the value as text; SQS's ``message_batch``);
* the three Kafka watchers share one consumer: each of them sees every
  record of the one-partition topic (one consumer per watcher in one group
  would split the partition between them, and two would see nothing);
* once the offsets are committed and the messages deleted, every event is
  stored, and nothing is stored twice after a restart.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.harness import Stream
from tests.airflow.test_provider_watchers import connections, port
from tests.cli import ROOT, TriggererCli
from tests.kafka.conftest import KafkaHarness
from tests.sqs.conftest import SqsHarness

AIRFLOW_DAG = '''\
import os

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

TOPIC = os.environ["MQ_TEST_TOPIC"]

paid = MessageQueueTrigger(scheme="kafka", topics=[TOPIC], kafka_config_id="kafka_test",
                           apply_function="mq_functions.paid_order",
                           apply_function_kwargs={"status": "paid"}, poll_timeout=0.2)
every = MessageQueueTrigger(scheme="kafka", topics=[TOPIC], kafka_config_id="kafka_test",
                            poll_timeout=0.2)
old_spelling = MessageQueueTrigger(queue=f"kafka://ignored:9092/{TOPIC}",
                                   kafka_config_id="kafka_test", poll_timeout=0.2,
                                   apply_function="mq_functions.order_id")
hello = MessageQueueTrigger(scheme="sqs", sqs_queue=os.environ["MQ_TEST_QUEUE"],
                            aws_conn_id="aws_test", wait_time_seconds=1,
                            message_filtering="literal", message_filtering_match_values=["hello"])

orders = Asset("orders", watchers=[AssetWatcher("paid", trigger=paid),
                                   AssetWatcher("every", trigger=every)])
ids = Asset("order_ids", watchers=[AssetWatcher("ids", trigger=old_spelling)])
greetings = Asset("greetings", watchers=[AssetWatcher("hello", trigger=hello)])

with DAG(dag_id="ship", schedule=[orders]):
    pass

with DAG(dag_id="greet", schedule=greetings):
    pass
'''

FUNCTIONS = '''\
import json


def paid_order(message, status):
    order = json.loads(message.value())
    if order["status"] == status:
        return {"id": order["id"], "topic": message.topic(), "offset": message.offset()}
    return None


def order_id(message):
    return json.loads(message.value())["id"]
'''

RECORDS = [b'{"id": 1, "status": "paid"}', b'{"id": 2, "status": "open"}',
           b'{"id": 3, "status": "paid"}']
BODIES = ["hello", "world", "hello"]


@pytest.mark.timeout(120)
async def test_a_dag_file_with_message_queue_triggers_runs_with_its_imports_ported(
    kafka_bootstrap: str, sqs_endpoint: str, tmp_path: Path,
) -> None:
    definitions = tmp_path / "mq_dag.py"
    definitions.write_text(port(AIRFLOW_DAG))
    assert "from airflow" not in definitions.read_text()
    (tmp_path / "mq_functions.py").write_text(FUNCTIONS)

    kafka, sqs = KafkaHarness(kafka_bootstrap), SqsHarness(sqs_endpoint, fifo=False)
    await kafka.start()
    await sqs.start()
    try:
        topic = await kafka.create_stream()
        queue = await sqs.create_stream(dead_letter=False)
        await kafka.produce(topic, RECORDS)
        await sqs.produce(queue, [body.encode() for body in BODIES])
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MQ_TEST_TOPIC": topic.name,
               "MQ_TEST_QUEUE": queue.name,
               **connections(kafka_bootstrap, topic.group, sqs_endpoint)}
        cli = TriggererCli(tmp_path, env, definitions)
        cli.run("init", "--path", str(cli.config))
        for run in range(2):  # the second run: nothing is stored twice
            with cli.running(run) as process:
                await cli.until(run, process, lambda: done(kafka, topic, sqs, queue), 60)
                check_events(cli, topic)  # committed and deleted, so already stored
            assert "Traceback" not in cli.log(run)
        check_events(cli, topic)
    finally:
        await kafka.close()
        await sqs.close()


async def done(kafka: KafkaHarness, topic: Stream, sqs: SqsHarness, queue: Stream) -> bool:
    return (await kafka.committed(topic) == len(RECORDS)
            and await sqs.committed(queue) == len(BODIES))


def check_events(cli: TriggererCli, topic: Stream) -> None:
    """Every watcher's events, with the payloads Airflow's provider triggers fire, once each."""
    events: list[dict[str, Any]] = json.loads(
        cli.run("events", "list", "--json", "--limit", "1000"))
    stored = Counter((asset, json.dumps(e["payload"], sort_keys=True))
                     for e in events for asset in e["assets"]
                     if asset != "greetings")
    wanted = Counter(
        [("orders", json.dumps({"id": i, "offset": i - 1, "topic": topic.name}, sort_keys=True))
         for i in (1, 3)]
        + [("orders", json.dumps(value.decode())) for value in RECORDS]
        + [("order_ids", json.dumps(i)) for i in (1, 2, 3)])
    assert stored == wanted
    greetings = [e["payload"] for e in events if e["assets"] == ["greetings"]]
    assert [g["status"] for g in greetings] == ["success", "success"]
    assert [[m["Body"] for m in g["message_batch"]] for g in greetings] == [["hello"], ["hello"]]
    assert {m["MessageId"] for g in greetings for m in g["message_batch"]}.isdisjoint({""})
    assert json.loads(cli.run("runs", "list", "--json", "--dag", "ship"))
    assert len(json.loads(cli.run("runs", "list", "--json", "--dag", "greet"))) == 2
