"""The README's run command must keep working: execute the quickstart as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_runs_and_advances_every_message() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert sum("-> commit" in line for line in lines) == 9
    assert sum("-> dead-letter" in line for line in lines) == 3
    assert lines[-1] == "12 trigger events stored, 12 offsets advanced"  # 6 + 3 + 3
