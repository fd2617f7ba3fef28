"""The Kafka demo's group session timeout: short on its own Tansu, the user's when set.

Tansu answers a new group's first join after about half the session
timeout, so the demo's watchers ask for 2 s (the group forms in about a
second instead of five); the definitions file keeps 10 s for a broker of
the user's own, and an explicit ``SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS``
wins over both.
"""

from __future__ import annotations

import pytest

from sharedstream.demo.kafka import SESSION_TIMEOUT_MS, KafkaDemoBroker


def _overrides(environ: dict[str, str]) -> dict[str, int]:
    common = KafkaDemoBroker.watcher_triggers(environ).common
    overrides: dict[str, int] = common["consumer_overrides"]
    return overrides


def test_the_demo_asks_its_own_broker_for_a_short_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS", raising=False)
    environment = KafkaDemoBroker().environment()
    assert environment["SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS"] == str(SESSION_TIMEOUT_MS) == "2000"
    assert _overrides(environment) == {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400}


def test_a_session_timeout_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAREDSTREAM_DEMO_SESSION_TIMEOUT_MS", "6000")
    environment = KafkaDemoBroker().environment()
    assert _overrides(environment) == {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1200}


def test_the_definitions_alone_keep_the_usual_ten_seconds() -> None:
    assert _overrides({}) == {"session_timeout_ms": 10000, "heartbeat_interval_ms": 2000}
