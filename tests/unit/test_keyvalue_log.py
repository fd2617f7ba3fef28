"""Trigger code logs structlog-style (Airflow's ``self.log``) through the standard library.

``self.log.info("msg", key=value)`` must not raise, must render the
key-values into the line and keep them as fields; everything a stdlib logger
accepts keeps working; the JSON format writes one object per line.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream import BaseTrigger, TriggerEvent
from sharedstream.engine.keyvalue_log import KeyValueLogger, KeyValueMessage, key_value_logger
from sharedstream.runtime.config import ConfigError, load_config
from sharedstream.runtime.logs import JsonFormatter, QuietRepeats, configure_logging


class Chatty(BaseTrigger):
    """Logs the way Airflow trigger code does."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("tests.Chatty", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.log.info("polling", topic="orders", partition=3)
        yield TriggerEvent(None)


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.endswith("Chatty")]


async def test_a_trigger_logs_key_values_structlog_style(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    trigger = Chatty()
    assert isinstance(trigger.log, KeyValueLogger)
    assert [event async for event in trigger.run()] == [TriggerEvent(None)]
    (record,) = records(caplog)
    assert record.getMessage() == "polling topic=orders partition=3"
    assert record.key_values == {"topic": "orders", "partition": 3}  # type: ignore[attr-defined]
    assert record.name == f"{__name__}.Chatty"
    assert record.filename == "test_keyvalue_log.py"  # the caller, not the adapter
    assert record.funcName == "run"


def test_stdlib_calls_keep_working(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    log = Chatty().log
    log.info("took %.1fs for %s", 0.25, "orders")
    log.debug("with both %s", "args", batch=2, note="two words")
    try:
        int("bad")
    except ValueError:
        log.warning("failed", exc_info=True, attempt=2)
        log.exception("failed again")
    log.log(logging.ERROR, "via log", code=None)
    plain, both, failed, again, via_log = records(caplog)
    assert plain.getMessage() == "took 0.2s for orders"
    assert plain.key_values == {}  # type: ignore[attr-defined]
    assert both.getMessage() == "with both args batch=2 note='two words'"
    assert failed.getMessage() == "failed attempt=2"
    assert failed.exc_info is not None
    assert failed.exc_info[0] is ValueError
    assert again.exc_info is not None
    assert again.levelno == logging.ERROR
    assert via_log.getMessage() == "via log code=None"


def test_a_disabled_level_costs_no_rendering(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)

    class Loud:
        def __repr__(self) -> str:
            raise AssertionError("rendered although disabled")

    Chatty().log.info("quiet", value=Loud())
    assert records(caplog) == []


def test_bind_adds_key_values_to_every_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    bound = Chatty().log.bind(run_id="r1")
    bound.info("started")
    bound.bind(step=2).info("step", ok=True)
    first, second = records(caplog)
    assert first.getMessage() == "started run_id=r1"
    assert second.key_values == {"run_id": "r1", "step": 2, "ok": True}  # type: ignore[attr-defined]


def test_key_value_messages_compare_by_rendering() -> None:
    assert KeyValueMessage("m", {"a": 1}) == KeyValueMessage("m", {"a": 1})
    assert hash(KeyValueMessage("m", {"a": [1]})) == hash(KeyValueMessage("m", {"a": [1]}))
    assert str(KeyValueMessage("", {"a": "x y"})) == "a='x y'"
    assert key_value_logger("same") is key_value_logger("same")


def test_a_triggers_lines_are_never_quieted_as_a_librarys() -> None:
    quiet = QuietRepeats(window=60)
    for _ in range(3):
        record = logging.LogRecord("shop.triggers.Watch", logging.WARNING, __file__, 1,
                                   "lagging", (), None)
        record.key_values = {}
        assert quiet.filter(record)
        assert record.getMessage() == "lagging"


def format_json(record: logging.LogRecord) -> dict[str, Any]:
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def test_json_lines_hold_the_fields_and_the_key_values(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    log = Chatty().log
    log.info("matched %s", "o-1", at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), level="high",
             blob=object(), tags=("a", "b"))
    try:
        dict[str, int]().pop("k")
    except KeyError:
        log.error("failed", exc_info=True)
    matched, failed = (format_json(r) for r in records(caplog))
    assert list(matched)[:4] == ["timestamp", "level", "logger", "message"]
    assert matched["level"] == "info"
    assert matched["message"] == "matched o-1"
    assert matched["at"] == "2024-01-01T00:00:00Z"
    assert matched["level_"] == "high"  # a key-value never hides a field
    assert matched["blob"].startswith("<object object")
    assert matched["tags"] == ["a", "b"]
    assert dt.datetime.fromisoformat(matched["timestamp"]).tzinfo is not None
    assert "KeyError" in failed["exception"]
    plain = logging.LogRecord("sharedstream.runtime", logging.WARNING, __file__, 1,
                              "stored %d events", (3,), None)
    assert format_json(plain)["message"] == "stored 3 events"


def test_configure_logging_json_writes_one_object_per_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = []
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure_logging("info", "json")
        Chatty().log.info("hello", n=1)
        logging.getLogger("sharedstream.runtime").info("ours %s", "too")
    finally:
        root.handlers = saved[0]
        root.setLevel(saved[1])
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["message"], line.get("n")) for line in lines] == [
        ("hello", 1), ("ours too", None)]
    with pytest.raises(ValueError, match="yaml"):
        configure_logging("info", "yaml")


def test_the_format_is_a_logging_option(tmp_path: Path) -> None:
    assert load_config(environ={}).logging.format == "text"
    assert load_config(environ={"SHAREDSTREAM__LOGGING__FORMAT": "JSON"}).logging.format == "json"
    config_file = tmp_path / "sharedstream.toml"
    config_file.write_text('[logging]\nformat = "json"\n')
    config = load_config(config_file, environ={})
    assert config.logging.format == "json"
    assert config.as_dict()["logging"] == {"format": "json"}
    with pytest.raises(ConfigError, match="expected one of: text, json") as caught:
        load_config(environ={"SHAREDSTREAM__LOGGING__FORMAT": "yaml"})
    assert caught.value.option == "logging.format"
