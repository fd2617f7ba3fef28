"""The stores of the Service Bus test server's state: entries, locks, receivers, sessions.

The records :class:`~.state.ServiceBusState` keeps, and :class:`Store`, one
queue, subscription or dead-letter sub-queue: its entries by sequence
number, a heap of available sequence numbers per session (lazy: an item
whose entry is gone, locked or deferred is dropped when met), and which
receiver holds each session. Only :mod:`.state` changes them; see its
invariants. No I/O, not thread-safe.

Also the immutable records of a :class:`Snapshot` (what
:meth:`~.state.ServiceBusState.snapshot` gives and
:meth:`~.state.ServiceBusState.restore` loads): entities, entries and
session states, without receivers or locks.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sharedstream.testing.servicebus.model import CorrelationFilter, EntitySettings, Message

__all__ = ["DEAD_LETTER_QUEUE", "Entry", "Lock", "LockCounts", "Receiver", "SavedEntry",
           "SavedStore", "Snapshot", "Store", "StoreCounts"]

DEAD_LETTER_QUEUE = "$DeadLetterQueue"
_DEAD_LETTER_SETTINGS = EntitySettings(max_delivery_count=2**31 - 1)


@dataclass(eq=False, slots=True)
class Entry:
    """One message in one store, with its delivery history and current lock."""

    message: Message
    sequence_number: int
    enqueued_time: float
    delivery_count: int = 0
    lock: Lock | None = None
    deferred: bool = False
    extra_properties: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class Lock:
    """One peek-lock delivery of an entry: its token, receiver and monotonic deadline."""

    token: uuid.UUID
    entry: Entry
    receiver: Receiver
    deadline: float  # monotonic; a session's entries use the session's deadline instead


@dataclass(eq=False, slots=True)
class Receiver:
    """One open receive link of a store: its mode and, on a session store, its session."""

    store: Store
    receive_and_delete: bool
    session_id: str | None = None
    session_deadline: float = 0.0
    """Monotonic deadline of the session lock (session receivers only)."""
    closed: bool = False

    @property
    def path(self) -> str:
        """The path of the store it reads."""
        return self.store.path


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """Where a store's entries are (invariant 1): a read-only record."""

    available: int
    locked: int
    deferred: int


@dataclass(slots=True)
class LockCounts:
    """What happened to a store's message locks since it was created (counters only grow).

    Kept for tests and benchmarks: a lock that lapsed is a redelivery the
    client did not ask for.
    """

    lapsed: int = 0
    """Message locks that expired unrenewed (each returned its message, counted)."""
    renew_requests: int = 0
    """``com.microsoft:renew-lock`` requests answered 200 (however many tokens each)."""
    renewed: int = 0
    """Locks those requests renewed."""


class Store:
    """A queue, a subscription or a dead-letter sub-queue (see :mod:`.state`'s invariants)."""

    def __init__(self, path: str, settings: EntitySettings,
                 filters: Sequence[CorrelationFilter] = ()) -> None:
        self.path, self.settings, self.filters = path, settings, tuple(filters)
        self.entries: dict[int, Entry] = {}  # by sequence number
        self.heaps: dict[str | None, list[int]] = {}  # session id -> available seqs (lazy)
        self.owners: dict[str, Receiver] = {}  # session id -> the receiver holding its lock
        self.session_states: dict[str, bytes] = {}
        self.session_updated: dict[str, float] = {}  # session id -> epoch s its state was set
        self.locks = LockCounts()
        self.dead_letter: Store | None = None
        if not path.endswith(DEAD_LETTER_QUEUE):
            self.dead_letter = Store(f"{path}/{DEAD_LETTER_QUEUE}", _DEAD_LETTER_SETTINGS)

    def key(self, entry: Entry) -> str | None:
        """The heap ``entry`` waits in: its session id on a session store, else ``None``."""
        return entry.message.session_id if self.settings.requires_session else None

    def make_available(self, entry: Entry) -> None:
        """Put ``entry`` (unlocked, not deferred) back among the available ones."""
        heapq.heappush(self.heaps.setdefault(self.key(entry), []), entry.sequence_number)

    def head(self, session: str | None) -> Entry | None:
        """The lowest available entry of ``session`` (stale heap items dropped)."""
        heap = self.heaps.get(session)
        while heap:
            entry = self.entries.get(heap[0])
            if entry is not None and entry.lock is None and not entry.deferred:
                return entry
            heapq.heappop(heap)
        return None

    def free_session(self) -> str | None:
        """The unlocked session whose head is oldest, or ``None`` when no session has one."""
        heads = ((entry.sequence_number, session) for session in list(self.heaps)
                 if session is not None and session not in self.owners
                 and (entry := self.head(session)) is not None)
        best = min(heads, default=None)
        return None if best is None else best[1]


@dataclass(frozen=True, slots=True)
class SavedEntry:
    """One entry of a :class:`SavedStore`; ``locked``: it was locked when saved."""

    message: Message
    sequence_number: int
    enqueued_time: float
    delivery_count: int
    deferred: bool
    locked: bool
    extra_properties: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SavedStore:
    """A queue or subscription: settings, filters, entries and dead letters, session states."""

    path: str
    settings: EntitySettings
    filters: tuple[CorrelationFilter, ...]
    entries: tuple[SavedEntry, ...]
    dead_letters: tuple[SavedEntry, ...]
    session_states: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A server's state without receivers or locks (see :meth:`.state.ServiceBusState.restore`).

    ``topics``: each topic (lower-cased) and its subscriptions;
    ``next_sequence``: the next sequence number of each queue and topic
    (lower-cased).
    """

    queues: tuple[SavedStore, ...]
    topics: Mapping[str, tuple[SavedStore, ...]]
    next_sequence: Mapping[str, int]
