"""``SharedStreamManager``: the runner-facing entry point of the engine.

The manager maps each shared-stream key to one live :class:`StreamGroup`
and routes the runner's calls to it. It is single-event-loop and not
thread-safe; the trigger runner is its only owner. Group membership changes
are synchronous, so a key is in the map only while its poll is alive (see
:mod:`sharedstream.engine.group`).

Besides plain subscriptions, the manager keeps a *roster* of durable
members per key (:meth:`SharedStreamManager.join`, see
:mod:`sharedstream.engine.membership`): every group it creates for a key starts
with the key's whole roster subscribed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterable
from typing import Any, cast

from opentelemetry.trace import TracerProvider

from sharedstream.engine.errors import DuplicateSubscription, InvalidStreamKey
from sharedstream.engine.fanout import Accept
from sharedstream.engine.group import IntakeValve, StreamGroup
from sharedstream.engine.keyvalue_log import KeyValueLogger, key_value_logger
from sharedstream.engine.membership import Membership
from sharedstream.engine.names import STREAM_NAMES, stream_name
from sharedstream.engine.producer import DeadLetterFallback, FailureLedger
from sharedstream.engine.pump import StreamTotals
from sharedstream.engine.seqs import SeqRouter
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = ["DEFAULT_ACK_TIMEOUT", "DEFAULT_SUBSCRIBER_QUEUE_MAX", "SharedStreamManager"]

log = key_value_logger("sharedstream.stream")

DEFAULT_SUBSCRIBER_QUEUE_MAX = 1024
"""Raw events a subscriber may have pending before it is failed (``max_subscriber_queue``)."""

DEFAULT_ACK_TIMEOUT = 300.0
"""Seconds every subscriber has to resolve a raw event in ack mode (``ack_timeout``)."""


class SharedStreamManager:
    """One group per shared-stream key; every raw event to every live subscriber.

    :param max_subscriber_queue: raw events a subscriber may have pending
        before it is force-failed with :class:`SubscriberOverflow`.
    :param ack_timeout: seconds after fan-out within which every subscriber
        must resolve an event (ack mode) or fail with :class:`AckTimeout`.
    :param cohort_grace_period: seconds a new group waits before polling, so
        triggers re-subscribing together all make the first snapshot.
    :param clock: monotonic clock in seconds for ack deadlines (injectable
        for tests).
    :param log: the logger of the manager's own lines (Airflow passes the
        triggerer's), by default the ``sharedstream.stream`` logger; they are
        written structlog-style (``log.debug("msg", key=value)``), so a
        ``logging.Logger`` is wrapped in a
        :class:`~sharedstream.engine.keyvalue_log.KeyValueLogger`, and any
        other object must take key-values as keyword arguments (a structlog
        logger does). The groups log to ``sharedstream.stream``.
    :param tracer_provider: an OpenTelemetry tracer provider: ack-mode
        groups then trace each raw event (see
        :mod:`sharedstream.engine.tracing`). ``None`` (the default): no spans.
    """

    def __init__(
        self,
        *,
        max_subscriber_queue: int = DEFAULT_SUBSCRIBER_QUEUE_MAX,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        cohort_grace_period: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        log: Any = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if max_subscriber_queue < 1:
            raise ValueError(f"max_subscriber_queue must be >= 1, got {max_subscriber_queue}")
        if not ack_timeout > 0:
            raise ValueError(f"ack_timeout must be > 0 seconds, got {ack_timeout}")
        if not cohort_grace_period >= 0:
            raise ValueError(f"cohort_grace_period must be >= 0 seconds, got {cohort_grace_period}")
        self._max_subscriber_queue = max_subscriber_queue
        self._ack_timeout = ack_timeout
        self._cohort_grace_period = cohort_grace_period
        self._clock = clock
        self.tracer_provider = tracer_provider
        """Where ack-mode groups make spans (:mod:`sharedstream.engine.tracing`); ``None``: off."""
        self.log: Any = (
            log if log is not None else logging.getLogger("sharedstream.stream"))
        """Where the manager's own lines go (``log=``, as given)."""
        self._log: Any = (
            KeyValueLogger(self.log) if isinstance(self.log, logging.Logger) else self.log)
        self._groups: dict[Hashable, StreamGroup] = {}
        self._rosters: dict[Hashable, dict[Hashable, Membership]] = {}
        # Persist-confirmation seqs are unique per manager, shared by all groups.
        self._router = SeqRouter()
        self.intake = IntakeValve()
        """Closed by the runtime while its store is behind: every poll holds."""
        self.dead_letter_fallback: DeadLetterFallback | None = None
        """Given to every producer created from now on (see ``SharedStreamProducer``)."""
        self.failure_ledger: FailureLedger | None = None
        """Given to every producer created from now on (see ``SharedStreamProducer``)."""
        self.totals = StreamTotals()
        """Raw events advanced by every group of this manager, by outcome."""

    @property
    def ack_timeout(self) -> float:
        """Seconds every subscriber has to resolve an event (ack mode)."""
        return self._ack_timeout

    def subscribe(
        self, *, trigger_id: Hashable, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]:
        """Subscribe ``trigger`` to the group of ``key`` and return its raw-event iterator.

        Synchronous; call it from inside the running event loop. The first
        subscriber of a key creates the group from its own class and
        serialized kwargs, and starts the poll. The subscriber is in the
        snapshot of every event broadcast after this call. Feed the returned
        iterator to ``trigger.filter_shared_stream``. The iterator yields only
        the raw events ``trigger.shared_stream_prefilter()`` accepts (all of
        them when it returns ``None``); the others count as processed by
        this trigger with no event.

        Raises :class:`InvalidStreamKey` (a ``ValueError``) for a ``None`` or
        unhashable key and :class:`DuplicateSubscription` (a
        ``RuntimeError``) if ``trigger_id`` is already subscribed to the live
        group of ``key``.
        """
        _check_key(key)
        roster = self._rosters.get(key)
        if roster is not None and trigger_id in roster:
            raise DuplicateSubscription(
                f"trigger {trigger_id!r} is already a member of shared stream "
                f"{self.stream_name(key, trigger)}"
            )
        return self.live_group(key, trigger).subscribe(trigger_id, _prefilter(trigger))

    def join(
        self, *, trigger_id: Hashable, trigger: BaseEventTrigger, key: Hashable
    ) -> Membership:
        """Make ``trigger`` a durable member of the stream of ``key``.

        Synchronous. Unlike :meth:`subscribe`, the member stays in the
        snapshot of every raw event of ``key`` - across failed attempts of
        its filter and across groups - until :meth:`Membership.leave`; see
        :mod:`sharedstream.engine.membership`. Consume with
        :meth:`Membership.stream` (the group starts then, if it is not
        running). Raises like :meth:`subscribe` for a bad key or a trigger
        id already subscribed or joined.
        """
        _check_key(key)
        name = self.stream_name(key, trigger)
        roster = self._rosters.setdefault(key, {})
        group = self._groups.get(key)
        if trigger_id in roster or (group is not None and group.has_subscriber(trigger_id)):
            raise DuplicateSubscription(
                f"trigger {trigger_id!r} is already subscribed to shared stream {name}"
            )
        member = Membership(
            self, trigger_id=trigger_id, trigger=trigger, key=key, accept=_prefilter(trigger)
        )
        roster[trigger_id] = member
        if group is not None:
            member.attach(group)
        return member

    def live_group(self, key: Hashable, trigger: BaseEventTrigger) -> StreamGroup:
        """The running group of ``key``; if none, start one from ``trigger`` with the roster in it.

        The new group's poll is created from ``trigger``'s class and
        serialized kwargs; every durable member of ``key`` is subscribed
        before the poll starts. Synchronous; call it inside the event loop.
        """
        group = self._groups.get(key)
        if group is not None:
            return group
        _, kwargs = trigger.serialize()
        group = StreamGroup(
            key=key,
            name=self.stream_name(key, trigger),
            trigger_class=type(trigger),
            kwargs=kwargs,
            max_subscriber_queue=self._max_subscriber_queue,
            ack_timeout=self._ack_timeout,
            cohort_grace_period=self._cohort_grace_period,
            clock=self._clock,
            router=self._router,
            on_terminate=self._evict,
            valve=self.intake,
            dead_letter_fallback=self.dead_letter_fallback,
            failure_ledger=self.failure_ledger,
            totals=self.totals,
            tracer_provider=self.tracer_provider,
        )
        group.start()  # first: outside a running loop this raises, leaving no dead group
        for member in self._rosters.get(key, {}).values():
            member.attach(group)
        self._groups[key] = group
        self._log.debug("shared stream started", stream=group.name, ack_mode=group.ack_mode)
        return group

    @staticmethod
    def stream_name(key: Hashable, trigger: BaseEventTrigger | None = None) -> str:
        """The name of the stream of ``key``, given now (from ``trigger``) if it has none yet.

        One name per key for the life of the process, in every log line,
        error, metric and dead letter of the stream (see
        :mod:`sharedstream.engine.names`): ``trigger``'s
        ``shared_stream_name()``, with a digest of the key appended when
        another stream already has that name. Synchronous and cheap.
        """
        if trigger is None:
            return stream_name(key)
        return STREAM_NAMES.name(key, trigger.shared_stream_name())

    async def release(self, member: Membership) -> None:
        """Take ``member`` off its roster and out of its group (``Membership.leave``)."""
        roster = self._rosters.get(member.key)
        if roster is not None and roster.get(member.trigger_id) is member:
            del roster[member.trigger_id]
            if not roster:
                del self._rosters[member.key]
        await self.unsubscribe(member.trigger_id, member.key)

    def bind_pending_event(self, *, trigger_id: Hashable, key: Hashable) -> int | None:
        """Bind the trigger event the subscriber just emitted to the raw event it is on.

        Call it right after taking the event from the filter, before any
        ``await``. Returns the seq to pass to :meth:`confirm_persisted` once
        the event is durably stored, or ``None`` when nothing waits on it
        (fast path, group gone, no open window). O(1).
        """
        group = self._groups.get(key)
        return None if group is None else group.bind(trigger_id)

    def raw_event_key(self, *, trigger_id: Hashable, key: Hashable) -> str | None:
        """Identify the trigger event just bound, stably across redeliveries.

        Call it right after :meth:`bind_pending_event`. Returns
        ``"<name>#<index>"``: the producer's name of the raw event (see
        ``SharedStreamProducer.raw_event_name``) and the event's index among
        those the subscriber derived from this delivery of it. A redelivered
        message yields the same keys, so a store can skip what it already
        has. ``None`` on the fast path, with no bound event in the open
        window, or when the producer does not name its events.
        """
        group = self._groups.get(key)
        if group is None:
            return None
        return group.raw_event_key(trigger_id)

    def confirm_persisted(self, seqs: Iterable[int]) -> None:
        """Record that the trigger events behind ``seqs`` are durably stored.

        Unknown seqs (already confirmed, or whose subscriber failed or whose
        group ended) are ignored. O(len(seqs)). Seqs are unique per manager
        and carry their subscriber, so the manager's :class:`SeqRouter`
        takes each straight to the book that bound it (no group lookup).
        """
        self._router.confirm(seqs)

    def refuse_persisted(self, seq: int, reason: str) -> None:
        """The store refused, for good, the trigger event behind ``seq``.

        Its raw event resolves as *rejected* for the subscriber that bound
        it (redelivering it would fail the same way), with ``reason`` in the
        outcome's verdicts. Unknown seqs are ignored.
        """
        self._router.refuse(seq, reason)

    def streams(self) -> list[tuple[Hashable, StreamGroup | None, list[Hashable]]]:
        """``(key, live group or None, durable member ids)`` for every key in use.

        A key is in use while it has durable members (:meth:`join`) or a live
        group; ``None`` means its members wait for a new group (the last poll
        ended; their restart starts one). A fresh list, read on the event
        loop, changing nothing: for status views and readiness checks.
        """
        keys = [*self._rosters, *(key for key in self._groups if key not in self._rosters)]
        return [(key, self._groups.get(key), list(self._rosters.get(key, ()))) for key in keys]

    def lag(self) -> list[tuple[Hashable, Hashable, int]]:
        """``(key, trigger_id, queued)`` for every subscriber with raw events queued."""
        behind: list[tuple[Hashable, Hashable, int]] = []
        for key, group in self._groups.items():
            for trigger_id, queued in group.queued().items():
                if queued:
                    behind.append((key, trigger_id, queued))
        return behind

    def fail_subscriber(
        self, *, trigger_id: Hashable, key: Hashable, error: BaseException
    ) -> None:
        """Force-fail a subscriber whose filter raised, before unsubscribing it.

        Every event it still owes - including the one its filter was on when
        it raised - resolves as *failed*, so the broker redelivers it rather
        than committing an event nobody finished. (A plain
        :meth:`unsubscribe` counts the event the filter was on as done, which
        is right for a filter that was cancelled between events.) No-op for
        unknown subscribers and on the fast path.
        """
        group = self._groups.get(key)
        if group is not None:
            group.fail_subscriber(trigger_id, error)

    def has_group(self, key: Hashable) -> bool:
        """Whether a live group exists for ``key``."""
        return key in self._groups

    async def unsubscribe(self, trigger_id: Hashable, key: Hashable) -> None:
        """Remove a subscriber; the last one out stops the group.

        Events the subscriber had not pulled resolve as failed; the one it was
        on resolves as acked once its derived events are confirmed. When the
        group empties it is evicted first (a new subscriber gets a fresh
        group) and then stopped: resolved events are advanced and the producer
        closed before this returns.
        """
        group = self._groups.get(key)
        if group is None:
            return
        group.unsubscribe(trigger_id)
        if group.is_empty():
            del self._groups[key]
            await group.stop()
            self._log.debug("shared stream stopped: last subscriber left", stream=group.name)

    async def stop_all(self) -> None:
        """Stop every group (triggerer shutdown): evict all, then stop each in turn.

        Each group advances what was resolved and closes its producer before
        this returns. As in Airflow, nothing is raised into subscribers still
        attached: their iterators wait until the tasks consuming them are
        cancelled, so trigger code sees shutdown as ``CancelledError``. The
        caller owns those tasks and must cancel them (before or after this
        call; the triggerer cancels them first).
        """
        for roster in self._rosters.values():
            for member in roster.values():
                member.left = True
        self._rosters.clear()
        groups = list(self._groups.values())
        self._groups.clear()
        for group in groups:
            await group.stop()

    def _evict(self, group: StreamGroup) -> None:
        if self._groups.get(group.key) is group:
            del self._groups[group.key]


def _check_key(key: Hashable) -> None:
    if key is None:
        raise InvalidStreamKey("a shared stream key must not be None")
    try:
        hash(key)
    except TypeError as exc:
        raise InvalidStreamKey(
            f"a shared stream key must be hashable, got {type(key).__qualname__}"
        ) from exc


def _prefilter(trigger: BaseEventTrigger) -> Accept | None:
    """``trigger.shared_stream_prefilter()``, or ``None`` (every raw event) if it raises."""
    try:
        accept: object = trigger.shared_stream_prefilter()
    except Exception:
        log.warning(
            "shared_stream_prefilter() raised; the filter gets every raw event",
            trigger_class=type(trigger).__qualname__,
            exc_info=True,
        )
        return None
    if accept is None:
        return None
    if not callable(accept):
        log.warning(
            "shared_stream_prefilter() returned no callable; the filter gets every raw event",
            trigger_class=type(trigger).__qualname__,
            returned=type(accept).__qualname__,
        )
        return None
    return cast("Accept", accept)
