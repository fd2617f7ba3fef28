"""``deadletters list`` (and bytes in ``events list``) through the real CLI on the real store."""

from __future__ import annotations

import base64

from sharedstream.engine.producer import DeadLetter
from sharedstream.runtime.serde import pack_event_payload
from sharedstream.store import PendingEvent, SqliteStore, TriggerSpec, WatcherSpec
from sharedstream.store.base import DEAD_LETTER_PAYLOAD_LIMIT
from tests.runtime.conftest import Deployment

TOO_BIG = b'{"id": 42, "lines": [' + b'"sku-1", ' * 400_000 + b'"sku-2"]}'  # ~3.6 MB
LETTERS = [
    DeadLetter("kafka orders", "orders/0/42", "rejected by triggers 3, 7; dead-letter topic"
               " refused it: MessageSizeTooLargeError", ("3", "7"), TOO_BIG,
               (("trace-id", b"\x00\xfeab"), ("attempt", b"1"))),
    DeadLetter("sqs refunds", "5f0c-11", "poison: 5 failed deliveries; SendMessage refused it",
               ("2",), b"\xff\xfe binary\tbody\n"),
    DeadLetter("kafka orders", "orders/1/7", "rejected by trigger 3; dead-letter topic refused"
               " it: TopicAuthorizationFailed", ("3",), b'{"id": 7}'),
]


def keep(d: Deployment) -> None:
    with SqliteStore(d.db) as store:
        store.migrate()
        assert [store.add_dead_letter(letter) for letter in LETTERS] == [True, True, True]
        assert store.add_dead_letter(LETTERS[0]) is False  # stored again after a crash


def test_an_empty_store_lists_like_the_other_listings(deployment: Deployment) -> None:
    d = deployment
    assert d.cli("deadletters", "list").stdout == d.cli("runs", "list").stdout == "(none)\n"
    assert d.json("deadletters", "list") == []


def test_the_table_shows_every_letter_newest_first(deployment: Deployment) -> None:
    d = deployment
    keep(d)
    header, *rows = d.cli("deadletters", "list").stdout.splitlines()
    assert header.split() == [
        "ID", "CREATED_AT", "STREAM", "SOURCE", "REASON", "TRIGGERS", "REDRIVES", "SIZE",
        "PREVIEW",
    ]
    assert [row.split()[0] for row in rows] == ["3", "2", "1"]
    newest, binary, big = rows
    assert "orders/1/7" in newest
    assert '["3"]' in newest
    assert newest.endswith('9                    {"id": 7}')  # size, then the preview
    assert "sqs refunds" in binary
    assert binary.endswith(".. binary body")  # undecodable bytes and controls are dots/spaces
    assert f"{len(TOO_BIG)} (truncated)" in big
    assert '["3", "7"]' in big
    assert big.endswith("…")  # long cells are cut, as in the other listings
    assert '{"id": 42, "lines": ["sku-1"' in big

    only = d.cli("deadletters", "list", "--stream", "kafka orders", "--limit", "1").stdout
    assert [line.split()[0] for line in only.splitlines()] == ["ID", "3"]


def test_json_has_whole_records_with_base64_bytes(deployment: Deployment) -> None:
    d = deployment
    keep(d)
    records = d.json("deadletters", "list")
    assert [r["source"] for r in records] == ["orders/1/7", "5f0c-11", "orders/0/42"]
    big = records[2]
    assert set(big) == {
        "id", "created_at", "stream", "source", "reason", "triggers", "payload_size",
        "truncated", "payload", "headers", "redrives", "redriven_at",
    }
    assert (big["redrives"], big["redriven_at"]) == (0, None)
    assert (big["id"], big["stream"], big["triggers"]) == (1, "kafka orders", ["3", "7"])
    assert big["reason"] == LETTERS[0].reason
    assert big["created_at"].endswith("+00:00")
    assert (big["payload_size"], big["truncated"]) == (len(TOO_BIG), True)
    assert base64.b64decode(big["payload"]) == TOO_BIG[:DEAD_LETTER_PAYLOAD_LIMIT]
    assert [(name, base64.b64decode(value)) for name, value in big["headers"]] == [
        ("trace-id", b"\x00\xfeab"), ("attempt", b"1"),
    ]
    binary = records[1]
    assert base64.b64decode(binary["payload"]) == LETTERS[1].payload
    assert (binary["payload_size"], binary["truncated"], binary["headers"]) == (15, False, [])

    only = d.json("deadletters", "list", "--stream", "sqs refunds")
    assert [r["source"] for r in only] == ["5f0c-11"]


def test_bytes_in_an_event_payload_are_base64_in_json_and_text_in_the_table(
    deployment: Deployment,
) -> None:
    # A Kafka record's key and header values are bytes in the stored payload.
    d = deployment
    payload = {"value": {"id": 7}, "key": b"order-7", "headers": [("trace", b"\x00\xfe")]}
    with SqliteStore(d.db) as store:
        store.migrate()
        (trigger_id,) = store.sync_definitions(
            [TriggerSpec("fp", "pkg.Trigger", b"kw")], [WatcherSpec("orders", "all", "fp")], []
        ).values()
        store.write_events([PendingEvent(trigger_id, "k", pack_event_payload(payload))])
    (event,) = d.json("events", "list")
    assert event["payload"]["key"] == base64.b64encode(b"order-7").decode()
    assert event["payload"]["headers"] == [["trace", base64.b64encode(b"\x00\xfe").decode()]]
    assert '"key": "order-7"' in d.cli("events", "list").stdout
