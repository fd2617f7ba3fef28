"""Replaying the dead letters one watcher caused, through it alone (issue 33), on SQS.

The real ``sharedstream triggerer`` (a subprocess, its store a SQLite
file) runs ``replay_dead_letters_defs.py``: two watchers of one queue on
the session's moto server, through one receiver, with no dead-letter queue,
so what a watcher rejects is kept in the store's ``dead_letters`` table.
``audit/all`` rejects three messages (its bug), ``orders/all`` one. Once
``audit/all`` is fixed (the triggerer restarted with its variable
emptied), ``sharedstream watchers replay audit/all --dead-letters`` feeds
its three letters to it alone: three new events, under the keys and with
the payloads the live messages would have given, three DAG runs for it and
nothing for ``orders/all`` (whose own letter is not replayed); a second
replay stores nothing. The rebuilt raw event itself is compared with the
live one in ``test_a_rebuilt_letter_is_the_message_the_filter_got``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from sharedstream.engine.producer import DeadLetter
from sharedstream.producers._sqs_types import SqsMessage, attribute_bytes
from sharedstream.triggers.sqs import SqsSharedStreamTrigger
from tests.cli import ROOT, TriggererCli
from tests.dead_letter_replay_kit import counts, events, replay, trigger_of
from tests.sqs.conftest import CREDENTIALS, REGION

aiobotocore_session: Any = pytest.importorskip("aiobotocore.session")

DEFINITIONS = Path(__file__).with_name("replay_dead_letters_defs.py")
IDS = range(12)
AUDIT_REJECTS = (1, 5, 9)
ORDERS_REJECTS = (4,)
CITIES = ("Zürich", "Lyon", "Porto")


async def send(client: Any, url: str) -> dict[int, str]:
    """Messages ``{"id": i}`` with a ``city`` attribute; their message ids by ``id``."""
    sent: dict[int, str] = {}
    for start in range(0, len(IDS), 10):
        chunk = IDS[start:start + 10]
        response = await client.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": json.dumps({"id": i}),
             "MessageAttributes": {"city": {"DataType": "String",
                                            "StringValue": CITIES[i % len(CITIES)]}}}
            for i in chunk])
        assert not response.get("Failed"), response
        sent.update({int(ok["Id"]): ok["MessageId"] for ok in response["Successful"]})
    return sent


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(240)
async def test_a_fixed_watcher_gets_its_dead_letters_and_the_other_nothing(
    sqs_endpoint: str, tmp_path: Path,
) -> None:
    session = aiobotocore_session.get_session()
    async with session.create_client("sqs", region_name=REGION, endpoint_url=sqs_endpoint,
                                     **CREDENTIALS) as client:
        url = (await client.create_queue(QueueName=f"dlr-{uuid.uuid4().hex[:10]}"))["QueueUrl"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DLR_ENDPOINT": sqs_endpoint,
               "DLR_QUEUE": url, "SHAREDSTREAM__DISPATCH__ENABLED": "false",
               "ORDERS_REJECT": ",".join(map(str, ORDERS_REJECTS)),
               "AUDIT_REJECT": ",".join(map(str, AUDIT_REJECTS))}
        buggy = TriggererCli(tmp_path, env, DEFINITIONS)
        buggy.run("init", "--path", str(buggy.config))
        database = tmp_path / "sharedstream.db"
        sent = await send(client, url)

        live = ({"orders": len(IDS) - len(ORDERS_REJECTS),
                 "audit": len(IDS) - len(AUDIT_REJECTS)},
                {"on_orders": len(IDS) - len(ORDERS_REJECTS),
                 "on_audit": len(IDS) - len(AUDIT_REJECTS)},
                len(ORDERS_REJECTS) + len(AUDIT_REJECTS))
        with buggy.running(0) as process:
            async def settled() -> bool:
                return database.exists() and counts(database) == live
            await buggy.until(0, process, settled)

        fixed = TriggererCli(tmp_path, {**env, "AUDIT_REJECT": ""}, DEFINITIONS)
        with fixed.running(1, log_level="INFO") as process:
            result = await asyncio.to_thread(replay, fixed, "audit/all", "--dead-letters")
            assert result.returncode == 0, (result.stdout, result.stderr, fixed.log(1))
            last = result.stdout.strip().splitlines()[-1]
            # the span of audit's letters may hold orders' letter too: counted, not fed
            assert re.fullmatch(r"replay 1 \(audit/all\): done, ([34]) of \1 messages \(100%\), "
                                r"3 new events", last), result.stdout
            per_asset, runs, letters = counts(database)
            assert per_asset == {"orders": len(IDS) - len(ORDERS_REJECTS), "audit": len(IDS)}
            assert runs == {"on_orders": len(IDS) - len(ORDERS_REJECTS), "on_audit": len(IDS)}
            assert letters == live[2], "a replay leaves the kept letters as they are"

            stored = events(database)
            audit, orders = trigger_of(database, "audit"), trigger_of(database, "orders")
            # the live keys: <trigger>/<message id>#0, so nothing is stored twice
            assert set(stored["audit"]) == {f"{audit}/{sent[i]}#0" for i in IDS}
            for i in AUDIT_REJECTS:  # what the fixed watcher got is what the other got live
                assert stored["audit"][f"{audit}/{sent[i]}#0"] == stored["orders"][
                    f"{orders}/{sent[i]}#0"] == {"id": i, "city": CITIES[i % len(CITIES)],
                                                  "message_id": sent[i]}

            again = await asyncio.to_thread(replay, fixed, "audit/all", "--dead-letters")
            assert again.returncode == 0, (again.stdout, again.stderr)
            assert again.stdout.strip().splitlines()[-1].endswith(
                "0 new events, 3 already stored"), again.stdout
            assert counts(database)[:2] == (per_asset, runs)
            assert "replay done" in fixed.log(1)

            # orders/all still rejects its letter: counted, nothing stored or kept again
            still = await asyncio.to_thread(replay, fixed, "orders/all", "--dead-letters")
            assert still.returncode == 0, (still.stdout, still.stderr)
            assert still.stdout.strip().splitlines()[-1] == (
                "replay 3 (orders/all): done, 1 of 1 messages (100%), 0 new events, "
                "1 rejected"), still.stdout
            assert counts(database) == (per_asset, runs, live[2])


def test_the_request_takes_from_or_dead_letters_not_both(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = TriggererCli(tmp_path, env, DEFINITIONS)
    cli.run("init", "--path", str(cli.config))
    neither = replay(cli, "audit/all")
    both = replay(cli, "audit/all", "--from", "1h", "--dead-letters")
    with_to = replay(cli, "audit/all", "--dead-letters", "--to", "1h")
    assert (neither.returncode, both.returncode, with_to.returncode) == (2, 2, 2)
    assert "one of the arguments --from --dead-letters is required" in neither.stderr
    assert "argument --dead-letters: not allowed with argument --from" in both.stderr
    assert with_to.stderr == ("sharedstream: error: --dead-letters replays the watcher's dead "
                              "letters: it takes no --from or --to\n")


async def test_a_rebuilt_letter_is_the_message_the_filter_got(sqs_endpoint: str) -> None:
    session = aiobotocore_session.get_session()
    async with session.create_client("sqs", region_name=REGION, endpoint_url=sqs_endpoint,
                                     **CREDENTIALS) as client:
        url = (await client.create_queue(QueueName=f"dlr-{uuid.uuid4().hex[:10]}"))["QueueUrl"]
        await client.send_message(QueueUrl=url, MessageBody='{"id": 7, "note": "Zürich"}',
                                  MessageAttributes={
                                      "city": {"DataType": "String", "StringValue": "Zürich"},
                                      "amount": {"DataType": "Number", "StringValue": "12.5"},
                                      "blob": {"DataType": "Binary",
                                               "BinaryValue": b"\xff\x00"}})
        raw = (await client.receive_message(
            QueueUrl=url, MessageAttributeNames=["All"], AttributeNames=["All"]))["Messages"][0]
    live = SqsMessage(url, raw)
    kwargs = SqsSharedStreamTrigger(queue=url, endpoint_url=sqs_endpoint, region_name=REGION,
                                    credentials=dict(CREDENTIALS)).serialize()[1]
    producer = SqsSharedStreamTrigger.create_shared_stream_producer(kwargs)
    # what the producer's dead-letter path keeps of it (see _sqs_deadletters)
    letter = DeadLetter(stream="sqs q", source=live.message_id, reason="rejected", triggers=("3",),
                        payload=live.body.encode(),
                        headers=tuple((name, attribute_bytes(value))
                                      for name, value in live.raw_attributes.items()))

    rebuilt = producer.dead_letter_event(letter)

    assert rebuilt is not None
    message, payload = rebuilt
    assert type(message) is SqsMessage
    assert (message.message_id, message.body, message.attributes, message.queue) == (
        live.message_id, live.body, live.attributes, url)
    assert producer.raw_event_name(payload) == live.message_id
    assert producer.raw_event_fingerprint(payload) is None
    assert message.decoded("json", json.loads) == {"id": 7, "note": "Zürich"}
    not_text = DeadLetter("sqs q", "x", "rejected", ("3",), b"\xff\xfe")
    assert producer.dead_letter_event(not_text) is None
