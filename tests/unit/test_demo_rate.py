"""The demo's "msgs/s once consuming": never more than what was committed over a real interval."""

from __future__ import annotations

import pytest

from sharedstream.demo import _line, _State


def test_a_run_done_between_two_looks_is_timed_from_the_last_idle_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([10.0, 10.5])  # two looks at the offsets, half a second apart
    monkeypatch.setattr("sharedstream.demo.time.monotonic", lambda: next(clock))
    state = _State(idle_at=9.0)
    _line(state, stored=0, runs=0, started=9.0)  # nothing committed yet at 10.0
    state.committed = 300  # everything committed before the next look
    line = _line(state, stored=492, runs=416, started=9.0)
    assert state.consuming_since == 10.0
    assert state.rate(10.5) == pytest.approx(600.0)  # 300 over the 0.5 s it may have taken
    assert line.endswith("600 msgs/s")


def test_the_summary_of_a_run_no_look_saw_consuming_still_has_a_true_rate() -> None:
    state = _State(committed=300, idle_at=9.0)  # last idle look at 9.0, never seen consuming
    assert state.rate(10.0) == pytest.approx(300.0)
    assert _State(idle_at=9.0).rate(10.0) == 0.0  # nothing committed: no rate
