"""The triggerer's log lines, text and JSON, with a trigger logging structlog-style.

A real ``sharedstream triggerer`` runs ``guarded_defs.py``, whose filter logs
``self.log.info("matched", order_id=..., kind=...)`` for every order, or
``prefilter_defs.py``, whose prefilter raises so that the engine logs one of
the runtime's own key-value lines.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.runtime.conftest import Deployment, wait_for

GUARDED = Path(__file__).with_name("guarded_defs.py")
PREFILTERED = Path(__file__).with_name("prefilter_defs.py")


def run_and_stop(d: Deployment) -> str:
    d.env["GUARDED_SEEN"] = str(d.dir / "seen.txt")
    d.append(*({"kind": "order", "amount": n} for n in range(3)))
    proc = d.start(GUARDED)
    wait_for(lambda: d.committed() == 2, what="the three orders committed")
    assert d.stop(proc) == 0
    return d.stderr()


def test_text_lines_render_a_triggers_key_values(deployment: Deployment) -> None:
    log = run_and_stop(deployment)
    assert "GuardedFileLogTrigger: matched order_id=2 kind=order" in log
    assert "stopping (send the signal again to exit at once) signal=SIGTERM" in log


def test_json_lines_carry_the_key_values_as_fields(deployment: Deployment) -> None:
    deployment.env["SHAREDSTREAM__LOGGING__FORMAT"] = "json"
    lines = [json.loads(line) for line in run_and_stop(deployment).splitlines()]
    matched = [line for line in lines if line["message"] == "matched"]
    assert [line["order_id"] for line in matched] == [0, 1, 2]
    first = matched[0]
    assert list(first)[:4] == ["timestamp", "level", "logger", "message"]
    assert first["level"] == "info"
    assert first["logger"].endswith("guarded_defs.GuardedFileLogTrigger")
    assert first["kind"] == "order"
    assert first["timestamp"].endswith("Z")
    [summary] = [line for line in lines if line["message"] == "stopped"]
    assert summary["logger"] == "sharedstream.runtime"
    assert summary["stored"] >= 3  # the guarded watcher's three, and filelog_defs' watchers'
    assert summary["dag_runs"] >= 3
    assert (summary["duplicates"], summary["store_retries"]) == (0, 0)
    [stopping] = [line for line in lines if line["message"].startswith("stopping (")]
    assert stopping["signal"] == "SIGTERM"


def test_json_lines_carry_the_runtimes_own_key_values(deployment: Deployment) -> None:
    d = deployment
    d.env["SHAREDSTREAM__LOGGING__FORMAT"] = "json"
    d.append(*({"kind": "order", "amount": n} for n in range(3)))
    proc = d.start(PREFILTERED)
    wait_for(lambda: d.committed() == 2, what="the three orders committed")
    assert d.stop(proc) == 0
    lines = [json.loads(line) for line in d.stderr().splitlines()]
    [switched_off] = [line for line in lines if line["logger"] == "sharedstream.fanout"]
    assert switched_off["level"] == "warning"
    assert switched_off["message"] == (
        "shared-stream prefilter raised; switched off, the filter gets every raw event")
    [trigger] = [row["id"] for row in d.json("triggers", "list")
                 if row["classpath"].endswith(".RaisingPrefilterTrigger")]
    assert switched_off["triggers"] == [trigger]
    assert "LookupError: prefilter bug on order 1" in switched_off["exception"]
