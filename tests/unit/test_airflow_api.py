"""Airflow's trigger API surface: TriggerEvent dumps, a required payload, hash(), the mirror.

Each test states behaviour Airflow documents (its ``TriggerEvent`` is a
pydantic model with one ``payload`` field; ``BaseEventTrigger.hash`` names a
trigger by classpath and kwargs) and checks ours against it. Where pydantic
is installed, the dumps are compared with a pydantic model of the same shape.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import importlib
import logging
import math
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import sharedstream
from sharedstream import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_SUBSCRIBER_QUEUE_MAX,
    BaseEventTrigger,
    SharedStreamManager,
    TriggerEvent,
)


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    when: dt.date


UTC = dt.UTC
PAYLOADS: list[Any] = [
    None, True, 7, 2**70, 1.5, float("inf"), float("nan"), "é", b"ab", bytearray(b"xy"),
    [1, (2, 3)], {"k": (1,)}, {3, 1}, frozenset([2]), {1: "a", None: 2, 1.5: 3, False: 4},
    {Colour.RED: 1, dt.date(2024, 1, 1): 2},
    dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), dt.datetime(2024, 1, 2, 3, 4, 5, 123000),
    dt.datetime(2024, 1, 2, 3, 4, 5, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.date(2024, 1, 2), dt.time(3, 4, 5, 500), dt.time(1, 2, tzinfo=UTC),
    dt.timedelta(0), dt.timedelta(hours=1), dt.timedelta(minutes=90), dt.timedelta(seconds=-1),
    dt.timedelta(days=2, seconds=3, microseconds=4), dt.timedelta(days=400),
    dt.timedelta(hours=25, seconds=0.5), dt.timedelta(days=-3, microseconds=1),
    Decimal("1.50"), uuid.UUID(int=5), Colour.RED, Path("/a/b"),
    Point(1, dt.date(2020, 1, 1)),
    {"order": {"id": "o-1", "lines": [{"sku": "A", "qty": 2}], "at": "2024-01-01T00:00:00Z"}},
]


def test_the_payload_is_required_as_in_airflow() -> None:
    with pytest.raises(TypeError, match="payload"):
        TriggerEvent()  # type: ignore[call-arg]
    assert TriggerEvent(None).payload is None
    assert TriggerEvent(payload={"a": 1}) == TriggerEvent({"a": 1})


def test_model_dump_and_model_dump_json_of_a_typical_payload() -> None:
    event = TriggerEvent({"key": "o-1", "at": dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)})
    assert event.model_dump() == {"payload": event.payload}
    assert event.model_dump(mode="json") == {
        "payload": {"key": "o-1", "at": "2024-05-01T12:00:00Z"}}
    assert event.model_dump_json() == '{"payload":{"key":"o-1","at":"2024-05-01T12:00:00Z"}}'
    assert TriggerEvent([1]).model_dump_json(indent=2) == '{\n  "payload": [\n    1\n  ]\n}'
    with pytest.raises(TypeError, match="object"):
        TriggerEvent(object()).model_dump_json()
    with pytest.raises(ValueError, match="mode"):
        TriggerEvent(1).model_dump(mode="yaml")  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", PAYLOADS, ids=repr)
def test_dumps_match_a_pydantic_model_with_a_payload_field(payload: Any) -> None:
    pydantic = pytest.importorskip("pydantic")

    # The shape of Airflow's TriggerEvent: one field, any payload.
    model: Any = pydantic.create_model("PydanticEvent", payload=(Any, None))
    theirs, ours = model(payload=payload), TriggerEvent(payload)
    assert ours.model_dump_json() == theirs.model_dump_json()
    assert ours.model_dump(mode="json") == theirs.model_dump(mode="json")
    if not (isinstance(payload, float) and math.isnan(payload)):  # NaN != NaN in either
        assert ours.model_dump() == theirs.model_dump()


def test_hash_is_stable_across_processes_and_kwarg_order() -> None:
    kwargs = {"topics": ["orders"], "since": dt.datetime(2024, 1, 1, tzinfo=UTC), "n": 3}
    value = BaseEventTrigger.hash("shop.OrderWatch", kwargs)
    assert isinstance(value, int)
    assert -(2**63) <= value < 2**63
    assert value == BaseEventTrigger.hash("shop.OrderWatch", dict(reversed(kwargs.items())))
    assert value != BaseEventTrigger.hash("shop.OtherWatch", kwargs)
    assert value != BaseEventTrigger.hash("shop.OrderWatch", {**kwargs, "n": 4})
    code = ("import datetime as dt; from sharedstream import BaseEventTrigger; "
            "print(BaseEventTrigger.hash('shop.OrderWatch', {'n': 3, 'topics': ['orders'], "
            "'since': dt.datetime(2024, 1, 1, tzinfo=dt.UTC)}))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123"})
    assert int(other.stdout) == value
    with pytest.raises(TypeError):
        BaseEventTrigger.hash("shop.OrderWatch", {"conn": object()})


def test_default_constants_are_the_manager_defaults() -> None:
    manager = SharedStreamManager()
    assert manager.ack_timeout == DEFAULT_ACK_TIMEOUT == 300.0
    assert DEFAULT_SUBSCRIBER_QUEUE_MAX == 1024


def test_the_manager_accepts_a_log() -> None:
    custom = logging.getLogger("triggerer.shared_streams")
    assert SharedStreamManager().log is logging.getLogger("sharedstream.stream")
    manager = SharedStreamManager(log=custom)
    assert manager.log is custom


MIRRORED = {
    "airflow.triggers.base": ["BaseEventTrigger", "BaseTrigger", "TriggerEvent"],
    "airflow.triggers.shared_stream": [
        "DEFAULT_ACK_TIMEOUT", "DEFAULT_SUBSCRIBER_QUEUE_MAX", "AckTimeout", "AdvanceItem",
        "AdvanceOutcome",
        "SharedStreamManager", "SharedStreamProducer", "SubscriberOverflow",
        "reject_shared_stream_event",
    ],
}


@pytest.mark.parametrize("airflow_module", sorted(MIRRORED))
def test_airflow_imports_port_by_prefixing_sharedstream(airflow_module: str) -> None:
    module = importlib.import_module(f"sharedstream.{airflow_module}")
    assert sorted(module.__all__) == sorted(MIRRORED[airflow_module])
    for name in MIRRORED[airflow_module]:
        assert getattr(module, name) is getattr(sharedstream, name), name
