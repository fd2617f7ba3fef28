"""Definitions for the end-to-end tests: watchers over a durable file-backed log.

(File I/O here is small and local; blocking calls in async code are deliberate.)

The "broker" is a JSON-lines file; the producer commits offsets to
``<log>.offsets`` (atomically, fsynced) and resumes after the committed
offset on restart, so a killed triggerer gets redeliveries exactly like a
Kafka consumer group would. A failed outcome rewinds the reader to that
offset (redelivery in-session); a rejected one is appended to ``<log>.dlq``.

Configured by environment: ``FILELOG_PATH`` (the log), ``FILELOG_SECRET``
(a kwarg that must never appear in the database in clear), ``FILELOG_RUN``
(a JSON command line that runs each ``process_orders`` run: see
``run_job.py``), ``FILELOG_DAG`` (more ``Dag`` arguments of
``process_orders``, as JSON).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Hashable, Sequence
from pathlib import Path
from typing import Any

from sharedstream import (
    AdvanceItem,
    BaseEventTrigger,
    SharedStreamProducer,
    TriggerEvent,
    reject_shared_stream_event,
)
from sharedstream.definitions import Asset, AssetWatcher, Dag


def read_committed(log: Path) -> int:
    try:
        return int(json.loads(Path(f"{log}.offsets").read_text())["committed"])
    except FileNotFoundError:
        return -1


def write_committed(log: Path, offset: int) -> None:
    target = Path(f"{log}.offsets")
    tmp = target.with_suffix(".tmp")
    with tmp.open("w") as handle:
        json.dump({"committed": offset}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(target)


class FileLogProducer(SharedStreamProducer):
    def __init__(self, log: str) -> None:
        self.log = Path(log)
        self.lines: list[str] = []
        self.position = 0
        self.committed = -1
        self.floor: int | None = None  # lowest offset that failed and must be redelivered
        self.pause = 0.0  # seconds to wait before redelivering to nobody again

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self.committed = read_committed(self.log)
        self.position = self.committed + 1
        handle = self.log.open("a+")
        handle.seek(0)
        try:
            while True:
                line = handle.readline()
                if line.endswith("\n"):
                    self.lines.append(line)
                    continue
                if line:  # a partial line: wait for the writer to finish it
                    handle.seek(handle.tell() - len(line))
                if self.pause:
                    await asyncio.sleep(self.pause)
                    self.pause = 0.0
                if self.position < len(self.lines):
                    offset = self.position
                    self.position += 1
                    try:
                        raw: Any = json.loads(self.lines[offset])
                    except ValueError:
                        raw = self.lines[offset]
                    yield raw, offset
                else:
                    await asyncio.sleep(0.01)
        finally:
            handle.close()

    def raw_event_name(self, broker_payload: Any) -> str | None:
        return f"{self.log.name}/{broker_payload}"

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        for offset, outcome in batch:
            if outcome.failed or not (outcome.acked or outcome.rejected):
                if not outcome.failed:
                    self.pause = 0.2  # nobody was subscribed: wait for them to come back
                if self.floor is None or offset <= self.floor:
                    self.floor = offset
                    self.position = min(self.position, offset)  # redeliver from here
                continue
            if outcome.rejected:
                with Path(f"{self.log}.dlq").open("a") as dlq:
                    dlq.write(self.lines[offset])
            if self.floor is not None and offset == self.floor:
                self.floor = None
            if self.floor is None and offset == self.committed + 1:
                self.committed = offset
        write_committed(self.log, self.committed)


class FileLogTrigger(BaseEventTrigger):
    """Fires for messages whose ``kind`` is in ``kinds`` and ``amount`` >= ``min_amount``."""

    def __init__(self, path: str, kinds: list[str], min_amount: int = 0,
                 password: str | None = None) -> None:
        super().__init__()
        self.path, self.kinds, self.min_amount, self.password = path, kinds, min_amount, password

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"path": self.path, "kinds": self.kinds, "min_amount": self.min_amount,
             "password": self.password},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError("runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def shared_stream_key(self) -> Hashable:
        return ("filelog", self.path)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return FileLogProducer(kwargs["path"])

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            if not isinstance(message, dict):
                reject_shared_stream_event()
                continue
            marker = message.get("explode_once")
            if marker and self.kinds == ["order"] and not Path(marker).exists():
                Path(marker).touch()
                raise RuntimeError(f"exploding on message {message['id']}")
            if message.get("kind") in self.kinds and message.get("amount", 0) >= self.min_amount:
                yield TriggerEvent({"id": message["id"], "kind": message["kind"]})


LOG = os.environ["FILELOG_PATH"]

orders = Asset("orders", watchers=[
    AssetWatcher("all_orders", trigger=FileLogTrigger(LOG, ["order"])),
    AssetWatcher("big_orders", trigger=FileLogTrigger(LOG, ["order"], min_amount=100,
                                                      password=os.environ.get("FILELOG_SECRET"))),
])
refunds = Asset("refunds", watchers=[
    AssetWatcher("refunds", trigger=FileLogTrigger(LOG, ["refund"])),
    # identical to the watcher above: collapses into the same trigger row
    AssetWatcher("refunds_again", trigger=FileLogTrigger(LOG, ["refund"])),
])

# FILELOG_RUN: a JSON command line that runs each process_orders run (the local target)
_RUN = json.loads(os.environ["FILELOG_RUN"]) if os.environ.get("FILELOG_RUN") else None
# FILELOG_DAG: more keyword arguments of process_orders, as a JSON object (batching, a target)
_MORE = json.loads(os.environ.get("FILELOG_DAG") or "{}")
process_orders = Dag("process_orders", schedule=orders, run=_RUN, **_MORE)
reconcile = Dag("reconcile", schedule=orders & refunds)
either = Dag("either", schedule=orders | refunds)
