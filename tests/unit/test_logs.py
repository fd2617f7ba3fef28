"""Repeated log lines are shown once per window: client libraries', and ours marked as repeats."""

from __future__ import annotations

import logging

from sharedstream.engine.keyvalue_log import KeyValueMessage
from sharedstream.runtime.logs import QuietRepeats


def record(name: str, msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, ("node 1",), None)


def test_a_librarys_repeats_are_hidden_and_the_first_says_why() -> None:
    quiet = QuietRepeats(window=60)
    first = record("aiokafka", "Unable connect to node %s")
    assert quiet.filter(first)
    assert "the broker may be unreachable" in first.getMessage()
    assert "node 1" in first.getMessage()
    assert not quiet.filter(record("aiokafka", "Unable connect to node %s"))
    assert quiet.filter(record("aiokafka", "Unable to update metadata from %s"))  # another


def test_our_own_lines_are_never_filtered() -> None:
    quiet = QuietRepeats(window=60)
    for _ in range(3):
        line = record("sharedstream.runtime", "trigger %s failed")
        assert quiet.filter(line)
        assert line.getMessage() == "trigger node 1 failed"


def test_a_repeat_shows_again_after_the_window() -> None:
    quiet = QuietRepeats(window=0)
    assert quiet.filter(record("aiokafka", "Unable connect to node %s"))
    assert quiet.filter(record("aiokafka", "Unable connect to node %s"))


def our_retry(call: str) -> logging.LogRecord:
    """A retry line as ``sharedstream.brokerkit.retry`` logs it (key-values, a repeat key)."""
    line = logging.LogRecord("sharedstream.brokerkit.retry", logging.WARNING, __file__, 1,
                             KeyValueMessage("broker call failed; retrying",
                                             {"call": call, "delay_s": 0.1}), (), None)
    line.key_values = {"call": call, "delay_s": 0.1}
    line.repeat_key = call
    return line


def fields(record: logging.LogRecord) -> object:
    return getattr(record, "key_values", None)


def test_our_lines_marked_as_repeats_are_held_back_per_key() -> None:
    quiet = QuietRepeats(window=60)
    first = our_retry("connecting the consumer")
    assert quiet.filter(first)
    assert fields(first) == {"call": "connecting the consumer", "delay_s": 0.1,
                                "repeats_hidden_s": 60}
    assert first.getMessage().endswith("repeats_hidden_s=60")
    assert not any(quiet.filter(our_retry("connecting the consumer")) for _ in range(4))
    assert quiet.filter(our_retry("committing orders/0 at 7"))  # another call: its own line


def test_the_next_shown_repeat_says_how_many_were_held_back() -> None:
    quiet = QuietRepeats(window=60)
    assert quiet.filter(our_retry("connecting"))
    assert not quiet.filter(our_retry("connecting"))
    assert not quiet.filter(our_retry("connecting"))
    quiet.window = 0  # the window passed
    later = our_retry("connecting")
    assert quiet.filter(later)
    assert fields(later) == {"call": "connecting", "delay_s": 0.1, "repeats_hidden_s": 0,
                             "held_back": 2}


def test_kinds_outside_the_window_are_forgotten_when_there_are_many() -> None:
    quiet = QuietRepeats(window=0)
    for offset in range(3 * QuietRepeats.MAX_KINDS):
        assert quiet.filter(our_retry(f"committing orders/0 at {offset}"))
    assert len(quiet._last) <= QuietRepeats.MAX_KINDS + 1
