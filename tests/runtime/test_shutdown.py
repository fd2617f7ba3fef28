"""The triggerer's shutdown reaches trigger code as cancellation (Airflow's semantics).

A real ``sharedstream triggerer`` process runs a watcher whose filter loop
catches ``Exception``; SIGTERM must cancel it (the filter sees
``CancelledError`` and re-raises it, its ``cleanup`` runs) and the process
exits promptly with status 0: no reader is left waiting.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.runtime.conftest import Deployment, wait_for

GUARDED = Path(__file__).with_name("guarded_defs.py")


def test_sigterm_cancels_a_filter_that_catches_exception(deployment: Deployment) -> None:
    d = deployment
    seen = d.dir / "seen.txt"
    d.env["GUARDED_SEEN"] = str(seen)
    d.append(*({"kind": "order", "amount": n} for n in range(5)))
    proc = d.start(GUARDED)
    wait_for(lambda: d.committed() == 4, what="the five orders committed")
    signalled = time.monotonic()
    assert d.stop(proc) == 0
    assert time.monotonic() - signalled < 10, "the stop waited on a reader"
    assert seen.read_text().splitlines() == ["cancelled", "cleanup"]
    assert "the stream failed" not in d.stderr()
