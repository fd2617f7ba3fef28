"""A raw event's identity: its producer's name and fingerprint, asked once per raw event."""

from __future__ import annotations

from typing import Any

from sharedstream import SharedStreamManager, SharedStreamProducer
from tests.engine.harness import Feed, FeedProducer, FeedTrigger, MemberRunner, eventually


class _Named(FeedProducer):
    def raw_event_name(self, broker_payload: Any) -> str | None:
        return f"log/{broker_payload}"


class _Fingerprinted(_Named):
    asked: list[Any] = []  # noqa: RUF012 - one test at a time reads it

    def raw_event_fingerprint(self, broker_payload: Any) -> str | None:
        self.asked.append(broker_payload)
        return f"fp-{broker_payload}"


class _NamedTrigger(FeedTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return _Named(super().create_shared_stream_producer(kwargs).feed)  # type: ignore[attr-defined]


class _FingerprintedTrigger(FeedTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return _Fingerprinted(super().create_shared_stream_producer(kwargs).feed)  # type: ignore[attr-defined]


async def test_the_fingerprint_comes_with_the_key_asked_once_per_raw_event(feed: Feed) -> None:
    _Fingerprinted.asked = []
    manager = SharedStreamManager()
    runners = [MemberRunner(manager, _FingerprintedTrigger("f", name), i).start()
               for i, name in enumerate(("a", "b"), start=1)]
    feed.push(7, 8)
    await eventually(lambda: all(len(r.identities) == 2 for r in runners))
    for runner in runners:
        assert runner.identities == [("log/7#0", "fp-7"), ("log/8#0", "fp-8")]
    assert _Fingerprinted.asked == [7, 8]  # not once per subscriber
    await manager.stop_all()


async def test_a_producer_without_fingerprints_names_events_alone(feed: Feed) -> None:
    manager = SharedStreamManager()
    runner = MemberRunner(manager, _NamedTrigger("f", "a"), 1).start()
    feed.push(7)
    await eventually(lambda: len(runner.identities) == 1)
    assert runner.identities == [("log/7#0", None)]
    await manager.stop_all()


async def test_an_unnamed_raw_event_has_no_identity(feed: Feed) -> None:
    manager = SharedStreamManager()
    runner = MemberRunner(manager, FeedTrigger("f", "a"), 1).start()
    feed.push(7)
    await eventually(lambda: len(runner.identities) == 1)
    assert runner.identities == [None]
    await manager.stop_all()
