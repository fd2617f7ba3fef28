"""Brokers that cannot replay one watcher say why, in one line, before anything is read."""

from __future__ import annotations

import pytest

from sharedstream.engine.replay import ReplayError

pytest.importorskip("google.pubsub_v1")


def test_pubsub_refuses_a_replay_naming_the_seek_it_would_take() -> None:
    from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger  # noqa: PLC0415

    kwargs = PubSubSharedStreamTrigger(project="p", subscription="s").serialize()[1]
    producer = PubSubSharedStreamTrigger.create_shared_stream_producer(kwargs)
    with pytest.raises(ReplayError) as refused:
        producer.replay_source()
    assert str(refused.value) == (
        "Pub/Sub cannot replay one watcher: a seek rewinds the whole subscription (every "
        "watcher of it, and the live stream). Give the watcher a subscription of its own and "
        "seek that one")
