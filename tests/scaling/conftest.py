"""Several ``sharedstream triggerer`` processes on one PostgreSQL database (the real CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.fixtures import postgres_database, postgres_url

__all__ = ["Cluster", "postgres_database", "postgres_url", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]


class Cluster:
    """Triggerer processes sharing one configuration (one store) in ``workdir``.

    Triggerer ``i`` writes its log to ``triggerer-<i>.log``; :meth:`cli` runs
    any other command and returns its stdout (failing the test on a non-zero
    exit).
    """

    def __init__(self, workdir: Path, store_url: str, env: dict[str, str]) -> None:
        self.dir = workdir
        self.config = workdir / "sharedstream.toml"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT),
                    "SHAREDSTREAM__TRIGGERER__JOB_HEARTBEAT_SEC": "0.5",
                    "SHAREDSTREAM__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "3",
                    **env}
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.cli("init", "--path", str(self.config), "--db", store_url)

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "sharedstream", "--config", str(self.config), *args],
            cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json"))

    def start(self, index: int, definitions: Path) -> subprocess.Popen[bytes]:
        with (self.dir / f"triggerer-{index}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sharedstream", "--config", str(self.config),
                 "triggerer", "--definitions", str(definitions), "--log-level", "INFO"],
                cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL, stderr=log,
            )
        self.processes[index] = proc
        return proc

    def log(self, index: int) -> str:
        return (self.dir / f"triggerer-{index}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def wait_until(condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``condition`` every 50 ms; the seconds it took (fails after ``within``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(store_url: str, **env: str) -> Cluster:
        made.append(Cluster(tmp_path, store_url, env))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()
