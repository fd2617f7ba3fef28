"""The kit's settings check: types first, then rules, one line naming the setting."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sharedstream.brokerkit.settings import check_settings


class BadSettings(ValueError):
    pass


@dataclass
class Settings:
    name: object = "orders"
    batch: object = 10
    backoff: object = 0.5


def check(settings: Settings) -> None:
    check_settings(settings, error=BadSettings, where="queue 'orders'", ints=("batch",),
                   texts=("name",), numbers=("backoff",),
                   rules=lambda: [(settings.batch <= 10, "batch must be within 1..10")])  # type: ignore[operator]


def test_usable_settings_pass() -> None:
    check(Settings())
    check(Settings(name=None, backoff=2))


@pytest.mark.parametrize(("settings", "line"), [
    (Settings(batch=True), "batch must be an int, got bool (queue 'orders')"),
    (Settings(batch=10.0), "batch must be an int, got float (queue 'orders')"),
    (Settings(name=b"orders"), "name must be a str, got bytes (queue 'orders')"),
    (Settings(backoff="1"), "backoff must be a number, got str (queue 'orders')"),
    (Settings(backoff=False), "backoff must be a number, got bool (queue 'orders')"),
    (Settings(batch=11), "batch must be within 1..10 (queue 'orders')"),
])
def test_the_first_unusable_setting_is_named(settings: Settings, line: str) -> None:
    with pytest.raises(BadSettings) as caught:
        check(settings)
    assert str(caught.value) == line


def test_rules_are_not_asked_while_a_type_is_wrong() -> None:
    asked: list[int] = []

    def rules() -> list[tuple[bool, str]]:
        asked.append(1)
        return []

    with pytest.raises(BadSettings, match="must be an int"):
        check_settings(Settings(batch="10"), error=BadSettings, where="here", ints=("batch",),
                       rules=rules)
    assert asked == []
