"""The official Service Bus emulator's ``Config.json``, from an entities document.

The emulator (``mcr.microsoft.com/azure-messaging/servicebus-emulator``,
Docker only) creates its entities from a JSON file mounted at start; it has
no management API to create them later. :func:`emulator_config` turns the
test server's *entities document* (see :mod:`.config`) into that file, so a
benchmark or a test suite describes its entities once and runs on either.

What the emulator accepts is narrower than Service Bus, and narrower than
the test server; a document outside it is refused here with one
``ValueError`` naming the entity and the limit, rather than by a container
that fails to start a minute later:

* one namespace, always named ``sbemulatorns``;
* at most 50 queues and topics together, 50 subscriptions per topic;
* lock durations of whole seconds, 5 s to 5 min for a queue and
  1 to 5 min for a subscription; a max delivery count of 1 to 10;
* correlation filters only (the test server has no SQL filters either).

Settings a document leaves out take the test server's defaults
(:class:`~.model.EntitySettings`: a 60 s lock, 10 deliveries), not the
emulator's (3 deliveries), so both backends behave alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharedstream.testing.servicebus.model import EntitySettings

__all__ = ["EMULATOR_NAMESPACE", "MAX_ENTITIES", "emulator_config"]

EMULATOR_NAMESPACE = "sbemulatorns"
"""The one namespace name the emulator accepts."""

MAX_ENTITIES = 50
"""Queues and topics together, per namespace (and subscriptions per topic)."""

_QUEUE_LOCK = (5, 300)
_SUBSCRIPTION_LOCK = (60, 300)
_FILTER_FIELDS = {
    "correlation_id": "CorrelationId", "message_id": "MessageId", "to": "To",
    "reply_to": "ReplyTo", "subject": "Label", "session_id": "SessionId",
    "reply_to_session_id": "ReplyToSessionId", "content_type": "ContentType",
}


def _duration(seconds: int) -> str:
    minutes, rest = divmod(seconds, 60)
    return "PT" + (f"{minutes}M" if minutes else "") + (f"{rest}S" if rest or not minutes else "")


def _properties(entity: Mapping[str, Any], where: str, lock_range: tuple[int, int]
                ) -> dict[str, Any]:
    defaults = EntitySettings()
    lock = entity.get("lock_duration", defaults.lock_duration)
    low, high = lock_range
    if float(lock) != int(lock) or not low <= int(lock) <= high:
        raise ValueError(f"{where}: the emulator takes a lock duration of whole seconds from "
                         f"{low} to {high}, not {lock}")
    deliveries = int(entity.get("max_delivery_count", defaults.max_delivery_count))
    if not 1 <= deliveries <= 10:
        raise ValueError(f"{where}: the emulator takes a max delivery count from 1 to 10, "
                         f"not {deliveries}")
    properties: dict[str, Any] = {
        "LockDuration": _duration(int(lock)), "MaxDeliveryCount": deliveries,
        "RequiresSession": bool(entity.get("requires_session", False)),
        "DeadLetteringOnMessageExpiration": bool(
            entity.get("dead_lettering_on_message_expiration", False)),
        "DefaultMessageTimeToLive": "PT1H"}
    window = entity.get("duplicate_detection_window")
    if window is not None:
        properties.update(RequiresDuplicateDetection=True,
                          DuplicateDetectionHistoryTimeWindow=_duration(int(window)))
    return properties


def _rule(index: int, condition: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = set(condition) - {*_FILTER_FIELDS, "properties"}
    if unknown:
        raise ValueError(f"{where}: unknown filter fields {sorted(unknown)}")
    correlation: dict[str, Any] = {_FILTER_FIELDS[key]: str(value)
                                   for key, value in condition.items() if key in _FILTER_FIELDS}
    if condition.get("properties"):
        correlation["Properties"] = dict(condition["properties"])
    if not correlation:  # matches everything: the emulator wants at least one field
        return {"Name": f"r{index}", "Properties": {"FilterType": "Sql",
                                                    "SqlFilter": {"SqlExpression": "1=1"}}}
    return {"Name": f"r{index}", "Properties": {"FilterType": "Correlation",
                                                "CorrelationFilter": correlation}}


def emulator_config(document: Mapping[str, Any]) -> dict[str, Any]:
    """The emulator's ``Config.json`` (as a dict) creating ``document``'s entities.

    Raises ``ValueError`` naming the first entity the emulator cannot take.
    """
    queues = list(document.get("queues", ()))
    topics = list(document.get("topics", ()))
    if len(queues) + len(topics) > MAX_ENTITIES:
        raise ValueError(f"the emulator takes at most {MAX_ENTITIES} queues and topics, "
                         f"this document has {len(queues) + len(topics)}")
    config_queues = [
        {"Name": queue["name"],
         "Properties": _properties(queue, f"queue {queue['name']!r}", _QUEUE_LOCK)}
        for queue in queues]
    config_topics = []
    for topic in topics:
        subscriptions = list(topic.get("subscriptions", ()))
        if not subscriptions or len(subscriptions) > MAX_ENTITIES:
            raise ValueError(f"topic {topic['name']!r}: the emulator takes 1 to "
                             f"{MAX_ENTITIES} subscriptions, not {len(subscriptions)}")
        entries = []
        for subscription in subscriptions:
            where = f"subscription {topic['name']}/{subscription['name']}"
            entry: dict[str, Any] = {
                "Name": subscription["name"],
                "Properties": _properties(subscription, where, _SUBSCRIPTION_LOCK)}
            filters = subscription.get("filters")
            if filters is not None:
                entry["Rules"] = [_rule(i, f, where) for i, f in enumerate(filters)]
            entries.append(entry)
        config_topics.append({"Name": topic["name"], "Subscriptions": entries})
    return {"UserConfig": {
        "Namespaces": [{"Name": EMULATOR_NAMESPACE, "Queues": config_queues,
                        "Topics": config_topics}],
        "Logging": {"Type": "Console"}}}
