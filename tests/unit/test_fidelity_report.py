"""The fidelity suite's pytest plugin, loaded into a real pytest process as the runner does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import sharedstream

_REPO_ROOT = Path(sharedstream.__file__).resolve().parent.parent


def test_a_slow_test_gets_its_own_timeout_and_the_others_keep_the_run_s(
        tmp_path: Path) -> None:
    (tmp_path / "test_waits.py").write_text(
        "import time\n\n"
        "def test_schedule_waits():\n    time.sleep(1.5)\n\n"
        "def test_plain_waits():\n    time.sleep(1.5)\n", encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\n", encoding="utf-8")
    timeouts, outcomes = tmp_path / "timeouts.json", tmp_path / "outcomes.json"
    timeouts.write_text(json.dumps({"test_waits.py::test_schedule_waits": 30}), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(_REPO_ROOT),
           "SHAREDSTREAM_FIDELITY_TIMEOUTS": str(timeouts),
           "SHAREDSTREAM_FIDELITY_OUTCOMES": str(outcomes)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-p", "sharedstream.testing.fidelity.report", "test_waits.py"],
                   cwd=tmp_path, env=env, capture_output=True, timeout=60, check=False)
    assert json.loads(outcomes.read_text(encoding="utf-8")) == {
        "test_waits.py::test_plain_waits": "failed", "test_waits.py::test_schedule_waits": "passed"}
