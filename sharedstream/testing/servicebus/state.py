"""What the Service Bus test server knows: entities, messages, locks and sessions - no I/O.

This module imports no AMQP library: the service (:mod:`.service`) turns
frames into calls here and the results into frames. Everything runs on the
server's one thread; nothing here is thread-safe.

Terms:

* an *entity* is a queue or a topic; a topic has *subscriptions*, each with
  correlation filters; a queue and a subscription each have a dead-letter
  sub-queue (``<path>/$DeadLetterQueue``). Those three are *stores*: what
  receivers read from. Paths are case-insensitive, as in Service Bus;
* an *entry* is one message in one store: its sequence number (per queue or
  topic, from 1), enqueue time, failed deliveries so far;
* a *lock* is one peek-lock delivery of an entry: a lock token (a UUID), a
  deadline, and the receiver it went to;
* a *session* is the entries of a session-enabled store sharing a session
  id; a *session lock* gives one receiver all of that session's entries.

Invariants:

1. An entry is in exactly one place: *available* (in its session's heap,
   lowest sequence number first), *locked* (one live lock) or *deferred*. A
   completed or dead-lettered entry is gone from its store (a dead-lettered
   one becomes a new entry of the dead-letter store, same sequence number).
   A deferred entry is never received again, only locked (or removed, in
   receive-and-delete mode) by its sequence number
   (:meth:`~ServiceBusState.receive_deferred`); when that lock ends without
   a settlement, or with another defer, it is deferred again.
2. A lock token names one delivery. Once the lock ends (settlement, expiry,
   loss of its session) the token is stale: settling or renewing it raises
   :class:`~.model.Refused` with ``message-lock-lost`` (``session-lock-lost``
   for a session's message).
3. A session is locked by at most one receiver, and only that receiver gets
   the session's entries, in sequence order (an abandoned entry comes back
   before later ones).
4. ``delivery_count`` counts failed deliveries: abandon, lock expiry, loss of
   the session lock. When it reaches the store's ``max_delivery_count`` the
   entry is dead-lettered with reason ``MaxDeliveryCountExceeded``. A
   release (the SDK handing back a prefetched message) is not counted.
5. Whatever makes an entry available calls ``on_available`` with its store's
   path before returning, so the service can hand it to a waiting receiver.
6. A message with a ``scheduled_enqueue_time`` still to come is an entry
   (sequence number given, peekable, enqueue time the scheduled one) but
   not available until :meth:`~ServiceBusState.expire` runs at or after
   that time. A message whose ``time_to_live`` has passed since its
   enqueue time is never delivered: a receive drops it, or dead-letters it
   with reason ``TTLExpiredException`` when the store's
   ``dead_lettering_on_message_expiration`` is set, as Service Bus purges
   expired messages when a receiver reaches them. A dead-letter queue's
   messages do not expire. A scheduled entry can be cancelled
   (:meth:`~ServiceBusState.cancel_scheduled`) until its time comes.
7. A queue with a ``duplicate_detection_window`` accepts a message whose
   ``message_id`` it accepted less than that window ago, and drops it: no
   sequence number, no entry.
8. A :meth:`~ServiceBusState.snapshot` restored into a new state
   (:meth:`~ServiceBusState.restore`) has the same entities, sequence
   numbers, entries and session states; what was locked comes back
   available (or deferred, if it was) with one more failed delivery (or
   dead-lettered by invariant 4), as Service Bus does once a lock is lost. Receivers and the message
   ids duplicate detection remembers are not kept.

Time is two injected clocks: ``clock`` (monotonic seconds) for lock
deadlines, ``wall`` (epoch seconds) for the times clients see. Deadlines are
checked by :meth:`ServiceBusState.expire`, which the service calls when
:meth:`ServiceBusState.next_due` says something is due.
"""

from __future__ import annotations

import heapq
import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from types import MappingProxyType

from sharedstream.testing.servicebus.model import (
    MESSAGE_LOCK_LOST,
    MESSAGE_NOT_FOUND,
    NOT_ALLOWED,
    NOT_FOUND,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    CorrelationFilter,
    Delivery,
    EntitySettings,
    Message,
    MessageState,
    NextSession,
    Outcome,
    Refused,
)
from sharedstream.testing.servicebus.store import (
    DEAD_LETTER_QUEUE,
    Entry,
    Lock,
    LockCounts,
    Receiver,
    SavedEntry,
    SavedStore,
    Snapshot,
    Store,
    StoreCounts,
)

__all__ = ["DEAD_LETTER_QUEUE", "MAX_DELIVERY_COUNT_EXCEEDED", "TTL_EXPIRED", "LockCounts",
           "Receiver", "ServiceBusState", "Snapshot", "StoreCounts"]

MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
TTL_EXPIRED = "TTLExpiredException"
_SUBSCRIPTIONS = "subscriptions"


class ServiceBusState:
    """All queues, topics and subscriptions of one server (see the module's invariants)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_available: Callable[[str], None] = lambda path: None) -> None:
        self.clock, self.wall, self.on_available = clock, wall, on_available
        self._stores: dict[str, Store] = {}  # lower-cased path -> store
        self._topics: dict[str, list[Store]] = {}  # lower-cased topic -> its subscriptions
        self._sequences: dict[str, int] = {}  # queue or topic -> its next sequence number
        self._locks: dict[uuid.UUID, Lock] = {}
        self._deadlines: list[tuple[float, int, uuid.UUID]] = []  # lazy heap of lock deadlines
        self._receivers: dict[Receiver, None] = {}  # open receivers, oldest first
        self._scheduled: list[tuple[float, int, Store, int]] = []  # (epoch s, tie, store, seq)
        self._seen_ids: dict[str, dict[str, float]] = {}  # queue -> message id -> first seen
        self._ties = itertools.count()

    # -- entities ---------------------------------------------------------------

    def create_queue(self, name: str, settings: EntitySettings | None = None) -> None:
        """Add a queue (and its dead-letter sub-queue); ``NOT_ALLOWED`` if the name is taken."""
        self._check_free(name)
        store = Store(name, settings or EntitySettings(), (CorrelationFilter(),))
        self._add(store)
        self._sequences[name.lower()] = 1

    def create_topic(self, name: str) -> None:
        """Add a topic without subscriptions (what is sent to it then goes nowhere)."""
        self._check_free(name)
        self._topics[name.lower()] = []
        self._sequences[name.lower()] = 1

    def create_subscription(self, topic: str, name: str, settings: EntitySettings | None = None,
                            filters: Sequence[CorrelationFilter] = (CorrelationFilter(),)) -> None:
        """Add a subscription to ``topic``: it gets what is sent from now on and passes a filter.

        A message is copied once to each subscription with at least one
        matching filter; no filters means it matches nothing.
        """
        subscriptions = self._topics.get(topic.lower())
        if subscriptions is None:
            raise Refused(NOT_FOUND, f"The messaging entity '{topic}' could not be found.")
        path = f"{topic}/Subscriptions/{name}"
        if path.lower() in self._stores:
            raise Refused(NOT_ALLOWED, f"subscription {path} already exists")
        store = Store(path, settings or EntitySettings(), filters)
        self._add(store)
        subscriptions.append(store)

    def settings(self, path: str) -> EntitySettings:
        """The settings of the queue, subscription or dead-letter queue at ``path``."""
        return self._store(path).settings

    def counts(self, path: str) -> StoreCounts:
        """How many entries of the store at ``path`` are where (read-only)."""
        entries = self._store(path).entries.values()
        locked = sum(1 for entry in entries if entry.lock is not None)
        deferred = sum(1 for entry in entries if entry.deferred and entry.lock is None)
        return StoreCounts(available=len(entries) - locked - deferred, locked=locked,
                           deferred=deferred)

    def lock_counts(self, path: str) -> LockCounts:
        """What happened to the message locks of the store at ``path`` (a copy).

        A lapse redelivered its message with ``delivery_count`` one higher
        (or dead-lettered it at ``max_delivery_count``); session locks lost
        are not counted.
        """
        counts = self._store(path).locks
        return LockCounts(counts.lapsed, counts.renew_requests, counts.renewed)

    def check_store(self, path: str) -> None:
        """``NOT_FOUND`` unless ``path`` names a queue, subscription or dead-letter queue."""
        self._store(path)

    def check_entity(self, path: str) -> None:
        """``NOT_FOUND`` unless ``path`` names a topic or a store (what has a management node)."""
        if path.strip("/").lower() not in self._topics:
            self._store(path)

    def _check_free(self, name: str) -> None:
        if "/" in name or not name:
            raise Refused(NOT_ALLOWED, f"invalid entity name {name!r}")
        if name.lower() in self._stores or name.lower() in self._topics:
            raise Refused(NOT_ALLOWED, f"entity {name} already exists")

    def _add(self, store: Store) -> None:
        self._stores[store.path.lower()] = store
        if store.dead_letter is not None:
            self._stores[store.dead_letter.path.lower()] = store.dead_letter

    def _store(self, path: str) -> Store:
        parts = path.strip("/").split("/")
        if len(parts) >= 3 and parts[1].lower() == _SUBSCRIPTIONS:
            parts[1] = "Subscriptions"
        store = self._stores.get("/".join(parts).lower())
        if store is None:
            raise Refused(NOT_FOUND, f"The messaging entity '{path}' could not be found.")
        return store

    # -- sending ----------------------------------------------------------------

    def send(self, path: str, messages: Iterable[Message]) -> list[int]:
        """Enqueue ``messages`` on the queue or topic at ``path``; their sequence numbers.

        All or nothing: ``NOT_FOUND`` for an unknown entity, ``NOT_ALLOWED``
        for a subscription or dead-letter queue (they cannot be sent to) or a
        message without a session id for a session-enabled store.
        """
        batch = list(messages)
        key, targets = self._targets(path)
        for store in targets:
            if store.settings.requires_session and any(m.session_id is None for m in batch):
                raise Refused(NOT_ALLOWED, f"{store.path} requires sessions: every message "
                                           "needs a session id")
        numbers, now, touched = [], self.wall(), set()
        for message in batch:
            if key not in self._topics and self._duplicate(key, targets[0], message, now):
                continue
            number = self._sequences[key]
            self._sequences[key] = number + 1
            numbers.append(number)
            for store in targets:
                if any(rule.matches(message) for rule in store.filters):
                    self._enqueue(store, Entry(message, number, max(
                        now, message.scheduled_enqueue_time or now)))
                    touched.add(store.path)
        for touched_path in sorted(touched):
            self.on_available(touched_path)
        return numbers

    def check_sendable(self, path: str) -> None:
        """``NOT_FOUND`` or ``NOT_ALLOWED`` unless :meth:`send` can send to ``path``."""
        self._targets(path)

    def _targets(self, path: str) -> tuple[str, list[Store]]:
        key = path.strip("/").lower()
        subscriptions = self._topics.get(key)
        if subscriptions is not None:
            return key, subscriptions
        store = self._store(path)
        if key not in self._sequences:
            raise Refused(NOT_ALLOWED, f"cannot send to {path}: not a queue or topic")
        return key, [store]

    def _duplicate(self, key: str, store: Store, message: Message, now: float) -> bool:
        """Whether ``message`` repeats an id the queue accepted within its window (invariant 7)."""
        window = store.settings.duplicate_detection_window
        message_id = message.properties.get("message_id")
        if window is None or message_id is None:
            return False
        seen = self._seen_ids.setdefault(key, {})
        for old, first in list(seen.items()):  # oldest first: stop at the first one still kept
            if now - first < window:
                break
            del seen[old]
        if str(message_id) in seen:
            return True
        seen[str(message_id)] = now
        return False

    def _enqueue(self, store: Store, entry: Entry) -> None:
        store.entries[entry.sequence_number] = entry
        self._schedule_or_make_available(store, entry)

    def _schedule_or_make_available(self, store: Store, entry: Entry) -> None:
        """Available now, or at its scheduled enqueue time (invariant 6)."""
        due = entry.message.scheduled_enqueue_time
        if due is not None and due > self.wall() and store.dead_letter is not None:
            heapq.heappush(self._scheduled, (due, next(self._ties), store,
                                             entry.sequence_number))
        else:
            store.make_available(entry)

    def _waiting(self, entry: Entry) -> bool:
        """Whether ``entry`` waits for its scheduled enqueue time (invariant 6)."""
        due = entry.message.scheduled_enqueue_time
        return due is not None and due > self.wall() and entry.lock is None and not entry.deferred

    def _expired(self, store: Store, entry: Entry) -> bool:
        ttl = entry.message.time_to_live
        return (ttl is not None and store.dead_letter is not None
                and entry.enqueued_time + ttl <= self.wall())

    # -- receivers --------------------------------------------------------------

    def open_receiver(self, path: str, *, receive_and_delete: bool = False,
                      session: str | NextSession | None = None) -> Receiver | None:
        """A receiver of the store at ``path``, or ``None`` while no session can be given.

        On a session-enabled store ``session`` is required: a session id
        (locked even if it has no messages yet; ``SESSION_CANNOT_BE_LOCKED``
        if another receiver holds it) or :data:`~.model.NEXT_SESSION` (the
        unlocked session with the oldest message; ``None`` when there is
        none - call again after ``on_available``). Elsewhere ``session``
        must be ``None``.
        """
        store = self._store(path)
        if not store.settings.requires_session:
            if session is not None:
                raise Refused(NOT_ALLOWED, f"{store.path} is not session-enabled")
            receiver = Receiver(store, receive_and_delete)
            self._receivers[receiver] = None
            return receiver
        if session is None:
            raise Refused(NOT_ALLOWED, f"{store.path} requires a session receiver")
        if isinstance(session, NextSession):
            chosen = store.free_session()
            if chosen is None:
                return None
        elif session in store.owners:
            raise Refused(SESSION_CANNOT_BE_LOCKED, f"session {session!r} of {store.path} is "
                                                    "locked by another receiver")
        else:
            chosen = session
        receiver = Receiver(store, receive_and_delete, chosen,
                            self.clock() + store.settings.lock_duration)
        store.owners[chosen] = receiver
        self._receivers[receiver] = None
        return receiver

    def session_locked_until(self, receiver: Receiver) -> float:
        """Epoch seconds until which ``receiver``'s session lock lasts."""
        return self.wall() + receiver.session_deadline - self.clock()

    def close_receiver(self, receiver: Receiver) -> None:
        """The receive link closed: its session lock ends (idempotent).

        A session's locked entries come back, counted as failed deliveries.
        Message locks of a non-session receiver stay until they expire or are
        settled (through the management link, as the SDK may).
        """
        if receiver.closed:
            return
        receiver.closed = True
        self._receivers.pop(receiver, None)
        if receiver.session_id is not None:
            self._end_session(receiver)

    def receive(self, receiver: Receiver) -> Delivery | None:
        """The next entry for ``receiver``, locked (peek-lock) or removed; ``None`` if none."""
        if receiver.closed:
            return None
        store = receiver.store
        entry = store.head(receiver.session_id)
        while entry is not None and self._expired(store, entry):  # invariant 6
            heapq.heappop(store.heaps[store.key(entry)])
            if store.settings.dead_lettering_on_message_expiration:
                self._dead_letter(store, entry, TTL_EXPIRED,
                                  "The message expired and was dead lettered.")
            else:
                del store.entries[entry.sequence_number]
            entry = store.head(receiver.session_id)
        if entry is None:
            return None
        heapq.heappop(store.heaps[store.key(entry)])
        return self._hand_out(entry, receiver, receiver.receive_and_delete)

    def receive_deferred(self, path: str, numbers: Sequence[int], *,
                         receive_and_delete: bool = False,
                         session_id: str | None = None) -> list[Delivery]:
        """The deferred entries ``numbers`` name, in that order, locked (or removed).

        What ``com.microsoft:receive-by-sequence-number`` does (invariant 1).
        All or nothing: if a number names no deferred, unlocked entry of the
        store (of session ``session_id``, which must be given on a
        session-enabled store and locked by a receiver, else
        ``SESSION_LOCK_LOST``), ``MESSAGE_NOT_FOUND`` and nothing changes.
        A number listed twice is handed out once. A session's entry is locked
        under the session lock (no message lock deadline), as a session
        receiver's are.
        """
        store = self._store(path)
        if store.settings.requires_session != (session_id is not None):
            raise Refused(NOT_ALLOWED, f"{store.path}: a session id is needed exactly when "
                                       "the entity is session-enabled")
        owner = (Receiver(store, receive_and_delete) if session_id is None
                 else self.session_receiver(path, session_id))
        wanted = list(dict.fromkeys(numbers))
        entries = [store.entries.get(number) for number in wanted]
        missing = [number for number, entry in zip(wanted, entries, strict=True)
                   if entry is None or not entry.deferred or entry.lock is not None
                   or (session_id is not None and entry.message.session_id != session_id)]
        if missing:
            raise Refused(MESSAGE_NOT_FOUND, f"Failed to lock one or more specified messages: "
                                             f"no deferred message of {store.path} has sequence "
                                             f"number {', '.join(map(str, missing))}.")
        return [self._hand_out(entry, owner, receive_and_delete)
                for entry in entries if entry is not None]

    def _hand_out(self, entry: Entry, receiver: Receiver, receive_and_delete: bool) -> Delivery:
        """``entry``, no longer available, removed or locked for ``receiver``."""
        store = receiver.store
        if receive_and_delete:
            del store.entries[entry.sequence_number]
            return self._delivery(entry, None, None)
        lock = Lock(uuid.uuid4(), entry, receiver,
                     self.clock() + store.settings.lock_duration)
        entry.lock = lock
        self._locks[lock.token] = lock
        if receiver.session_id is None:
            heapq.heappush(self._deadlines, (lock.deadline, next(self._ties), lock.token))
            return self._delivery(entry, lock.token, self.wall() + store.settings.lock_duration)
        return self._delivery(entry, lock.token, None)

    def _delivery(self, entry: Entry, token: uuid.UUID | None, until: float | None) -> Delivery:
        state = (MessageState.DEFERRED if entry.deferred
                 else MessageState.SCHEDULED if self._waiting(entry) else MessageState.ACTIVE)
        return Delivery(entry.message, entry.sequence_number, entry.enqueued_time,
                        entry.delivery_count, token, until,
                        MappingProxyType(dict(entry.extra_properties)), state)

    # -- settlement and locks ---------------------------------------------------

    def settle(self, token: uuid.UUID, outcome: Outcome, *, reason: str | None = None,
               description: str | None = None) -> None:
        """Settle the delivery ``token`` names; a stale token raises ``*-lock-lost``.

        ``reason`` and ``description`` are the dead-letter reason and error
        description (:attr:`Outcome.DEAD_LETTER` only), set as the
        ``DeadLetterReason`` and ``DeadLetterErrorDescription`` application
        properties of the dead-lettered message when given.
        """
        lock = self._live_lock(token)
        entry, store = lock.entry, lock.receiver.store
        self._unlock(lock)
        if outcome is Outcome.COMPLETE:
            del store.entries[entry.sequence_number]
        elif outcome is Outcome.DEAD_LETTER:
            self._dead_letter(store, entry, reason, description)
        elif outcome is Outcome.DEFER:
            entry.deferred = True
        else:
            self._return(store, entry, failed=outcome is Outcome.ABANDON)

    def renew_lock(self, token: uuid.UUID) -> float:
        """Extend the lock ``token`` names by the lock duration; its new end (epoch seconds)."""
        return self.renew_locks([token])[0]

    def renew_locks(self, tokens: Sequence[uuid.UUID], path: str | None = None) -> list[float]:
        """Extend every lock ``tokens`` name; their new ends (epoch seconds), in order.

        All or nothing, as Service Bus's ``com.microsoft:renew-lock`` answers
        one status for the whole list: if any token is stale (invariant 2),
        or belongs to another store than the one at ``path`` (the
        management node asked), nothing is renewed and ``MESSAGE_LOCK_LOST``
        is raised. A token listed twice is renewed once, answered twice.
        """
        locks = [self._live_lock(token) for token in tokens]
        if path is not None:
            store = self._store(path)
            if any(lock.receiver.store is not store for lock in locks):
                raise Refused(MESSAGE_LOCK_LOST, "The lock supplied is invalid: it was not "
                                                 f"issued by {store.path}.")
        now, wall, ends = self.clock(), self.wall(), []
        if path is not None:
            counts = self._store(path).locks
            counts.renew_requests += 1
            counts.renewed += len(locks)
        for lock in locks:
            duration = lock.receiver.store.settings.lock_duration
            if lock.receiver.session_id is None:
                lock.deadline = now + duration
                heapq.heappush(self._deadlines, (lock.deadline, next(self._ties), lock.token))
            ends.append(wall + duration)
        return ends

    def renew_session_lock(self, receiver: Receiver) -> float:
        """Extend ``receiver``'s session lock; its new end (epoch seconds).

        ``SESSION_LOCK_LOST`` if the lock already ended (expired or closed).
        """
        if receiver.closed or receiver.session_id is None:
            raise Refused(SESSION_LOCK_LOST, "the session lock was lost")
        receiver.session_deadline = self.clock() + receiver.store.settings.lock_duration
        return self.session_locked_until(receiver)

    def session_receiver(self, path: str, session_id: str) -> Receiver:
        """The receiver holding the lock of ``session_id``; ``SESSION_LOCK_LOST`` if none does."""
        receiver = self._store(path).owners.get(session_id)
        if receiver is None:
            raise Refused(SESSION_LOCK_LOST, f"session {session_id!r} is not locked")
        return receiver

    def session_state(self, path: str, session_id: str) -> bytes | None:
        """The state a session receiver last set for ``session_id`` (``None``: never set)."""
        return self._store(path).session_states.get(session_id)

    def set_session_state(self, path: str, session_id: str, value: bytes | None) -> None:
        """Keep ``value`` as the state of ``session_id`` (``None`` clears it)."""
        store = self._store(path)
        states = store.session_states
        store.session_updated[session_id] = self.wall()
        if value is None:
            states.pop(session_id, None)
        else:
            states[session_id] = value

    def _live_lock(self, token: uuid.UUID) -> Lock:
        lock = self._locks.get(token)
        if lock is not None and lock.receiver.session_id is not None and lock.receiver.closed:
            lock = None
        if lock is None:
            raise Refused(MESSAGE_LOCK_LOST, "The lock supplied is invalid. Either the lock "
                                             "expired, or the message has already been settled.")
        return lock

    def _unlock(self, lock: Lock) -> None:
        del self._locks[lock.token]
        lock.entry.lock = None

    def _return(self, store: Store, entry: Entry, *, failed: bool) -> None:
        """Make ``entry`` available again (counted when ``failed``), or dead-letter it."""
        if failed:
            entry.delivery_count += 1
            if entry.delivery_count >= store.settings.max_delivery_count:
                self._dead_letter(store, entry, MAX_DELIVERY_COUNT_EXCEEDED,
                                  f"Message could not be consumed after "
                                  f"{store.settings.max_delivery_count} delivery attempts.")
                return
        if entry.deferred:  # invariant 1: received by its number only, as before
            return
        store.make_available(entry)
        self.on_available(store.path)

    def _dead_letter(self, store: Store, entry: Entry, reason: str | None,
                     description: str | None) -> None:
        del store.entries[entry.sequence_number]
        if store.dead_letter is None:  # already a dead-letter queue: the message is dropped
            return
        extra = dict(entry.extra_properties)
        if reason is not None:
            extra["DeadLetterReason"] = reason
        if description is not None:
            extra["DeadLetterErrorDescription"] = description
        self._enqueue(store.dead_letter, Entry(entry.message, entry.sequence_number,
                                                entry.enqueued_time, extra_properties=extra))
        self.on_available(store.dead_letter.path)

    def _end_session(self, receiver: Receiver) -> None:
        store = receiver.store
        if store.owners.get(receiver.session_id or "") is receiver:
            del store.owners[receiver.session_id or ""]
        for lock in [lock for lock in self._locks.values() if lock.receiver is receiver]:
            self._unlock(lock)
            self._return(store, lock.entry, failed=True)
        if store.free_session() is not None:
            self.on_available(store.path)

    def list_sessions(self, path: str, *, updated_after: float | None = None, skip: int = 0,
                      top: int = 100) -> list[str]:
        """Session ids of the store at ``path``, sorted, from the ``skip``-th, at most ``top``.

        What ``com.microsoft:get-message-sessions`` answers. Without
        ``updated_after``: the sessions that have messages (in any state) or
        a session state. With it (epoch seconds): the sessions whose state
        was set (or cleared) after it, as in Service Bus; those times are
        not kept across a restart. A store without sessions has none.
        """
        store = self._store(path)
        if not store.settings.requires_session:
            return []
        if updated_after is None:
            ids = {entry.message.session_id for entry in store.entries.values()
                   if entry.message.session_id is not None} | set(store.session_states)
        else:
            ids = {session for session, at in store.session_updated.items()
                   if at > updated_after}
        return sorted(ids)[max(skip, 0):max(skip, 0) + max(top, 0)]

    # -- scheduling ---------------------------------------------------------------

    def cancel_scheduled(self, path: str, numbers: Sequence[int]) -> None:
        """Remove the scheduled messages ``numbers`` name from the queue or topic at ``path``.

        What ``com.microsoft:cancel-scheduled-message`` does (invariant 6):
        on a topic, from every subscription the message went to. All or
        nothing: a number naming no message still waiting for its time
        (never sent, already enqueued, cancelled) raises ``MESSAGE_NOT_FOUND``.
        """
        _, targets = self._targets(path)
        found = []
        for number in dict.fromkeys(numbers):
            waiting = [store for store in targets
                       if (entry := store.entries.get(number)) is not None and self._waiting(entry)]
            if not waiting:
                raise Refused(MESSAGE_NOT_FOUND, f"No scheduled message of {path} has sequence "
                                                 f"number {number}.")
            found.append((number, waiting))
        for number, stores in found:
            for store in stores:
                del store.entries[number]  # its heap item in _scheduled is skipped when due

    # -- peeking ----------------------------------------------------------------

    def peek(self, path: str, from_sequence: int, count: int,
             session_id: str | None = None) -> list[Delivery]:
        """Up to ``count`` entries from sequence number ``from_sequence`` on, locked or not.

        Changes nothing. ``session_id`` limits it to one session's entries.
        """
        store = self._store(path)
        chosen = sorted(number for number, entry in store.entries.items()
                        if number >= from_sequence
                        and (session_id is None or entry.message.session_id == session_id))
        return [self._delivery(store.entries[number], None, None) for number in chosen[:count]]

    # -- time -------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest monotonic deadline :meth:`expire` acts on, or ``None`` when none."""
        while self._deadlines and self._stale(*self._deadlines[0]):
            heapq.heappop(self._deadlines)
        due = [r.session_deadline for r in self._receivers if r.session_id is not None]
        if self._deadlines:
            due.append(self._deadlines[0][0])
        if self._scheduled:
            due.append(self.clock() + self._scheduled[0][0] - self.wall())
        return min(due, default=None)

    def _stale(self, deadline: float, _tie: int, token: uuid.UUID) -> bool:
        lock = self._locks.get(token)
        return lock is None or lock.deadline != deadline

    def expire(self) -> list[Receiver]:
        """End every lock past its deadline; the session receivers that lost their session.

        An expired message lock returns its entry, counted as a failed
        delivery (invariant 4). An expired session lock ends the session as
        :meth:`close_receiver` does; the service detaches those receivers
        with ``session-lock-lost``. A scheduled message whose time came
        becomes available (invariant 6).
        """
        wall = self.wall()
        while self._scheduled and self._scheduled[0][0] <= wall:
            _, _, store, number = heapq.heappop(self._scheduled)
            entry = store.entries.get(number)
            if entry is not None and entry.lock is None and not entry.deferred:
                store.make_available(entry)
                self.on_available(store.path)
        now = self.clock()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, tie, token = heapq.heappop(self._deadlines)
            if not self._stale(deadline, tie, token):
                lock = self._locks[token]
                self._unlock(lock)
                lock.receiver.store.locks.lapsed += 1
                self._return(lock.receiver.store, lock.entry, failed=True)
        lost = [r for r in self._receivers if r.session_id is not None
                and r.session_deadline <= now]
        for receiver in lost:
            self.close_receiver(receiver)
        return lost

    # -- snapshots (the server's --state-file) ----------------------------------

    def snapshot(self) -> Snapshot:
        """Entities, sequence numbers, entries and session states (invariant 8); no I/O."""
        def saved(entry: Entry) -> SavedEntry:
            return SavedEntry(entry.message, entry.sequence_number, entry.enqueued_time,
                              entry.delivery_count, entry.deferred, entry.lock is not None,
                              dict(entry.extra_properties))

        def store(kept: Store) -> SavedStore:
            letters = () if kept.dead_letter is None else kept.dead_letter.entries.values()
            return SavedStore(kept.path, kept.settings, kept.filters,
                              tuple(map(saved, kept.entries.values())),
                              tuple(map(saved, letters)), dict(kept.session_states))

        queues = tuple(store(s) for key, s in self._stores.items() if key in self._sequences)
        return Snapshot(queues, {topic: tuple(map(store, subscriptions))
                                 for topic, subscriptions in self._topics.items()},
                        dict(self._sequences))

    def restore(self, snapshot: Snapshot) -> None:
        """Load ``snapshot`` into this state, which must have no entity yet (invariant 8)."""
        if self._stores or self._topics:
            raise RuntimeError("restore() needs a state without entities")
        for queue in snapshot.queues:
            self.create_queue(queue.path, queue.settings)
        for topic, subscriptions in snapshot.topics.items():
            self.create_topic(topic)
            for subscription in subscriptions:
                name = subscription.path.split("/", 2)[2]
                self.create_subscription(topic, name, subscription.settings,
                                         subscription.filters)
        self._sequences.update(snapshot.next_sequence)
        for saved in (*snapshot.queues, *itertools.chain(*snapshot.topics.values())):
            kept = self._store(saved.path)
            kept.session_states.update(saved.session_states)
            for store, entries in ((kept, saved.entries), (kept.dead_letter, saved.dead_letters)):
                for item in entries:
                    self._restore_entry(store, item)

    def _restore_entry(self, store: Store | None, saved: SavedEntry) -> None:
        if store is None:
            return
        entry = Entry(saved.message, saved.sequence_number, saved.enqueued_time,
                      saved.delivery_count, deferred=saved.deferred,
                      extra_properties=dict(saved.extra_properties))
        store.entries[entry.sequence_number] = entry
        if saved.locked:  # a deferred one stays deferred (invariant 1)
            self._return(store, entry, failed=True)
        elif not entry.deferred:
            self._schedule_or_make_available(store, entry)
            self.on_available(store.path)
