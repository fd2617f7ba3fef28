"""Client libraries' repeated log lines are shown once per window; ours always."""

from __future__ import annotations

import logging

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
