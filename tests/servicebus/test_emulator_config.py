"""The official emulator's Config.json from an entities document (pure translation).

The emulator itself needs Docker, which CI does not have; what can be
checked here is that the file we would mount says what the document says,
in the emulator's schema, and that documents it cannot take are refused
before any container starts.
"""

from __future__ import annotations

from typing import Any

import pytest

from sharedstream.testing.brokers.containers import servicebus_emulator_container
from sharedstream.testing.servicebus.emulator_config import emulator_config


def test_queues_topics_subscriptions_and_filters_in_the_emulators_shape() -> None:
    config = emulator_config({
        "queues": [{"name": "orders", "lock_duration": 5, "max_delivery_count": 3},
                   {"name": "sessions", "requires_session": True}],
        "topics": [{"name": "events", "subscriptions": [
            {"name": "all"},
            {"name": "urgent", "lock_duration": 90,
             "filters": [{"subject": "urgent"}, {"properties": {"priority": "high"}}]},
            {"name": "nothing-set", "filters": [{}]},
        ]}],
    })
    (namespace,) = config["UserConfig"]["Namespaces"]
    assert namespace["Name"] == "sbemulatorns"
    assert config["UserConfig"]["Logging"] == {"Type": "Console"}
    orders, sessions = namespace["Queues"]
    assert orders["Name"] == "orders"
    assert orders["Properties"]["LockDuration"] == "PT5S"
    assert orders["Properties"]["MaxDeliveryCount"] == 3
    assert orders["Properties"]["RequiresSession"] is False
    # Left out: the test server's defaults (60 s, 10 deliveries), not the emulator's 3.
    assert sessions["Properties"]["LockDuration"] == "PT1M"
    assert sessions["Properties"]["MaxDeliveryCount"] == 10
    assert sessions["Properties"]["RequiresSession"] is True
    (events,) = namespace["Topics"]
    everything, urgent, nothing_set = events["Subscriptions"]
    assert "Rules" not in everything  # no filters: the $Default rule, everything
    assert urgent["Properties"]["LockDuration"] == "PT1M30S"
    assert urgent["Rules"] == [
        {"Name": "r0", "Properties": {"FilterType": "Correlation",
                                      "CorrelationFilter": {"Label": "urgent"}}},
        {"Name": "r1", "Properties": {"FilterType": "Correlation",
                                      "CorrelationFilter": {"Properties": {"priority": "high"}}}},
    ]
    # An empty correlation filter matches everything; the emulator wants a field, so: 1=1.
    assert nothing_set["Rules"][0]["Properties"] == {
        "FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}


@pytest.mark.parametrize(("document", "says"), [
    ({"queues": [{"name": f"q{i}"} for i in range(51)]}, "at most 50 queues and topics"),
    ({"queues": [{"name": "q", "lock_duration": 2}]}, "queue 'q': the emulator takes a lock"),
    ({"queues": [{"name": "q", "lock_duration": 7.5}]}, "whole seconds"),
    ({"queues": [{"name": "q", "max_delivery_count": 11}]}, "max delivery count from 1 to 10"),
    ({"topics": [{"name": "t", "subscriptions": [{"name": "s", "lock_duration": 30}]}]},
     "subscription t/s: the emulator takes a lock duration of whole seconds from 60"),
    ({"topics": [{"name": "t", "subscriptions": []}]}, "topic 't': the emulator takes 1 to 50"),
    ({"topics": [{"name": "t", "subscriptions": [{"name": "s", "filters": [{"sql": "x"}]}]}]},
     "unknown filter fields ['sql']"),
])
def test_what_the_emulator_cannot_take_is_refused_by_name(document: dict[str, Any],
                                                           says: str) -> None:
    with pytest.raises(ValueError, match=r".*") as raised:
        emulator_config(document)
    assert says in str(raised.value)


def test_the_container_refuses_a_bad_document_before_looking_for_docker() -> None:
    with pytest.raises(ValueError, match="at most 50"), servicebus_emulator_container(
            {"queues": [{"name": f"q{i}"} for i in range(60)]}):
        pass  # pragma: no cover - never entered


def test_expiry_dead_lettering_and_duplicate_detection_reach_the_emulator() -> None:
    config = emulator_config({"keys": [{"name": "ignored", "key": "by the emulator"}],
                              "queues": [{"name": "once", "duplicate_detection_window": 90,
                                          "dead_lettering_on_message_expiration": True},
                                         {"name": "plain"}]})
    once, plain = config["UserConfig"]["Namespaces"][0]["Queues"]
    assert once["Properties"]["RequiresDuplicateDetection"] is True
    assert once["Properties"]["DuplicateDetectionHistoryTimeWindow"] == "PT1M30S"
    assert once["Properties"]["DeadLetteringOnMessageExpiration"] is True
    assert "RequiresDuplicateDetection" not in plain["Properties"]
    assert plain["Properties"]["DeadLetteringOnMessageExpiration"] is False
