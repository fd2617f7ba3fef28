"""The test server's optional state file (``--state-file``): what survives a restart.

Off by default (the server keeps everything in memory). With a state file,
the server loads a :class:`~.store.Snapshot` on start and writes one after
changes: queues, topics, subscriptions (settings and filters), sequence
numbers, every entry - the message as sent, its sequence number, enqueue
time, delivery count, deferral and broker properties - with the dead-letter
sub-queues and session states. Receivers and locks are not kept: what was
locked comes back available with one more failed delivery, as Service Bus
redelivers once a lock is lost (:mod:`.state`'s invariant 8).

Invariants:

1. A write replaces the file atomically (a temporary file renamed over
   it), so a server killed at any moment leaves the last complete snapshot.
2. A send is accepted only after its write (:meth:`StateFile.save` runs
   before the disposition goes out): a message whose send returned survives
   a SIGKILL.
3. Every other change (settlements, expiries, session states) is written
   within :data:`DEBOUNCE` seconds (:meth:`StateFile.changed`, then
   :meth:`StateFile.save_if_due` on the server's tick), so a write covers
   many settlements. A kill may forget the last ones: a completed message
   is then delivered again (at-least-once, as after a lost lock), and a
   delivery count may be lower than it was.
4. A clean stop (SIGTERM) writes whatever is pending.

The format is JSON, private to this module: a file written by one version
of the kit is not promised to load in another. Messages are kept as the
bytes the sender wrote and read back with :func:`.wire.message_facts`.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sharedstream.testing.json_snapshots import read_snapshot, replace_snapshot
from sharedstream.testing.servicebus import wire
from sharedstream.testing.servicebus.model import CorrelationFilter, EntitySettings
from sharedstream.testing.servicebus.state import ServiceBusState, Snapshot
from sharedstream.testing.servicebus.store import SavedEntry, SavedStore

__all__ = ["DEBOUNCE", "StateFile"]

DEBOUNCE = 0.2
"""Seconds a change (other than a send) may wait before it is written."""

_FORMAT = 1


class StateFile:
    """Saves and loads one server's state at ``path`` (see the module's invariants).

    Used on the server's one thread only. ``clock`` (monotonic seconds)
    times the debounce.
    """

    def __init__(self, path: Path, *, delay: float = DEBOUNCE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.delay, self.clock = path, delay, clock
        self._due: float | None = None
        self.writes = 0
        """Snapshots written so far (for tests of the debounce)."""

    def load(self, state: ServiceBusState) -> bool:
        """Restore ``state`` (without entities) from the file; ``False`` if there is no file."""
        document = read_snapshot(self.path)
        if document is None:
            return False
        state.restore(_decode(document))
        return True

    def changed(self) -> None:
        """Something changed: write within :attr:`delay` (a pending write is not postponed)."""
        if self._due is None:
            self._due = self.clock() + self.delay

    @property
    def pending(self) -> bool:
        """Whether a change waits to be written."""
        return self._due is not None

    def save_if_due(self, state: ServiceBusState) -> None:
        """Write ``state`` if a change has waited :attr:`delay` seconds."""
        if self._due is not None and self.clock() >= self._due:
            self.save(state)

    def save(self, state: ServiceBusState) -> None:
        """Write ``state``'s snapshot now, replacing the file atomically; nothing is pending."""
        replace_snapshot(self.path, _encode(state.snapshot()))
        self._due = None
        self.writes += 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _encode_entries(entries: Iterable[SavedEntry]) -> list[list[Any]]:
    return [[_b64(e.message.encoded), e.sequence_number, e.enqueued_time, e.delivery_count,
             e.deferred, e.locked, dict(e.extra_properties)] for e in entries]


def _decode_entries(rows: Iterable[list[Any]]) -> tuple[SavedEntry, ...]:
    return tuple(SavedEntry(wire.message_facts(base64.b64decode(encoded)), int(number),
                            float(enqueued), int(count), bool(deferred), bool(locked),
                            dict(extra))
                 for encoded, number, enqueued, count, deferred, locked, extra in rows)


def _encode_store(store: SavedStore) -> dict[str, Any]:
    return {"path": store.path, "settings": dataclasses.asdict(store.settings),
            "filters": [dataclasses.asdict(f) for f in store.filters],
            "entries": _encode_entries(store.entries),
            "dead_letters": _encode_entries(store.dead_letters),
            "session_states": {k: _b64(v) for k, v in store.session_states.items()}}


def _decode_store(data: dict[str, Any]) -> SavedStore:
    return SavedStore(data["path"], EntitySettings(**data["settings"]),
                      tuple(CorrelationFilter(**f) for f in data["filters"]),
                      _decode_entries(data["entries"]), _decode_entries(data["dead_letters"]),
                      {k: base64.b64decode(v) for k, v in data["session_states"].items()})


def _encode(snapshot: Snapshot) -> dict[str, Any]:
    return {"format": _FORMAT, "next_sequence": dict(snapshot.next_sequence),
            "queues": [_encode_store(q) for q in snapshot.queues],
            "topics": {topic: [_encode_store(s) for s in subscriptions]
                       for topic, subscriptions in snapshot.topics.items()}}


def _decode(data: dict[str, Any]) -> Snapshot:
    if data.get("format") != _FORMAT:
        raise ValueError(f"unknown state file format {data.get('format')!r}")
    return Snapshot(tuple(_decode_store(q) for q in data["queues"]),
                    {topic: tuple(_decode_store(s) for s in subscriptions)
                     for topic, subscriptions in data["topics"].items()},
                    {key: int(number) for key, number in data["next_sequence"].items()})
