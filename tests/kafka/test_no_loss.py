"""No event lost, none stored twice, only the intended records dead-lettered (issue 11).

Each case runs the real ``sharedstream triggerer`` (a subprocess, its store
a real SQLite file) over ``no_loss_defs.py``: two watchers of one
single-partition Tansu topic through one shared consumer, ``plain`` (the
stock Kafka trigger) and ``custom`` (a subclass, made slow or poisoned per
case). The case produces records, applies its fault, waits until the group
has committed every offset (failing on a stall), stops the triggerer and
then accounts exactly (``tests.chaos_accounting``): per watcher and per
offset, the events in the store against the records it must store; per
offset, the dead letters in the DLQ topic and in the store's
``dead_letters`` table against the records meant to be dead-lettered.
What is not Kafka (the triggerer, the verdict, the store faults, the
``custom`` watcher) is ``tests.no_loss_kit``, shared with the SQS suite.

Every case also asserts the final committed offset (the number of records),
a clean exit on SIGTERM and the triggerer's peak RSS.

* A - a slow watcher (1 ms per record, 3,000 records): back-pressure, not failure.
* B - a watcher raising on one record: that record alone is dead-lettered
  (``max_redeliveries``), after which the watcher moves on.
* C1/C2 - the store stalls longer than the ack timeout (a lock held by
  another process; a full filesystem: the store on a small tmpfs filled
  with a ballast file), twice, while records keep coming, then recovers.
* D - fuzzed input (seeded: ``SHAREDSTREAM_NOLOSS_SEED`` replays a run):
  what cannot be decoded or stored is rejected, dead-lettered once.
* E - a dead letter the broker refuses (3 MB, over the DLQ producer's
  request limit) goes to the store's ``dead_letters`` table instead.
"""

from __future__ import annotations

import functools
import json
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sharedstream.producers.kafka import (
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_TOPIC,
)
from sharedstream.testing.harness import Stream
from tests.chaos_accounting import IN_STORE, DeadLetterRecord, ExpectedDeadLetter
from tests.kafka.conftest import KafkaHarness, aiokafka, aiokafka_admin
from tests.no_loss_kit import (
    REJECTED,
    NoLossRun,
    broker_dead_letter,
    fuzzed_case,
    nested_json,
    store_full_case,
    store_locked_case,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

DEFS = Path(__file__).with_name("no_loss_defs.py")
MAX_REQUEST = 8 * 2**20
"""The test producer's request limit: the source topic takes records of a few MB."""


@dataclass(frozen=True)
class Record:
    """One record to produce, and what must become of it.

    ``rejected``: it cannot be decoded, or its event payload cannot be
    stored; it must be dead-lettered once (reason ``rejected``) and stored by
    nobody. Otherwise every watcher must store exactly one event for it
    (both watchers match every record that decodes).
    """

    value: bytes | None
    label: str = "valid"
    rejected: bool = False
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def plain_records(start: int, count: int) -> list[Record]:
    return [Record(json.dumps({"id": i}).encode()) for i in range(start, start + count)]


class KafkaRun(NoLossRun[Record]):
    """One case on Kafka: a single-partition topic and its DLQ topic, settled when committed."""

    PLAIN = "sharedstream.triggers.kafka.KafkaSharedStreamTrigger"
    NOUN = "records"
    SETTLED = "committed"
    WITHIN = 40.0
    RSS_BOUND = 600 * 2**20
    POLL = 0.1
    RATE = 400
    WARM_UP = 500
    BURST = 1500

    def __init__(self, harness: KafkaHarness, workdir: Path, *, db_url: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        name = f"noloss-{uuid.uuid4().hex[:10]}"
        self.harness = harness
        self.stream = Stream(name=name, dead_letter=f"{name}.dlq", group=f"g-{name}")
        super().__init__(workdir, DEFS, db_url=db_url, env=env, broker_env={
            "NOLOSS_BOOTSTRAP": harness.bootstrap,
            "NOLOSS_TOPIC": self.stream.name,
            "NOLOSS_GROUP": self.stream.group,
        })
        self.client: Any = None

    async def setup(self, *, dlq_max_message_bytes: int | None = None) -> None:
        """Create the topics and the store; start a producer for records of a few MB."""
        configs = ({"max.message.bytes": str(dlq_max_message_bytes)}
                   if dlq_max_message_bytes else {})
        response = await self.harness.admin.create_topics([
            aiokafka_admin.NewTopic(self.stream.name, num_partitions=1, replication_factor=1),
            aiokafka_admin.NewTopic(self.stream.dead_letter, num_partitions=1,
                                    replication_factor=1, topic_configs=configs),
        ])
        assert not [e for _, e, *_ in response.topic_errors if e], response
        self.client = aiokafka.AIOKafkaProducer(
            bootstrap_servers=self.harness.bootstrap, enable_idempotence=False,
            max_request_size=MAX_REQUEST,
        )
        await self.client.start()
        await self.init_store()

    async def close(self) -> None:
        await super().close()
        if self.client is not None:
            await self.client.stop()

    async def send(self, items: Sequence[Record]) -> None:
        """Produce ``items`` in order to partition 0; remember the offset of each."""
        sent = [(record, await self.client.send(self.stream.name, record.value, key=record.key,
                                                partition=0, headers=list(record.headers)))
                for record in items]
        for record, future in sent:
            metadata = await future
            self.produced[self.source(metadata.offset)] = record

    def plain(self, start: int, count: int) -> list[Record]:
        return plain_records(start, count)

    def source(self, offset: int) -> str:
        return f"{self.stream.name}/0/{offset}"

    async def settled(self) -> int:
        return await self.harness.committed(self.stream)

    def rejected_letter(self, item: Record, where: str, roles: tuple[int, int],
                        ) -> ExpectedDeadLetter:
        return ExpectedDeadLetter(REJECTED, where=where)

    async def dead_letters_in_broker(self) -> tuple[list[DeadLetterRecord], list[str]]:
        assert self.stream.dead_letter is not None
        letters = []
        for record in await self.harness.read_all(self.stream.dead_letter, within=3.0):
            headers = {name: value.decode(errors="replace") for name, value in record.headers}
            source = "/".join(headers.get(h, "?") for h in (
                DLQ_HEADER_TOPIC, DLQ_HEADER_PARTITION, DLQ_HEADER_OFFSET))
            letters.append(broker_dead_letter(
                source, headers, DLQ_HEADER_REASON,
                payload_size=None if record.value is None else len(record.value)))
        return letters, []

    async def broker_problems(self) -> list[str]:
        committed = await self.settled()
        if committed != len(self.produced):
            return [f"final committed offset {committed}, expected {len(self.produced)}"]
        return []


# -- A: a slow watcher ----------------------------------------------------------------------


async def test_a_slow_watcher_is_back_pressure_not_loss(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    async with KafkaRun(harness, tmp_path, env={"NOLOSS_DELAY": "0.001"}) as run:
        await run.setup()
        await run.send(plain_records(0, 3000))  # all up front: the slow one falls behind
        run.start()
        stall = await run.wait_settled(3000)
        await run.finish(run.expected(), "A (slow watcher, 1 ms per record)", stall=stall)


# -- B: a watcher raising on one record ---------------------------------------------------


@pytest.mark.parametrize("total", [100, 2000])
async def test_b_poison_record_is_dead_lettered_alone(
    harness: KafkaHarness, tmp_path: Path, total: int,
) -> None:
    async with KafkaRun(harness, tmp_path, env={"NOLOSS_RAISE_ON_ID": "50"}) as run:
        await run.setup()
        await run.send(plain_records(0, total))
        run.start()
        stall = await run.wait_settled(total)
        expected = run.expected_poisoned(lambda record: record.value == b'{"id": 50}')
        await run.finish(expected, f"B (watcher raising on id 50, N={total})", stall=stall)


# -- C: the store stalls longer than the ack timeout ----------------------------------------


async def test_c1_store_locked_by_another_process(harness: KafkaHarness, tmp_path: Path) -> None:
    await store_locked_case(functools.partial(KafkaRun, harness, tmp_path))


async def test_c2_store_on_a_full_filesystem(harness: KafkaHarness, tmp_path: Path) -> None:
    await store_full_case(functools.partial(KafkaRun, harness, tmp_path), tmp_path)


# -- D: fuzzed input ------------------------------------------------------------------------


def fuzzed_records(seed: int) -> list[Record]:
    """Valid records mixed, in a seeded order, with every kind of hostile input."""
    rng = random.Random(seed)

    def doc(**fields: Any) -> bytes:
        return json.dumps({"id": rng.randrange(1 << 30), **fields}).encode()

    def not_utf8(size: int) -> bytes:
        return b"\xff" + rng.randbytes(size)  # 0xff never occurs in UTF-8

    hostile = [
        *(Record(not_utf8(rng.randrange(1, 4000)), "random bytes", rejected=True)
          for _ in range(4)),
        Record(b'{"id": 1, "s": "\xc3\x28"}', "invalid UTF-8 in a string", rejected=True),
        Record(b'{"id": 2, "s": "caf\xe9"}', "latin-1 text", rejected=True),
        Record(b'{"id": 3,', "truncated JSON", rejected=True),
        Record(b"", "empty value", rejected=True),
        Record(nested_json(1500).encode(), "JSON nested 1,500 deep", rejected=True),
        Record(json.dumps({"id": 4, "deep": {"a": [[{"b": [[0]]}]]}}).encode()[:-1]
               + b"x", "JSON with trailing garbage", rejected=True),
        Record(b'{"id": 5, "s": "\\ud800"}', "lone surrogate", rejected=True),
        Record(b'{"id": 6, "s": "\\udfff tail"}', "lone low surrogate", rejected=True),
        Record(f'{{"id": 7, "n": {nested_json(150)}}}'.encode(), "JSON nested 150 deep",
               rejected=True),
        Record(doc(**{f"k{j}": j for j in range(50_000)}), "wide JSON (50,000 keys)"),
        Record(doc(blob="x" * 2_000_000), "2 MB JSON"),
        Record(None, "tombstone (no value)", key=b"gone"),
        Record(doc(), "binary key", key=rng.randbytes(16) + b"\xff"),
        Record(doc(), "empty key", key=b""),
        Record(doc(), "odd headers", headers=(
            ("", b"\x00\xff"), ("bin", bytes(range(256))), ("empty", b""),
            ("ünï €", "ü".encode()))),
        Record(doc(), "duplicate header names", headers=(("h", b"1"), ("h", b"2"))),
        Record(b"42", "a JSON number"),
        Record(b'"just text"', "a JSON string"),
        Record(b"[]", "an empty JSON array"),
        Record(b"null", "JSON null"),
        Record(doc(s="h\u00e9llo \U0001f600 \u0000 nul"), "unicode and NUL"),
        Record(f'{{"id": 8, "n": {nested_json(40)}}}'.encode(), "JSON nested 40 deep (storable)"),
    ]
    valid = [Record(doc()) for _ in range(300)]
    records = hostile + valid
    rng.shuffle(records)
    return records


async def test_d_fuzzed_input_is_stored_or_rejected_once(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    async with KafkaRun(harness, tmp_path) as run:
        await fuzzed_case(run, fuzzed_records, "fuzzed input")


# -- E: a dead letter the broker refuses ----------------------------------------------------


async def test_e_refused_dead_letter_falls_back_to_the_store(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    huge = b"\xff" + random.Random(11).randbytes(3 * 2**20)  # undecodable, and 3 MB
    records = [*plain_records(0, 100), Record(huge, "3 MB undecodable", rejected=True),
               *plain_records(100, 100)]
    async with KafkaRun(harness, tmp_path) as run:
        # The DLQ producer's request limit (1 MB, aiokafka's default) refuses the record
        # whatever the broker does; the topic limit says so to brokers that enforce it.
        await run.setup(dlq_max_message_bytes=2**20)
        run.start()
        await run.send(records)
        stall = await run.wait_settled(len(records))
        expected = run.expected()
        expected.dead_letters[run.source_where(lambda r: r.value is huge)] = ExpectedDeadLetter(
            REJECTED, where=IN_STORE, payload_size=len(huge))
        await run.finish(expected, "E (3 MB undecodable record, DLQ write refused)",
                         stall=stall)


def test_fuzzed_records_are_deterministic() -> None:
    assert fuzzed_records(7) == fuzzed_records(7)
    assert fuzzed_records(7) != fuzzed_records(8)
