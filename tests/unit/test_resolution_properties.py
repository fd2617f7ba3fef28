"""Stateful property test: the resolution book against a slow, obviously-correct model.

Hypothesis drives random interleavings of subscribe, unsubscribe, fan-out,
pulls, binds, persist confirmations, rejects, force-failures, clock ticks
and advances, and checks after every step:

* nothing is advanced twice, and each lane is advanced in fan-out order;
* an advanced event's outcome equals the model's: every snapshot subscriber
  moved past it with all derived events confirmed (acked), rejected it, or
  failed - so nothing is advanced early;
* acked + failed + rejected equals the snapshot size;
* at most one advance is in flight;
* once everyone leaves and every confirmation lands, nothing is outstanding;
* durable members (``durable=True``) stay in the snapshot across failed
  attempts: a failed attempt fails only the event it was on, an overdue
  event fails for them alone, and the rest of that event's lane fails for
  them (unseen) until it is advanced - so a member never sees a lane out of
  order, and nothing is resolved as done for it while it is away.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sharedstream import AdvanceItem, AdvanceOutcome
from sharedstream.engine.ack_subscriber import AckSubscriber
from sharedstream.engine.fanout import PASS_ALL, FanOut, KeyedPrefilter
from sharedstream.engine.records import EventRecord
from sharedstream.engine.resolution import ResolutionBook
from sharedstream.engine.stream import ack_stream

CAPACITY = 3
ACK_TIMEOUT = 5.0
LANES = ("a", "b")


@dataclass
class ModelEvent:
    lane: str
    created_at: float
    snapshot: set[int]
    resolution: dict[int, str | None] = field(default_factory=dict)


@dataclass
class ModelSub:
    queue: list[int] = field(default_factory=list)
    current: int | None = None
    failed: bool = False
    departed: bool = False
    accept: Callable[[Any], bool] | None = None
    durable: bool = False
    fences: dict[str, int] = field(default_factory=dict)  # lane -> the event that failed

    def accepts(self, raw: str) -> bool:
        return self.accept is None or self.accept(raw)


def _declines_every_third(sub_id: int) -> Callable[[Any], bool]:
    """A prefilter declining the raw events ``raw{n}`` with ``n % 3 == sub_id % 3``."""
    return lambda raw: int(raw[3:]) % 3 != sub_id % 3


def _select_mod3(raw: str) -> Any:
    n = int(raw[3:])
    return PASS_ALL if n % 5 == 4 else n % 3


def _keyed_every_third(sub_id: int) -> KeyedPrefilter:
    """One shape for all: accepts ``raw{n}`` with ``n % 3 == sub_id % 3``, and all n % 5 == 4.

    The fan-out answers all of them with one selection and a lookup; the
    model asks each test on its own, so any difference between the two fails.
    """
    return KeyedPrefilter("mod3", _select_mod3, sub_id % 3)


class BookMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = ResolutionBook(key="k", fanout=FanOut(CAPACITY), ack_timeout=ACK_TIMEOUT)
        self.subs: dict[int, AckSubscriber] = {}
        self.model_subs: dict[int, ModelSub] = {}
        self.events: list[ModelEvent] = []
        self.moved_past: set[tuple[int, int]] = set()
        self.unconfirmed: dict[tuple[int, int], set[int]] = {}
        self.seq_owner: dict[int, tuple[int, int]] = {}
        self.now = 0.0
        self.next_id = 0
        self.in_flight: list[AdvanceItem] | None = None
        self.in_flight_lane: Hashable = None
        self.advanced: list[int] = []
        self.streams: dict[int, AsyncGenerator[Any, None]] = {}

    # -- model helpers ---------------------------------------------------------

    def live_ids(self) -> list[int]:
        return [i for i, m in self.model_subs.items() if not m.failed and not m.departed]

    def settle(self, sub_id: int, pos: int) -> None:
        event = self.events[pos]
        if (
            event.resolution[sub_id] is None
            and (sub_id, pos) in self.moved_past
            and not self.unconfirmed.get((sub_id, pos))
        ):
            event.resolution[sub_id] = "acked"

    def model_fail(self, sub_id: int) -> None:
        m = self.model_subs[sub_id]
        m.failed = True
        queued = set(m.queue)  # never pulled: an unseen failure
        m.queue.clear()
        m.current = None
        for pos, event in enumerate(self.events):
            if event.resolution.get(sub_id, "x") is None:
                event.resolution[sub_id] = "unseen" if pos in queued else "failed"
                self.drop_seqs(sub_id, pos)

    def fence(self, sub_id: int, pos: int) -> None:
        """Event ``pos`` failed for durable ``sub_id``: its lane's queued events fail too."""
        m = self.model_subs[sub_id]
        lane = self.events[pos].lane
        for queued in [q for q in m.queue if self.events[q].lane == lane]:
            m.queue.remove(queued)
            self.events[queued].resolution[sub_id] = "unseen"
        m.fences[lane] = pos

    def durable_full(self) -> bool:
        return any(self.model_subs[i].durable and len(self.model_subs[i].queue) >= CAPACITY
                   for i in self.live_ids())

    def drop_seqs(self, sub_id: int, pos: int) -> None:
        for seq in self.unconfirmed.pop((sub_id, pos), set()):
            del self.seq_owner[seq]

    # -- rules -----------------------------------------------------------------

    @rule(prefilter=st.sampled_from([None, "plain", "keyed"]), durable=st.booleans())
    def subscribe(self, prefilter: str | None, durable: bool) -> None:
        sub_id = self.next_id
        self.next_id += 1
        accept = (None if prefilter is None else _declines_every_third(sub_id)
                  if prefilter == "plain" else _keyed_every_third(sub_id))
        self.subs[sub_id] = self.book.add_subscriber(sub_id, accept, durable=durable)
        self.model_subs[sub_id] = ModelSub(accept=accept, durable=durable)

    @precondition(lambda self: self.live_ids())
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(self.live_ids()))
        self.book.remove_subscriber(sub_id)
        m = self.model_subs[sub_id]
        m.departed = True
        for pos in m.queue:
            self.events[pos].resolution[sub_id] = "unseen"
        m.queue.clear()
        if m.current is not None:
            self.moved_past.add((sub_id, m.current))
            self.settle(sub_id, m.current)
            m.current = None

    @precondition(lambda self: not self.durable_full())  # the poll holds (back-pressure)
    @rule(lane=st.sampled_from(LANES), data=st.data())
    def broadcast(self, lane: str, data: st.DataObject) -> None:
        pos = len(self.events)
        live = self.live_ids()
        event = ModelEvent(lane, self.now, set(live), dict.fromkeys(live))
        self.events.append(event)
        raw = f"raw{pos}"
        # Now and then a redelivery for some subscribers only (delivery_audience).
        audience = data.draw(st.none() | st.frozensets(st.sampled_from(sorted(self.subs) or [0])))
        overflowed = self.book.broadcast(raw, pos, lane, self.now, audience) or []
        declined = {i for i in live if not self.model_subs[i].accepts(raw)}
        expected = {
            i for i in live if i not in declined and len(self.model_subs[i].queue) >= CAPACITY
        }
        assert {s.trigger_id for s in overflowed} == expected
        for sub_id in live:
            if sub_id in declined:  # its prefilter said no: done with it at once
                event.resolution[sub_id] = "acked"
            elif audience is not None and sub_id not in audience:
                event.resolution[sub_id] = "acked"  # resolved an earlier delivery
                if sub_id in expected:  # its inbox is full all the same: it leaves
                    self.model_fail(sub_id)
            elif sub_id in expected:
                event.resolution[sub_id] = "unseen"  # never reached its inbox
                self.model_fail(sub_id)
            elif lane in self.model_subs[sub_id].fences:
                event.resolution[sub_id] = "unseen"  # fenced: comes again after the failed one
            else:
                self.model_subs[sub_id].queue.append(pos)

    def pull_through_stream(self, sub_id: int) -> EventRecord:
        """Step the real subscriber iterator once, synchronously (it must not park)."""
        sub = self.subs[sub_id]
        stream = self.streams.setdefault(sub_id, ack_stream(self.book, sub))
        with pytest.raises(StopIteration) as step:  # yielded without suspending
            stream.asend(None).send(None)
        assert sub.current is not None
        assert step.value.value == sub.current.raw
        return sub.current

    @precondition(lambda self: self.live_ids())
    @rule(data=st.data(), through_stream=st.booleans())
    def pull(self, data: st.DataObject, through_stream: bool) -> None:
        sub_id = data.draw(st.sampled_from(self.live_ids()))
        sub = self.subs[sub_id]
        record: EventRecord | None
        if through_stream and sub.inbox:
            record = self.pull_through_stream(sub_id)
        else:
            record = self.book.next_record(sub)
        m = self.model_subs[sub_id]
        if m.current is not None:
            self.moved_past.add((sub_id, m.current))
            self.settle(sub_id, m.current)
        m.current = m.queue.pop(0) if m.queue else None
        assert (record.position if record else None) == m.current

    @precondition(lambda self: self.live_ids())
    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(self.live_ids()))
        seq = self.book.bind(self.subs[sub_id])
        current = self.model_subs[sub_id].current
        assert (seq is None) == (current is None)
        if seq is not None and current is not None:
            self.seq_owner[seq] = (sub_id, current)
            self.unconfirmed.setdefault((sub_id, current), set()).add(seq)

    @precondition(lambda self: self.seq_owner)
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seq_owner)))
        sub = self.book.router.route(seq)
        assert sub is not None
        self.book.confirm(sub, seq)
        sub_id, pos = self.seq_owner.pop(seq)
        self.unconfirmed[(sub_id, pos)].discard(seq)
        self.settle(sub_id, pos)

    @precondition(lambda self: self.live_ids())
    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(self.live_ids()))
        m = self.model_subs[sub_id]
        assert self.book.reject(self.subs[sub_id]) == (m.current is not None)
        if m.current is not None:
            self.events[m.current].resolution[sub_id] = "rejected!"
            self.drop_seqs(sub_id, m.current)
            m.current = None

    @precondition(lambda self: any(self.model_subs[i].durable for i in self.live_ids()))
    @rule(data=st.data())
    def fail_attempt(self, data: st.DataObject) -> None:
        """A durable member's filter raised: only the event it was on fails."""
        sub_id = data.draw(st.sampled_from(
            [i for i in self.live_ids() if self.model_subs[i].durable]))
        self.book.fail_attempt(self.subs[sub_id], RuntimeError("filter raised"))
        self.streams.pop(sub_id, None)  # the next attempt has a new iterator
        m = self.model_subs[sub_id]
        if m.current is not None:
            self.events[m.current].resolution[sub_id] = "failed!"
            self.drop_seqs(sub_id, m.current)
            self.fence(sub_id, m.current)
            m.current = None

    @precondition(lambda self: self.live_ids())
    @rule(data=st.data())
    def force_fail(self, data: st.DataObject) -> None:
        sub_id = data.draw(st.sampled_from(self.live_ids()))
        self.book.fail(self.subs[sub_id], RuntimeError("forced"))
        self.model_fail(sub_id)

    @rule(dt=st.sampled_from([0.5, 2.0, 5.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        expired = {sub.trigger_id for sub, _ in self.book.expire(self.now)}
        expected: set[int] = set()
        for pos, event in enumerate(self.events):
            if event.created_at + ACK_TIMEOUT > self.now:
                continue
            for sub_id, resolution in event.resolution.items():
                if resolution is not None:
                    continue
                expected.add(sub_id)
                m = self.model_subs[sub_id]
                if not m.durable or m.departed:
                    self.model_fail(sub_id)
                elif pos == m.current:  # hung on it: its own failure; the attempt ends
                    event.resolution[sub_id] = "failed!"
                    self.drop_seqs(sub_id, pos)
                    self.fence(sub_id, pos)
                    m.current = None
                    self.book.fail_attempt(self.subs[sub_id], RuntimeError("interrupted"))
                    self.streams.pop(sub_id, None)
                elif pos in m.queue:  # never pulled it (behind or away)
                    m.queue.remove(pos)
                    event.resolution[sub_id] = "unseen"
                    self.fence(sub_id, pos)
                else:  # moved past it, derived events unconfirmed (a slow store)
                    event.resolution[sub_id] = "unseen"
                    self.drop_seqs(sub_id, pos)
        assert expired == expected

    @precondition(lambda self: self.in_flight is None and self.book.ready)
    @rule(data=st.data())
    def start_advance(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(sorted(self.book.ready, key=str)))
        batch = self.book.take_batch(lane)
        assert batch
        self.in_flight, self.in_flight_lane = batch, lane
        for item in batch:  # being advanced: the fences it put up come down
            for m in self.model_subs.values():
                if m.fences.get(str(lane)) == item.broker_payload:
                    del m.fences[str(lane)]

    @precondition(lambda self: self.in_flight is not None)
    @rule()
    def finish_advance(self) -> None:
        assert self.in_flight is not None
        for item in self.in_flight:
            pos = item.broker_payload
            event = self.events[pos]
            assert event.lane == self.in_flight_lane
            assert None not in event.resolution.values(), "advanced before resolution"
            acked, failed, said, rejected, unseen = (
                sum(r == kind for r in event.resolution.values())
                for kind in ("acked", "failed", "failed!", "rejected!", "unseen")
            )
            assert item.outcome == AdvanceOutcome(acked, failed + said + unseen, rejected)
            assert item.outcome.unseen == unseen, (item.outcome, event.resolution)
            # Who failed on it (with a reason) or rejected it is named: nobody else.
            named = {i for i, r in event.resolution.items() if r in ("failed!", "rejected!")}
            assert {v.trigger_id for v in item.outcome.verdicts} == named
            # Who did not ack it is named too: a redelivery is for them alone.
            assert item.outcome.needed_by() == frozenset(
                i for i, r in event.resolution.items() if r != "acked")
            assert sum(item.outcome) == len(event.snapshot)
            assert pos not in self.advanced, "advanced twice"
            earlier = [p for p in self.advanced if self.events[p].lane == event.lane]
            assert all(p < pos for p in earlier), "lane order broken"
            self.advanced.append(pos)
        self.in_flight = None

    # -- invariants ------------------------------------------------------------

    @invariant()
    def unconfirmed_seqs_match_model(self) -> None:
        assert self.book.router.unconfirmed() == set(self.seq_owner)

    def teardown(self) -> None:
        """Everyone leaves, every confirmation lands: nothing may stay outstanding."""
        if self.in_flight is not None:
            self.finish_advance()
        for sub_id in list(self.live_ids()):
            self.book.remove_subscriber(sub_id)
        for seq in self.book.router.unconfirmed():
            sub = self.book.router.route(seq)
            assert sub is not None
            self.book.confirm(sub, seq)
        while self.book.ready:
            self.book.take_batch(next(iter(self.book.ready)))
        assert not self.book.lanes, "events left outstanding"
        for stream in self.streams.values():
            with contextlib.suppress(StopIteration):
                stream.aclose().send(None)
        assert not self.book.router.unconfirmed()
        assert self.book.next_deadline() is None


BookMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=60, deadline=None)
TestResolutionBook = BookMachine.TestCase
