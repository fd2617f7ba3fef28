"""What ``--from`` and ``--to`` of ``watchers replay`` accept, and the one line for the rest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sharedstream.runtime.replays import ReplayRequestError, parse_start, parse_time

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("24h", {"from": (NOW - timedelta(hours=24)).isoformat()}),
    ("90m", {"from": (NOW - timedelta(minutes=90)).isoformat()}),
    ("2026-11-27", {"from": "2026-11-27T00:00:00+00:00"}),
    ("2026-11-27T08:00", {"from": "2026-11-27T08:00:00+00:00"}),
    ("2026-11-27T08:00:00+01:00", {"from": "2026-11-27T08:00:00+01:00"}),
    ("0:120,1:300", {"offsets": {"0": 120, "1": 300}}),
    ("orders/0:5, payments/2:0", {"offsets": {"orders/0": 5, "payments/2": 0}}),
    ("10:00", {"offsets": {"10": 0}}),  # partition 10 from offset 0: a time needs a date
])
def test_from_is_a_time_an_age_or_offsets(text: str, expected: dict[str, object]) -> None:
    assert parse_start(text, now=NOW) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("yesterday", "--from 'yesterday' is not a time: give a date and time"),
    ("0:1,0:2", "--from names partition 0 twice"),
    ("-5h", "--from '-5h' is not a time"),
])
def test_anything_else_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(ReplayRequestError) as caught:
        parse_start(text, now=NOW)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_to_says_its_own_name() -> None:
    with pytest.raises(ReplayRequestError, match=r"^--to 'later' is not a time"):
        parse_time("later", now=NOW, what="--to")
    assert parse_time("1d", now=NOW, what="--to") == NOW - timedelta(days=1)
