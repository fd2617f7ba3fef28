"""Trigger queues where they are declared and configured: definitions, ``[triggerer] queues``.

Which triggerer runs what is held by tests/scaling/test_trigger_queues.py
(real triggerers on PostgreSQL).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sharedstream.runtime.config import ConfigError, load_config
from sharedstream.runtime.definitions import DefinitionsError, load_definitions

TICKER = '''
from sharedstream.airflow.sdk import Asset, AssetWatcher
from sharedstream.airflow.triggers.base import BaseEventTrigger, TriggerEvent
from sharedstream.triggers.sqs import SqsSharedStreamTrigger


class Ticker(BaseEventTrigger):
    def __init__(self, label, queue=None):
        super().__init__(queue=queue)
        self.label = label

    def serialize(self):
        return ("queued.Ticker", {"label": self.label})

    async def run(self):
        yield TriggerEvent(self.label)


class Routed(Ticker):
    queue = "by-class"

'''


def load(tmp_path: Path, body: str) -> dict[str, str | None]:
    path = tmp_path / "queued.py"
    path.write_text(TICKER + body)
    definitions = load_definitions(path)
    return {t.watchers[0][0]: t.queue for t in definitions.triggers.values()}


def test_the_queue_comes_from_the_constructor_or_the_class_and_defaults_to_none(
    tmp_path: Path,
) -> None:
    assert load(tmp_path, '''
Asset("a", watchers=[AssetWatcher("w", trigger=Ticker("a", queue="team-a"))])
Asset("b", watchers=[AssetWatcher("w", trigger=Routed("b"))])
Asset("c", watchers=[AssetWatcher("w", trigger=Ticker("c"))])
Asset("sqs", watchers=[AssetWatcher("w", trigger=SqsSharedStreamTrigger(
    queue="https://sqs.eu-west-1.amazonaws.com/1/orders"))])
''') == {"a": "team-a", "b": "by-class", "c": None, "sqs": None}


@pytest.mark.parametrize(("body", "says"), [
    ('''
Asset("a", watchers=[AssetWatcher("w", trigger=Ticker("x", queue="team-a"))])
Asset("b", watchers=[AssetWatcher("w", trigger=Ticker("x", queue="team-b"))])
''', "declared in trigger queue 'team-b' here and in 'team-a' by a/w"),
    ('''
Asset("a", watchers=[AssetWatcher("w", trigger=Ticker("x", queue="team a"))])
''', "trigger queue 'team a' must be a name"),
])
def test_a_queue_that_cannot_route_is_refused_in_one_line(
    tmp_path: Path, body: str, says: str,
) -> None:
    with pytest.raises(DefinitionsError) as raised:
        load(tmp_path, body)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_triggerer_queues_option() -> None:
    assert load_config(environ={}).triggerer.served_queues == frozenset()
    given = load_config(environ={"SHAREDSTREAM__TRIGGERER__QUEUES": " team-a, team.b "})
    assert given.triggerer.queues == "team-a,team.b"
    assert given.triggerer.served_queues == frozenset({"team-a", "team.b"})
    with pytest.raises(ConfigError, match=r"\[triggerer\] queues = 'a,,b'.*comma-separated"):
        load_config(environ={"SHAREDSTREAM__TRIGGERER__QUEUES": "a,,b"})
