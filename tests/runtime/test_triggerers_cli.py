"""``sharedstream triggerers list``: each triggerer, alive or not, and the triggers it runs."""

from __future__ import annotations

from pathlib import Path

from tests.runtime.conftest import Deployment, wait_for

STANDALONE = Path(__file__).with_name("standalone_defs.py")


def test_triggerers_list_shows_the_running_triggerer_and_its_triggers(
    deployment: Deployment,
) -> None:
    d = deployment
    assert d.cli("triggerers", "list").stdout == "(none)\n"
    d.env["STANDALONE_AT"] = "2100-01-01T00:00:00+00:00"  # both triggers keep running
    proc = d.start(STANDALONE)
    triggers = sorted(t["id"] for t in d.json("triggers", "list"))
    wait_for(lambda: [t["triggers"] for t in d.json("triggerers", "list")] == [triggers],
             what="the triggerer reporting both triggers")
    [row] = d.json("triggerers", "list")
    assert row["pid"] == proc.pid
    assert row["alive"] is True
    assert row["heartbeat_age"] < 5
    table = d.cli("triggerers", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "HOST", "PID", "ALIVE", "HEARTBEAT_AT", "HEARTBEAT_AGE",
                                "TRIGGERS"]
    assert str(proc.pid) in table[1]
    assert "True" in table[1]

    # SQLite serves one triggerer: a second one refuses to start, in one line
    second = d.start(STANDALONE)
    assert second.wait(timeout=30) == 2
    assert "already running" in d.stderr()
    assert d.stop(proc) == 0
    # A clean stop signs off: not shown alive for the threshold's 30 s, and no row left.
    assert d.cli("triggerers", "list").stdout == "(none)\n"


def test_a_killed_triggerer_counts_dead_after_the_threshold(deployment: Deployment) -> None:
    d = deployment
    d.env["STANDALONE_AT"] = "2100-01-01T00:00:00+00:00"
    proc = d.start(STANDALONE)
    wait_for(lambda: bool(d.json("triggerers", "list")), what="the first heartbeat")
    proc.kill()
    proc.wait(timeout=10)
    d.env["SHAREDSTREAM__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD"] = "0.5"
    wait_for(lambda: d.json("triggerers", "list")[0]["alive"] is False, timeout=10,
             what="the killed triggerer counted dead after the threshold")
