"""Entities to create at start: the command line's specs and a JSON file, in one shape.

Both become one *entities document* that :func:`apply` creates on a
:class:`~.state.ServiceBusState`::

    {"queues": [{"name": "orders", "lock_duration": 5, "max_delivery_count": 3,
                 "requires_session": false, "dead_lettering_on_message_expiration": true,
                 "duplicate_detection_window": 600}],
     "topics": [{"name": "events",
                 "subscriptions": [{"name": "urgent", "lock_duration": 5,
                                    "filters": [{"subject": "urgent"},
                                                {"properties": {"priority": "high"}}]}]}]}

The namespace's own settings (:class:`~.model.Namespace`, read by
:func:`namespace`) are optional top-level fields::

    {"keys": [{"name": "listener", "key": "secret", "rights": ["Listen"]}],
     "max_message_size": 104857600, "next_session_wait": 5}

Without ``keys`` the namespace has one key, ``k`` = ``v`` with every right
(:data:`~.model.DEFAULT_KEY`, what the kit's connection strings carry);
without ``max_message_size``, Standard's 256 KB; without
``next_session_wait`` (seconds), Service Bus's 65 s wait of a
next-available-session attach that names no timeout of its own.

Settings left out take Service Bus's defaults (:class:`~.model.EntitySettings`);
a subscription without ``filters`` gets everything (the ``$Default`` rule).

The command line's specs are ``NAME[:KEY=VALUE,...]``: ``--queue
'orders:lock_duration=5,max_delivery_count=3,sessions'``, ``--topic
events``, ``--subscription 'events/urgent:subject=urgent,property.priority=high'``
(one filter, string values; several filters or typed values need the
JSON file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sharedstream.testing.servicebus.model import (
    NEXT_SESSION_WAIT,
    STANDARD_MAX_MESSAGE_SIZE,
    AccessKey,
    CorrelationFilter,
    EntitySettings,
    Namespace,
    Right,
)
from sharedstream.testing.servicebus.state import ServiceBusState

__all__ = ["apply", "document_from_specs", "namespace", "parse_spec"]

_SETTINGS = {"lock_duration": float, "max_delivery_count": int}
_FILTER_FIELDS = ("correlation_id", "message_id", "to", "reply_to", "subject", "session_id",
                  "reply_to_session_id", "content_type")


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name:key=value,flag"`` as ``("name", {"key": "value", "flag": True})``."""
    name, _, options = spec.partition(":")
    parsed: dict[str, Any] = {}
    for option in filter(None, (part.strip() for part in options.split(","))):
        key, has_value, value = option.partition("=")
        parsed[key.strip()] = value.strip() if has_value else True
    if not name:
        raise ValueError(f"no entity name in {spec!r}")
    return name, parsed


def _flag(value: object) -> bool:
    return value is True or str(value).lower() in ("1", "true")


def _entity(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    entity: dict[str, Any] = {"name": name}
    condition: dict[str, Any] = {}
    for key, value in options.items():
        if key in _SETTINGS:
            entity[key] = _SETTINGS[key](value)
        elif key in ("sessions", "requires_session"):
            entity["requires_session"] = _flag(value)
        elif key == "dead_lettering_on_message_expiration":
            entity[key] = _flag(value)
        elif key == "duplicate_detection_window":
            entity[key] = float(value)
        elif key in _FILTER_FIELDS:
            condition[key] = value
        elif key.startswith("property."):
            condition.setdefault("properties", {})[key.removeprefix("property.")] = value
        else:
            raise ValueError(f"unknown option {key!r} for {name}")
    if condition:
        entity["filters"] = [condition]
    return entity


def document_from_specs(queues: Sequence[str] = (), topics: Sequence[str] = (),
                        subscriptions: Sequence[str] = ()) -> dict[str, Any]:
    """The entities document of the command line's ``--queue``/``--topic``/``--subscription``.

    A subscription's topic is created too when no ``--topic`` names it.
    ``ValueError`` names a malformed spec.
    """
    document: dict[str, Any] = {"queues": [], "topics": []}
    by_topic: dict[str, dict[str, Any]] = {}
    for spec in queues:
        document["queues"].append(_entity(*parse_spec(spec)))
    for spec in topics:
        name, _ = parse_spec(spec)
        by_topic[name] = {"name": name, "subscriptions": []}
    for spec in subscriptions:
        path, options = parse_spec(spec)
        topic, slash, name = path.partition("/")
        if not slash or not name:
            raise ValueError(f"a subscription is TOPIC/NAME, not {path!r}")
        by_topic.setdefault(topic, {"name": topic, "subscriptions": []})
        by_topic[topic]["subscriptions"].append(_entity(name, options))
    document["topics"] = list(by_topic.values())
    return document


def _settings(entity: Mapping[str, Any]) -> EntitySettings:
    defaults = EntitySettings()
    window = entity.get("duplicate_detection_window")
    return EntitySettings(
        lock_duration=float(entity.get("lock_duration", defaults.lock_duration)),
        max_delivery_count=int(entity.get("max_delivery_count", defaults.max_delivery_count)),
        requires_session=bool(entity.get("requires_session", False)),
        dead_lettering_on_message_expiration=bool(
            entity.get("dead_lettering_on_message_expiration", False)),
        duplicate_detection_window=None if window is None else float(window))


def _filter(condition: Mapping[str, Any]) -> CorrelationFilter:
    unknown = set(condition) - {*_FILTER_FIELDS, "properties"}
    if unknown:
        raise ValueError(f"unknown filter fields {sorted(unknown)}")
    return CorrelationFilter(**{key: condition[key] for key in _FILTER_FIELDS
                                if key in condition},
                             properties=dict(condition.get("properties", {})))


def apply(state: ServiceBusState, document: Mapping[str, Any]) -> None:
    """Create the queues, topics and subscriptions of ``document`` on ``state``.

    Raises ``ValueError`` (a malformed document) or :class:`~.model.Refused`
    (an entity that exists already) at the first problem; what came before
    it stays created.
    """
    for queue in document.get("queues", ()):
        state.create_queue(queue["name"], _settings(queue))
    for topic in document.get("topics", ()):
        state.create_topic(topic["name"])
        for subscription in topic.get("subscriptions", ()):
            if "duplicate_detection_window" in subscription:
                raise ValueError(f"subscription {subscription['name']!r}: duplicate detection "
                                 "is a queue's setting (the test server has none for topics)")
            filters = subscription.get("filters")
            state.create_subscription(
                topic["name"], subscription["name"], _settings(subscription),
                (CorrelationFilter(),) if filters is None else [_filter(f) for f in filters])


def _key(entry: Mapping[str, Any]) -> AccessKey:
    rights = entry.get("rights", [right.value for right in Right])
    try:
        return AccessKey(str(entry["name"]), str(entry["key"]),
                         frozenset(Right(str(right)) for right in rights))
    except KeyError as exc:
        raise ValueError(f"a key needs a name and a key, not {dict(entry)!r}") from exc
    except ValueError as exc:
        raise ValueError(f"key rights are Listen, Send or Manage, not {list(rights)!r}") from exc


def namespace(document: Mapping[str, Any]) -> Namespace:
    """The namespace settings of ``document``: its keys, message size and next-session wait.

    ``ValueError`` names a malformed key, size or wait.
    """
    keys = document.get("keys")
    return Namespace(tuple(map(_key, keys)) if keys else Namespace().keys,
                     int(document.get("max_message_size", STANDARD_MAX_MESSAGE_SIZE)),
                     float(document.get("next_session_wait", NEXT_SESSION_WAIT)))
