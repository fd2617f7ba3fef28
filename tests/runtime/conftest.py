"""Fixtures that run the real ``sharedstream`` CLI as a subprocess against real SQLite files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFS = Path(__file__).with_name("filelog_defs.py")
SECRET = "hunter2-do-not-store-me"  # noqa: S105 - the secret the test hunts for


class Deployment:
    """One user's working directory: config, database, log 'broker', definitions."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.config = workdir / "sharedstream.toml"
        self.db = workdir / "sharedstream.db"
        self.log = workdir / "broker.log"
        self.log.touch()
        self.env = {
            **os.environ,
            "FILELOG_PATH": str(self.log),
            "FILELOG_SECRET": SECRET,
            "PYTHONPATH": str(ROOT),
            "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "2",
            "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.2",
            "SHAREDSTREAM__TRIGGERER__JOB_HEARTBEAT_SEC": "0.5",
        }
        self.processes: list[subprocess.Popen[str]] = []
        self.next_id = 0

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "sharedstream", "--config", str(self.config), *args],
            cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"sharedstream {' '.join(args)} failed:\n{result.stderr}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def start(self, definitions: Path = DEFS) -> subprocess.Popen[str]:
        with (self.dir / f"triggerer-{len(self.processes)}.log").open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sharedstream", "--config", str(self.config),
                 "triggerer", "--definitions", str(definitions)],
                cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
            )
        self.processes.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
        proc.send_signal(sig)
        return proc.wait(timeout=30)

    def stderr(self, index: int = -1) -> str:
        logs = sorted(self.dir.glob("triggerer-*.log"))
        return logs[index].read_text()

    def append(self, *messages: Any) -> list[int]:
        ids = []
        with self.log.open("a") as handle:
            for message in messages:
                if isinstance(message, dict):
                    ids.append(self.next_id)
                    handle.write(json.dumps({"id": self.next_id, **message}) + "\n")
                    self.next_id += 1
                else:
                    handle.write(message + "\n")
        return ids

    def committed(self) -> int:
        try:
            return int(json.loads(Path(f"{self.log}.offsets").read_text())["committed"])
        except FileNotFoundError:
            return -1

    def lines(self) -> int:
        return len(self.log.read_text().splitlines())


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.05)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path)
    d.cli("init", "--path", str(d.config))
    yield d
    for proc in d.processes:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
