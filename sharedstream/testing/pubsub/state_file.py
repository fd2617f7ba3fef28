"""The test server's optional state file (``--state-file``): what survives a restart.

Off by default (the server keeps everything in memory). With a state file,
the service writes a :class:`~.state.Snapshot` after every call that may
have changed something (every unary call, every request written on a
stream, every sweep), and loads it on start: topics, subscriptions and
their unsettled messages - ids, data, attributes, ordering keys, publish
times and delivery attempts - come back, as Pub/Sub keeps them. Leases do
not: what was leased is delivered again, under a new ack id, as after an
expiry.

Invariants:

1. A write replaces the file atomically (a temporary file renamed over
   it), so a server killed at any moment leaves the last complete snapshot.
2. A call is answered only after its write: a message whose ``Publish``
   returned, and a subscription whose ``CreateSubscription`` returned,
   survive a SIGKILL. An ack may be lost with a kill between a stream's
   request and its write; the message is then delivered again
   (at-least-once, as Pub/Sub itself).
3. Delivery attempts counted by ``StreamingPull`` itself are written with
   the next write, so a kill may forget the last few.

The format is JSON, private to this module: a file written by one version
of the kit is not promised to load in another.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

from google.pubsub_v1 import types

from sharedstream.testing.json_snapshots import read_snapshot, replace_snapshot
from sharedstream.testing.pubsub.state import (
    Message,
    PubSubState,
    Snapshot,
    SubscriptionSettings,
    SubscriptionSnapshot,
)

__all__ = ["StateFile"]

_FORMAT = 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _spec_bytes(spec: object) -> str:
    serialize = getattr(spec, "SerializeToString")  # noqa: B009 - a raw protobuf, untyped
    return _b64(serialize())


class StateFile:
    """Saves and loads one server's state at ``path`` (see the module's invariants)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, state: PubSubState) -> bool:
        """Restore ``state`` (still empty) from the file; ``False`` if there is no file yet."""
        document = read_snapshot(self.path)
        if document is None:
            return False
        state.restore(_decode(document))
        return True

    def save(self, state: PubSubState) -> None:
        """Write ``state``'s snapshot, replacing the file atomically."""
        replace_snapshot(self.path, _encode(state.snapshot()))


def _encode(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "next_id": snapshot.next_id,
        "topics": {name: _spec_bytes(spec) for name, spec in snapshot.topics.items()},
        "subscriptions": [{
            "name": sub.name, "topic": sub.topic, "spec": _spec_bytes(sub.spec),
            "settings": dataclasses.asdict(sub.settings),
            "entries": [[m.message_id, _b64(m.data), dict(m.attributes), m.ordering_key,
                         m.publish_time, attempts] for m, attempts in sub.entries],
        } for sub in snapshot.subscriptions],
    }


def _decode(data: dict[str, Any]) -> Snapshot:
    if data.get("format") != _FORMAT:
        raise ValueError(f"unknown state file format {data.get('format')!r}")
    topic_type = types.Topic.pb()
    subscription_type = types.Subscription.pb()
    return Snapshot(
        next_id=int(data["next_id"]),
        topics={name: topic_type.FromString(base64.b64decode(spec))
                for name, spec in data["topics"].items()},
        subscriptions=tuple(SubscriptionSnapshot(
            name=sub["name"], topic=sub["topic"],
            spec=subscription_type.FromString(base64.b64decode(sub["spec"])),
            settings=SubscriptionSettings(**sub["settings"]),
            entries=tuple(
                (Message(message_id, base64.b64decode(body), attributes, key, publish_time),
                 int(attempts))
                for message_id, body, attributes, key, publish_time, attempts in sub["entries"]),
        ) for sub in data["subscriptions"]),
    )
