"""Fan-out: bounded per-subscriber inboxes fed by one broadcast loop.

Invariants:

* Every item broadcast while a subscriber is *live* lands in its inbox in
  broadcast order, or - if the inbox already holds ``capacity`` items - the
  subscriber is reported as overflowed and receives nothing more.
* A terminal error is held in its own slot, never in the inbox, so it
  reaches the subscriber even when the inbox is full; the inbox is emptied
  when the error is set, so nothing stale is delivered after it.
* A subscriber that is parked (waiting on an empty inbox) is woken exactly
  when an item or an error arrives.
* A subscriber with an ``accept`` test (its trigger's
  ``shared_stream_prefilter``) receives only the items whose raw event the
  test accepts; an item it declines is counted in ``FanOut.skipped`` and
  never reaches its inbox. A test that raises is switched off for that
  subscriber: its filter sees that raw event and every later one.
* :meth:`FanOut.declined` says how many raw events a subscriber's test
  declined while it was live. Its cost: one integer add per broadcast that
  asks tests and one per subscriber that receives the item; nothing per
  subscriber that declines, and nothing while no live subscriber has a test.
* Subscribers whose tests are :class:`KeyedPrefilter` objects of one shape
  cost one ``select`` call per raw event between them (then a dict lookup),
  and receive exactly what each test, asked on its own, would accept.
* A *durable* subscriber never overflows: once its inbox is full the poll
  must not broadcast again until it has room (:meth:`FanOut.full_member`,
  :meth:`FanOut.wait_for_room`). A slow durable subscriber is back-pressure
  on its stream, not a failure.

This module holds no resolution bookkeeping and never awaits; the async
iterators in :mod:`sharedstream.engine.stream` read from it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Final, cast

from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["PASS_ALL", "Accept", "FanOut", "KeyedPrefilter", "Subscriber"]

log = key_value_logger("sharedstream.fanout")

Accept = Callable[[Any], bool]
"""A subscriber's prefilter: ``accept(raw_event)`` is false for raw events it would ignore."""

PASS_ALL: Final[Any] = object()
"""What a :class:`KeyedPrefilter`'s ``select`` returns to let a raw event through to all."""


class KeyedPrefilter:
    """A prefilter that compares one selection from the raw event with a wanted value.

    ``select(raw_event)`` returns a value (typically a tuple of the fields a
    match looks at) or :data:`PASS_ALL` when every subscriber must see the
    raw event (one that does not decode, say); the test accepts when the
    selection is :data:`PASS_ALL` or equals ``wanted``. Called on its own it
    is an ordinary ``accept(raw_event) -> bool``.

    Sharing: prefilters with equal ``shape`` (a hashable) promise that their
    ``select`` functions return equal values for every raw event. The
    fan-out then calls ``select`` once per raw event for all of them and
    finds the accepting subscribers with one dict lookup on the selection
    (``wanted`` must be hashable for that; an unhashable one, or an
    unhashable selection, falls back to comparing), so N watchers of the
    same field cost one selection instead of N tests. ``select`` follows the
    rules of any prefilter: cheap, no side effects; if it raises, the test
    is switched off for every subscriber of its shape.
    """

    __slots__ = ("select", "shape", "wanted")

    def __init__(self, shape: Hashable, select: Callable[[Any], Any], wanted: Any) -> None:
        self.shape, self.select, self.wanted = shape, select, wanted

    def __call__(self, raw_event: Any) -> bool:
        """Whether this test alone accepts ``raw_event``."""
        got = self.select(raw_event)
        return got is PASS_ALL or bool(got == self.wanted)

    def __repr__(self) -> str:
        return f"KeyedPrefilter(shape={self.shape!r}, wanted={self.wanted!r})"


class _Shape:
    """The live subscribers whose :class:`KeyedPrefilter` tests share one shape."""

    __slots__ = ("by_wanted", "members", "select")

    def __init__(self, select: Callable[[Any], Any]) -> None:
        self.select = select
        self.members: list[Subscriber] = []
        self.by_wanted: dict[Any, list[Subscriber]] = {}

    def add(self, sub: Subscriber, wanted: Any) -> None:
        self.members.append(sub)
        self.by_wanted.setdefault(wanted, []).append(sub)

    def remove(self, sub: Subscriber, wanted: Any) -> None:
        _remove_by_identity(self.members, sub)
        subs = self.by_wanted[wanted]
        _remove_by_identity(subs, sub)
        if not subs:
            del self.by_wanted[wanted]

    def accepting(self, got: Any) -> list[Subscriber]:
        """The members whose test accepts a raw event whose selection is ``got``."""
        if got is PASS_ALL:
            return self.members
        try:
            return self.by_wanted.get(got, _NONE)
        except TypeError:  # an unhashable selection (a list, say): compare one by one
            return [sub for sub in self.members if _keyed(sub).wanted == got]


_NONE: Final[list[Any]] = []  # never mutated: what _Shape.accepting returns for no match


def _keyed(sub: Subscriber) -> KeyedPrefilter:
    return cast("KeyedPrefilter", sub.accept)  # only shape members get here


def _shape_of(accept: Accept | None) -> tuple[Hashable, Any] | None:
    """``(shape, wanted)`` when ``accept`` can join a shared shape (both hashable)."""
    if not isinstance(accept, KeyedPrefilter):
        return None
    try:
        hash(accept.shape)
        hash(accept.wanted)
    except TypeError:
        return None
    return accept.shape, accept.wanted


def _remove_by_identity(subs: list[Subscriber], sub: Subscriber) -> bool:
    for index, candidate in enumerate(subs):
        if candidate is sub:
            del subs[index]
            return True
    return False


class Subscriber:
    """One trigger's inbox in a group, plus the fields the async iterator parks on.

    ``waiter`` is the future the iterator awaits while the inbox is empty;
    ``error`` is the terminal exception the iterator raises once set;
    ``accept`` is the optional prefilter of the raw events it receives;
    ``durable`` makes its full inbox hold the poll instead of overflowing.
    ``passed``, ``tested_from`` and ``tested_until`` are the fan-out's count
    of what its test let through (see :meth:`FanOut.declined`).
    """

    __slots__ = ("accept", "durable", "error", "inbox", "passed", "tested_from", "tested_until",
                 "trigger_id", "waiter")

    def __init__(
        self, trigger_id: Hashable, accept: Accept | None = None, *, durable: bool = False
    ) -> None:
        self.trigger_id = trigger_id
        self.accept = accept
        self.durable = durable
        self.inbox: deque[Any] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.passed = 0  # items of tested broadcasts it received (or overflowed on)
        self.tested_from = 0  # the fan-out's tested broadcasts when it became live
        self.tested_until: int | None = None  # ... and when it stopped being live

    def wake(self) -> None:
        """Release the parked iterator, if any. Safe to call at any time."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def set_error(self, error: BaseException) -> None:
        """Make ``error`` the next thing the iterator raises; drop undelivered items.

        The first error wins: a subscriber fails for one reason.
        """
        if self.error is None:
            self.error = error
        self.inbox.clear()
        self.wake()


class FanOut:
    """The live subscribers of one group and the broadcast loop over them.

    ``capacity`` bounds every inbox. ``crowded`` is set by :meth:`broadcast`
    when some inbox is at least half full: the poll then yields to the event
    loop so subscribers can drain before anyone overflows. Subscribers that
    wait on an empty inbox register in ``parked`` and are woken once per
    broadcast, so the per-subscriber loop only touches inboxes. While some
    live subscriber has an ``accept`` test, broadcasts take a second loop
    that asks the tests (one ``select`` per shape of :class:`KeyedPrefilter`)
    and wakes only the subscribers that received the item; ``skipped`` then
    says how many declined the last one.
    """

    __slots__ = (
        "_filtered", "_high_water", "_inboxes", "_plain", "_room", "_shapes", "_single",
        "blocked_on",
        "capacity", "crowded", "durable", "live", "parked", "skipped", "tested",
    )  # fmt: skip

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"subscriber queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._high_water = max(1, capacity // 2)
        self.live: list[Subscriber] = []
        self._inboxes: list[deque[Any]] = []
        # Insertion-ordered set: a woken subscriber leaves it in O(1) (see _deliver).
        self.parked: dict[Subscriber, None] = {}
        self.crowded = False
        self.skipped = 0
        self.tested = 0  # broadcasts that asked some subscriber's test (see declined)
        self._filtered = 0  # live subscribers with an accept test
        self._plain: list[Subscriber] = []  # live, outside any shape (accept may be None)
        self._shapes: dict[Hashable, _Shape] = {}  # live, KeyedPrefilter tests by shape
        # The only shape when no subscriber is outside one (the usual case: N watchers
        # of one field), else None; kept by _regroup so broadcasts need not look.
        self._single: tuple[Hashable, _Shape] | None = None
        self.durable: list[Subscriber] = []  # live durable subscribers
        self.blocked_on: Subscriber | None = None  # the full durable inbox the poll waits on
        self._room: asyncio.Future[None] | None = None

    def broadcast(self, item: Any, raw: Any) -> list[Subscriber] | None:
        """Append ``item`` (carrying ``raw``) to every live inbox that accepts ``raw``.

        Returns the subscribers that overflowed: they did not receive
        ``item`` and are no longer live; the caller decides how they fail.
        Returns ``None`` (not an empty list) in the common case, to keep this
        loop allocation-free. Afterwards ``skipped`` counts the live
        subscribers whose ``accept`` declined ``raw``.
        """
        if self._filtered:
            return self._broadcast_filtered(item, raw)
        high_water = self._high_water
        crowded = False
        full: list[deque[Any]] | None = None
        for inbox in self._inboxes:
            if len(inbox) >= high_water:
                if len(inbox) >= self.capacity:
                    if full is None:
                        full = []
                    full.append(inbox)
                    continue
                crowded = True
            inbox.append(item)
        self.crowded = crowded
        self.skipped = 0
        if self.parked:
            parked, self.parked = self.parked, {}
            for sub in parked:
                sub.wake()
        if full is None:
            return None
        overflowed = [sub for sub in self.live if any(sub.inbox is inbox for inbox in full)]
        for sub in overflowed:
            self.drop(sub)
        return overflowed

    def _broadcast_filtered(self, item: Any, raw: Any) -> list[Subscriber] | None:
        """:meth:`broadcast` when some subscriber has an ``accept`` test."""
        self.tested += 1
        single = self._single
        if single is not None:  # the usual case: N watchers of one field
            shape_key, shape = single
            try:
                got = shape.select(raw)
            except Exception:  # noqa: BLE001 - logged with its traceback
                self._switch_off(shape.members)
                return self._deliver(item, self._retire_shape(shape_key), 0)
            chosen = shape.accepting(got)
            return self._deliver(item, chosen, len(shape.members) - len(chosen))
        skipped = 0
        receivers: list[Subscriber] = []
        for sub in self._plain:
            accept = sub.accept
            if accept is not None:
                try:
                    wanted = accept(raw)
                except Exception:  # noqa: BLE001 - logged with its traceback
                    # Switched off for good (one warning, not one per raw event): its
                    # filter sees every raw event from now on, this one included.
                    self._switch_off([sub])
                    wanted = True
                if not wanted:
                    skipped += 1
                    continue
            receivers.append(sub)
        broken: list[Hashable] | None = None
        for shape_key, shape in self._shapes.items():
            try:
                got = shape.select(raw)
            except Exception:  # noqa: BLE001 - logged with its traceback
                self._switch_off(shape.members)  # moved out of the shapes below
                broken = [shape_key] if broken is None else [*broken, shape_key]
                receivers.extend(shape.members)
                continue
            chosen = shape.accepting(got)
            skipped += len(shape.members) - len(chosen)
            receivers.extend(chosen)
        if broken is not None:
            for shape_key in broken:
                self._retire_shape(shape_key)
        return self._deliver(item, receivers, skipped)

    def _retire_shape(self, shape_key: Hashable) -> list[Subscriber]:
        """Move a shape's members (their tests switched off) to the plain loop."""
        members = self._shapes.pop(shape_key).members
        self._plain.extend(members)
        self._regroup()
        return members

    def _regroup(self) -> None:
        """Refresh ``_single`` after the plain list or the shapes changed."""
        shapes = self._shapes
        self._single = next(iter(shapes.items())) if len(shapes) == 1 and not self._plain else None

    def _deliver(
        self, item: Any, receivers: list[Subscriber], skipped: int
    ) -> list[Subscriber] | None:
        high_water = self._high_water
        capacity = self.capacity
        crowded = False
        overflowed: list[Subscriber] | None = None
        parked = self.parked
        for sub in receivers:
            sub.passed += 1  # the one per-delivery cost of FanOut.declined
            inbox = sub.inbox
            if len(inbox) >= high_water:
                if len(inbox) >= capacity:
                    if overflowed is None:
                        overflowed = []
                    overflowed.append(sub)
                    continue
                crowded = True
            inbox.append(item)
            waiter = sub.waiter
            if waiter is not None:  # Subscriber.wake, inlined: once per delivery
                sub.waiter = None
                if not waiter.done():
                    waiter.set_result(None)
                # Per receiver, not a sweep of every parked subscriber: at K = 1000
                # selective watchers a sweep per raw event was most of the work.
                parked.pop(sub, None)
        self.crowded = crowded
        self.skipped = skipped
        if overflowed is not None:
            for sub in overflowed:
                self.drop(sub)
        return overflowed

    def _switch_off(self, subs: list[Subscriber]) -> None:
        """Drop the tests of ``subs`` (they raised): their filters get every raw event.

        Call it while handling the exception: the warning carries its traceback.
        """
        log.warning(
            "shared-stream prefilter raised; switched off, the filter gets every raw event",
            triggers=[sub.trigger_id for sub in subs],
            exc_info=True,
        )
        for sub in subs:
            sub.accept = None
        self._filtered -= len(subs)

    # -- back-pressure of durable subscribers -----------------------------------------

    def full_member(self) -> Subscriber | None:
        """A live durable subscriber whose inbox is full, or ``None``.

        The poll asks after a broadcast that left the fan-out ``crowded``
        and must not broadcast again while this returns a subscriber.
        """
        capacity = self.capacity
        for sub in self.durable:
            if len(sub.inbox) >= capacity:
                return sub
        return None

    async def wait_for_room(self, sub: Subscriber, recheck: float) -> None:
        """Wait until ``sub``'s inbox is down to half, it leaves, or ``recheck`` seconds pass.

        The subscriber's iterator calls :meth:`relieve` as it pulls.
        """
        room = self._room = asyncio.get_running_loop().create_future()
        self.blocked_on = sub
        try:
            await asyncio.wait([room], timeout=recheck)
        finally:
            self.blocked_on = self._room = None

    def relieve(self, sub: Subscriber) -> None:
        """``sub`` pulled: release the waiting poll once its inbox is down to half."""
        if self.blocked_on is sub and len(sub.inbox) <= self._high_water:
            self._wake_poll()

    def _wake_poll(self) -> None:
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    # -- membership ------------------------------------------------------------------

    def declined(self, sub: Subscriber) -> int:
        """Raw events ``sub``'s test declined since it was made live, until it was dropped.

        They never reached its inbox. Every live subscriber without a test,
        or whose test accepted, is handed the item of a broadcast that asks
        tests (a full inbox overflows after that), and broadcasts that ask
        none reach every live subscriber; so the declined ones are the
        tested broadcasts of its live time less what it was handed. Read on
        the event loop.
        """
        until = self.tested if sub.tested_until is None else sub.tested_until
        return until - sub.tested_from - sub.passed

    def add(self, sub: Subscriber) -> None:
        """Make ``sub`` live: it is in the snapshot of every later broadcast."""
        sub.passed, sub.tested_from, sub.tested_until = 0, self.tested, None
        self.live.append(sub)
        self._inboxes.append(sub.inbox)
        if sub.durable:
            self.durable.append(sub)
        if sub.accept is not None:
            self._filtered += 1
        keyed = _shape_of(sub.accept)
        if keyed is None:
            self._plain.append(sub)
        else:
            shape_key, wanted = keyed
            shape = self._shapes.get(shape_key)
            if shape is None:
                shape = self._shapes[shape_key] = _Shape(_keyed(sub).select)
            shape.add(sub, wanted)
        self._regroup()

    def drop(self, sub: Subscriber) -> None:
        """Stop broadcasting to ``sub``. Idempotent."""
        # By identity: two inboxes holding equal items compare equal.
        for index, candidate in enumerate(self.live):
            if candidate is sub:
                sub.tested_until = self.tested
                del self.live[index]
                del self._inboxes[index]
                if sub.durable:
                    _remove_by_identity(self.durable, sub)
                    if self.blocked_on is sub:
                        self._wake_poll()
                if sub.accept is not None:
                    self._filtered -= 1
                if not _remove_by_identity(self._plain, sub):
                    shape_key, wanted = cast("tuple[Hashable, Any]", _shape_of(sub.accept))
                    shape = self._shapes[shape_key]
                    shape.remove(sub, wanted)
                    if not shape.members:
                        del self._shapes[shape_key]
                self._regroup()
                return

    def fail_all(self, error: BaseException) -> None:
        """Deliver ``error`` to every live subscriber and stop broadcasting to them."""
        subs, self.live, self._inboxes = self.live, [], []
        for sub in subs:
            sub.tested_until = self.tested
        self.durable = []
        self._wake_poll()
        self._filtered = 0
        self._plain, self._shapes, self._single = [], {}, None
        for sub in subs:
            sub.set_error(error)
