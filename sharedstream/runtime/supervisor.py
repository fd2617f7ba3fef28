"""Supervision of one trigger: rebuild it, run it, record its failures, restart it.

:meth:`Supervisor.supervise` is the task the triggerer runs per trigger. A
trigger that raises is recorded in the store (error and traceback) and
restarted with exponential backoff (back to the initial delay after
:data:`STABLE_AFTER` seconds of running). The backoff of a shared-stream
filter is per raw event: a failure on another raw event than the last one
starts from the initial delay again, so one bad record's delays never carry
over to the next, and the broker's redelivery limit dead-letters each bad
record after the same few seconds. The delay logged is the one waited
(a member waits at most half the ack timeout). One whose class is not
registered, whose stored kwargs cannot be decrypted, or whose broker
refused its stream's settings for good is marked failed and not restarted.
``cleanup()`` always runs. A shared-stream trigger is a durable member of
its stream, kept across restarts (:class:`Attempt`); every event it yields
is packed here and offered to the persistence gate with its seq, and a
payload the store could not take rejects its raw event instead.

The store holds a trigger's current error, not its history: a recorded
error is cleared once the trigger has run :data:`STABLE_AFTER` seconds
without failing again, or when a standalone trigger finishes (the count
and time stay). Stopping is not failing: an exception raised while the
supervisor is being cancelled is the stop's (nothing logged, recorded or
restarted), and a failure after the triggerer's stop began
(:attr:`Supervisor.stopping`) is recorded but not restarted.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any

from sharedstream.brokerkit.errors import BrokerConfigError
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.manager import SharedStreamManager
from sharedstream.engine.membership import Membership
from sharedstream.engine.telemetry import instruments
from sharedstream.engine.trigger import BaseEventTrigger, BaseTrigger
from sharedstream.runtime.config import TriggererConfig
from sharedstream.runtime.crypto import KwargsCipher
from sharedstream.runtime.persist import PersistGate
from sharedstream.runtime.registry import TriggerRegistry
from sharedstream.runtime.serde import SerializationError, pack_event_payload, unpack_kwargs
from sharedstream.store import MetadataStore, PendingEvent, TriggerRow

__all__ = [
    "CLEANUP_TIMEOUT",
    "STABLE_AFTER",
    "Attempt",
    "Progress",
    "Supervisor",
    "TriggerEnded",
    "Unrunnable",
    "pending_event",
]

log = key_value_logger("sharedstream.runtime")

CLEANUP_TIMEOUT = 10.0
"""Seconds one trigger's ``cleanup()`` may take before it is abandoned."""

STABLE_AFTER = 60.0
"""A trigger that ran this many seconds before failing restarts with the initial backoff;
one with a recorded error that runs this long without failing has the error cleared."""


class TriggerEnded(SharedStreamError):
    """A watcher's filter or ``run()`` ended in a way a watcher must not (restarted)."""

    retryable = True


def _raise_if_stopping(exc: Exception) -> None:
    """Raise ``CancelledError`` from ``exc`` if the running task is being cancelled.

    Code that turns a cancellation into another exception (a client library
    raising "connection closed" when its call is cancelled, a filter that
    wraps it) would otherwise be recorded as the trigger's failure and
    restart it after the stop was asked for, keeping the shutdown waiting.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


class Unrunnable(SharedStreamError):
    """The trigger cannot be built at all (unregistered class, undecryptable kwargs)."""


@dataclass
class Attempt:
    """A supervised trigger's membership of its stream, kept across restarts."""

    trigger_id: int
    member: Membership | None = None
    failed_on: str | None = None  # the raw event the last failure was on (its backoff's)
    erred: bool = False  # the store holds an error of the trigger that it has not outrun yet


@dataclass
class Progress:
    """What the triggerer counts for its progress lines and stop summary."""

    running: int = 0
    restarts: int = 0
    refused: int = 0  # events whose payload could not be stored (their raw events rejected)
    fallbacks: int = 0  # raw events kept in the store's dead-letter table
    unrunnable: int = 0  # triggers marked failed for good (cannot be built)


class Supervisor:
    """Runs the triggers of one triggerer, each in its own :meth:`supervise` task."""

    def __init__(
        self, *, config: TriggererConfig, cipher: KwargsCipher, registry: TriggerRegistry,
        manager: SharedStreamManager, gate: PersistGate, progress: Progress,
        store: Callable[[], MetadataStore],
        db: Callable[..., Awaitable[Any]],
    ) -> None:
        """``store`` gives the open store; ``db`` runs a call on the database thread."""
        self._config = config
        self._cipher = cipher
        self._registry = registry
        self._manager = manager
        self._gate = gate
        self.progress = progress
        self._store = store
        self._db = db
        self._last_shared_error: BaseException | None = None
        self.stopping = False
        """Set by the triggerer when its graceful stop begins: a trigger that fails from
        then on is recorded but not restarted (its supervisor returns)."""
        self.stable_after = STABLE_AFTER
        """Seconds of running without failing after which a trigger's backoff starts
        afresh and its recorded error is cleared (tests shorten it)."""

    def rehydrate(self, row: TriggerRow) -> BaseTrigger:
        """The trigger of ``row``, built from its class and decrypted kwargs.

        Raises :class:`Unrunnable` when it cannot be built at all.
        """
        try:
            kwargs = unpack_kwargs(self._cipher.decrypt(row.kwargs_blob))
            trigger = self._registry.rehydrate(row.classpath, kwargs)
        except (SharedStreamError, TypeError, ValueError) as exc:
            raise Unrunnable(str(exc)) from exc
        trigger.trigger_id = row.id
        return trigger

    async def supervise(self, row: TriggerRow) -> None:
        """Run ``row``'s trigger until it finishes for good, restarting it with backoff.

        Returns when a standalone trigger finished, or when the trigger cannot
        run at all (marked failed); cancelled at shutdown. An exception the
        trigger's code (or its SDK, or leaving its stream) raises once the
        task is being cancelled is the stop's doing, not a failure: nothing is
        logged or recorded, no restart follows, and ``CancelledError`` is
        raised from it. A trigger with a recorded error that then runs
        :attr:`stable_after` seconds without failing (or finishes) has that
        error cleared in the store.
        """
        tconf = self._config
        backoff = tconf.restart_backoff_initial
        delay = 0.0  # before consuming (a kept subscription) or before starting again
        attempt = Attempt(row.id, erred=row.last_error is not None)
        loop = asyncio.get_running_loop()
        while True:
            try:
                trigger = self.rehydrate(row)
            except Unrunnable as exc:
                log.error("not running a trigger",  # noqa: TRY400 - the reason is it
                          trigger=row.id, classpath=row.classpath, error=exc)
                await self._give_up(attempt, str(exc), "")
                return
            if attempt.member is None and delay:
                await asyncio.sleep(delay)  # not a member: back off before starting again
                delay = 0.0
            started = loop.time()
            finished = False
            self.progress.running += 1
            instruments().triggers_running.add(1)
            try:
                finished = await self._run_watched(attempt, trigger, delay)
            except BrokerConfigError as exc:
                _raise_if_stopping(exc)
                # The broker refused the stream's settings for good (no such subscription,
                # queue or topic; no permission): restarting cannot help. Said once for the
                # stream, recorded for each of its triggers, which are marked failed.
                if exc is not self._last_shared_error:
                    log.error("trigger cannot run; marked failed, not restarted (nor the "  # noqa: TRY400
                              "other triggers of its stream)", trigger=row.id,
                              classpath=row.classpath, error=exc)
                self._last_shared_error = exc
                await self._give_up(attempt, f"{type(exc).__name__}: {exc}",
                                    "".join(traceback.format_exception(exc)))
                return
            except Exception as exc:  # noqa: BLE001 - the trigger's own code failed
                _raise_if_stopping(exc)
                # Any failure of the trigger's own code: record it, restart it (unless the
                # triggerer is stopping: the broker redelivers what it was on).
                backoff = self._backoff(attempt, backoff, loop.time() - started)
                await self._failed(row, attempt, exc, backoff)
                if self.stopping:
                    return
            finally:
                self.progress.running -= 1
                instruments().triggers_running.add(-1)
                await self._cleanup(row.id, trigger)
            if finished:
                if attempt.erred:
                    await self._clear_error(attempt)
                await self._note_state(row.id, "finished")
                return
            self.progress.restarts += 1
            delay = backoff
            backoff = min(backoff * 2, tconf.restart_backoff_max)

    async def _failed(self, row: TriggerRow, attempt: Attempt, exc: Exception,
                      backoff: float) -> None:
        """Log and record a failure of the trigger's code; ``backoff``: the delay before the next.

        An error every trigger of a stream gets at once (its poll ended) is
        logged once, for the first of them; each records it.
        """
        if exc is not self._last_shared_error:
            if self.stopping:
                log.warning("trigger failed while stopping; not restarted", trigger=row.id,
                            classpath=row.classpath, error=exc, raw_event=attempt.failed_on)
            else:
                log.warning("trigger failed; restarting", trigger=row.id,
                            classpath=row.classpath, error=exc,
                            delay_s=round(self._waited(attempt, backoff), 2),
                            raw_event=attempt.failed_on)
        self._last_shared_error = exc
        await self._note_error(row.id, f"{type(exc).__name__}: {exc}",
                               "".join(traceback.format_exception(exc)))
        attempt.erred = True

    async def _give_up(self, attempt: Attempt, message: str, traceback_text: str) -> None:
        """The trigger cannot run at all: leave its stream, record why, mark it failed."""
        await self._release(attempt)
        await self._note_error(attempt.trigger_id, message, traceback_text)
        await self._note_state(attempt.trigger_id, "failed")
        self.progress.unrunnable += 1

    async def _run_watched(self, attempt: Attempt, trigger: BaseTrigger, delay: float) -> bool:
        """:meth:`_run_once`, clearing a recorded error once it ran :attr:`stable_after` seconds.

        The watch is a task this call owns: cancelled and awaited before it
        returns or raises, whatever ends the attempt.
        """
        if not attempt.erred:
            return await self._run_once(attempt, trigger, delay)
        watch = asyncio.create_task(self._clear_error_after(attempt, delay + self.stable_after),
                                    name=f"sharedstream-trigger[{attempt.trigger_id}]-recovery")
        try:
            return await self._run_once(attempt, trigger, delay)
        finally:
            watch.cancel()
            await asyncio.wait({watch})  # never raises: our own cancellation stays ours

    async def _clear_error_after(self, attempt: Attempt, seconds: float) -> None:
        """Clear the trigger's recorded error if its attempt is still running ``seconds`` later."""
        await asyncio.sleep(seconds)
        await self._clear_error(attempt)

    async def _clear_error(self, attempt: Attempt) -> None:
        """The trigger works again: say so, and clear its last error in the store."""
        attempt.erred = False
        log.info("trigger runs again; its last error is cleared", trigger=attempt.trigger_id)
        store = self._store()
        await self._note("no error", attempt.trigger_id,
                         partial(store.clear_trigger_error, attempt.trigger_id))

    def _backoff(self, attempt: Attempt, backoff: float, ran_for: float) -> float:
        """The backoff after a failure, from ``backoff`` (the one before).

        The initial one again after a stable run, or when the failure was on
        another raw event than the last (noted in ``attempt``).
        """
        failed_on = None if attempt.member is None else attempt.member.failed_on
        another = failed_on is not None and failed_on != attempt.failed_on
        attempt.failed_on = failed_on
        if another or ran_for >= self.stable_after:
            return self._config.restart_backoff_initial
        return backoff

    def _waited(self, attempt: Attempt, delay: float) -> float:
        """The delay a restart with backoff ``delay`` waits.

        A member caps it at half the ack timeout (see
        :meth:`~sharedstream.engine.membership.Membership.run_attempt`).
        """
        if attempt.member is None or attempt.member.left:
            return delay
        return min(delay, self._manager.ack_timeout / 2)

    async def _note_error(self, trigger_id: int, message: str, traceback_text: str) -> None:
        """Record an error of the trigger (see :meth:`_note`)."""
        store = self._store()
        await self._note("an error", trigger_id,
                         partial(store.record_trigger_error, trigger_id, message, traceback_text))

    async def _note_state(self, trigger_id: int, state: str) -> None:
        """Record the trigger's new state (see :meth:`_note`)."""
        store = self._store()
        await self._note(f"state {state}", trigger_id,
                         partial(store.set_trigger_state, trigger_id, state))

    async def _note(self, what: str, trigger_id: int, record: Callable[[], None]) -> None:
        """Record trigger bookkeeping in the store; a failure is logged, not raised.

        Losing an error note must not stop the supervisor (and with it the
        triggerer): the trigger keeps being supervised either way.
        """
        try:
            await self._db(record)
        except Exception:
            # Only the record is lost; the log line carries the same facts.
            log.exception("could not record a trigger's state in the store", what=what,
                          trigger=trigger_id)

    async def _release(self, attempt: Attempt) -> None:
        member, attempt.member = attempt.member, None
        if member is not None:
            await member.leave()

    async def _cleanup(self, trigger_id: int, trigger: BaseTrigger) -> None:
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT):
                await trigger.cleanup()
        except Exception:
            # cleanup() is best-effort by contract; its failure is only logged.
            log.exception("cleanup() of a trigger failed", trigger=trigger_id)

    async def _run_once(self, attempt: Attempt, trigger: BaseTrigger, delay: float) -> bool:
        """Run one attempt; return True when a standalone trigger finished for good."""
        trigger_id = attempt.trigger_id
        if isinstance(trigger, BaseEventTrigger):
            key = trigger.shared_stream_key()
            if key is not None:
                await self._run_shared(attempt, trigger, key, delay)
                return False
        fired = 0
        async for event in trigger.run():
            await self._store_event(trigger_id, event)
            fired += 1
        if not fired:
            raise TriggerEnded(f"trigger {trigger_id}: run() ended without firing an event")
        return True

    async def _run_shared(
        self, attempt: Attempt, trigger: BaseEventTrigger, key: Hashable, delay: float
    ) -> None:
        """One attempt of a shared-stream trigger's filter, as a durable member of ``key``.

        ``Membership.run_attempt`` waits ``delay`` (events queue for the member
        meanwhile), fails the raw event a failed, hung or ended filter was on,
        and raises what ended the attempt; the supervisor records it and
        restarts. Cancelled (shutdown): the trigger leaves its stream.
        """
        member = attempt.member
        if member is None or member.left:
            member = attempt.member = self._manager.join(
                trigger_id=attempt.trigger_id, trigger=trigger, key=key
            )
        try:
            await member.run_attempt(partial(self._consume, member, trigger), delay=delay)
        except asyncio.CancelledError:
            await self._release(attempt)
            raise

    async def _consume(
        self, member: Membership, trigger: BaseEventTrigger, stream: AsyncIterator[Any]
    ) -> None:
        """Run the filter over ``stream``; queue every event it yields for storing, bound."""
        trigger_id = member.trigger_id
        assert isinstance(trigger_id, int)  # noqa: S101 - the runtime's ids are row ids
        native = trigger.payload_is_native
        offer = self._gate.offer
        traced = self._manager.tracer_provider is not None
        async for event in trigger.filter_shared_stream(stream):
            seq = member.bind()
            try:
                pending = pending_event(trigger_id, event, member.raw_event_identity(),
                                              native, member.traceparent() if traced else None)
            except SerializationError as exc:
                self._refuse_event(member, exc)  # rejecting drops the seq just bound
                continue
            if not offer(pending, seq):  # the gate's queue is full: wait for room
                await self._gate.put(pending, seq)

    def _refuse_event(self, member: Membership, exc: SerializationError) -> None:
        """An event whose payload the store cannot take: reject its raw event, with the reason."""
        detail = str(exc)
        if len(detail) > 300:
            detail = detail[:297] + "..."
        reason = f"the trigger event cannot be stored: {detail}"
        self.progress.refused += 1
        instruments().events_refused.add(1)
        if member.reject(reason):
            log.warning("trigger event cannot be stored; rejecting its raw event",
                        trigger=member.trigger_id, reason=reason)
        else:
            log.error("trigger event cannot be stored; the event is dropped",
                      trigger=member.trigger_id, reason=reason)

    async def _store_event(self, trigger_id: int, event: TriggerEvent) -> None:
        """Queue an event of a standalone trigger (not gated, no idempotency key)."""
        await self._gate.put(pending_event(trigger_id, event, None), None)


def pending_event(
    trigger_id: int, event: TriggerEvent, identity: tuple[str, str | None] | None,
    native: Callable[[TriggerEvent], bool] | None = None, traceparent: str | None = None,
) -> PendingEvent:
    """What the gate stores for ``event``: its packed payload, idempotency key and fingerprint.

    ``identity`` is the member's ``raw_event_identity()`` (``None``: not
    idempotent); ``native`` is the trigger's ``payload_is_native``, asked
    once the event is known to be a :class:`TriggerEvent`; ``traceparent``
    the trace context of the filter span it came from (tracing on).
    """
    if not isinstance(event, TriggerEvent):
        raise TypeError(f"trigger {trigger_id} yielded {type(event).__qualname__}, "
                        "not a TriggerEvent")
    vouched = native is not None and native(event)
    payload = pack_event_payload(event.payload, native=vouched)
    if identity is None:
        return PendingEvent(trigger_id, None, payload, traceparent)
    name, fingerprint = identity
    return PendingEvent(trigger_id, f"{trigger_id}/{name}", payload, traceparent, fingerprint)
