"""Several ``sharedstream triggerer`` processes on one store: the real CLI, as a deployment runs it.

:class:`TriggererCluster` is what the scale-out tests and the scale-out
benchmark share: one configuration file (one store URL) in a working
directory, written by ``sharedstream init``, and any number of triggerer
processes started on it, each ``python -m sharedstream triggerer`` with its
own log file. Invariants:

* every process the cluster started is in :attr:`TriggererCluster.processes`
  and is killed (and reaped) by :meth:`TriggererCluster.close`, which is
  idempotent; stopping one gracefully (SIGTERM) is the caller's to do;
* every command runs with the cluster's environment (``PYTHONPATH`` first
  names the directories given, so generated definitions can import the
  caller's modules) and in its working directory;
* a CLI command that exits non-zero raises :class:`TriggererCommandFailed`
  with its stderr: a setup step never fails silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sharedstream.engine.errors import SharedStreamError

__all__ = ["TriggererCluster", "TriggererCommandFailed"]

_COMMAND_TIMEOUT = 60.0


class TriggererCommandFailed(SharedStreamError):
    """A ``sharedstream`` command of the cluster exited non-zero; the message holds its stderr."""


class TriggererCluster:
    """Triggerer processes sharing one configuration (one store) in ``workdir``.

    ``store_url`` is written to ``workdir/sharedstream.toml`` by
    ``sharedstream init`` when the cluster is made (raising
    :class:`TriggererCommandFailed` if that fails). ``env`` is added to this
    process's environment for every command (``SHAREDSTREAM__...``
    overrides, typically); ``pythonpath`` is put before any ``PYTHONPATH``.
    Triggerer ``i`` writes its log to ``triggerer-<i>.log``. Not thread-safe.
    """

    def __init__(self, workdir: Path, store_url: str, env: Mapping[str, str], *,
                 pythonpath: Sequence[Path] = ()) -> None:
        self.dir = workdir
        self.config = workdir / "sharedstream.toml"
        paths = [str(path) for path in pythonpath]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        self.env = {**os.environ, **({"PYTHONPATH": os.pathsep.join(paths)} if paths else {}),
                    **env}
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.cli("init", "--path", str(self.config), "--db", store_url)

    def cli(self, *args: str) -> str:
        """Run ``sharedstream --config <config> <args>`` to completion; its stdout.

        Raises :class:`TriggererCommandFailed` on a non-zero exit and
        ``subprocess.TimeoutExpired`` after a minute.
        """
        result = subprocess.run(  # noqa: S603 - our own CLI, arguments from the caller
            [sys.executable, "-m", "sharedstream", "--config", str(self.config), *args],
            cwd=self.dir, env=self.env, capture_output=True, text=True,
            timeout=_COMMAND_TIMEOUT, check=False,
        )
        if result.returncode != 0:
            raise TriggererCommandFailed(
                f"sharedstream {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result.stdout

    def json(self, *args: str) -> Any:
        """:meth:`cli` with ``--json``, its output parsed."""
        return json.loads(self.cli(*args, "--json"))

    def start(self, index: int, definitions: Path, *, log_level: str = "INFO",
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start triggerer ``index`` on ``definitions``; returns at once (no readiness wait).

        ``env`` is added to the cluster's environment for this process only
        (``SHAREDSTREAM__TRIGGERER__QUEUES``, say).
        """
        with (self.dir / f"triggerer-{index}.log").open("wb") as log:
            proc = subprocess.Popen(  # noqa: S603 - our own CLI
                [sys.executable, "-m", "sharedstream", "--config", str(self.config),
                 "triggerer", "--definitions", str(definitions), "--log-level", log_level],
                cwd=self.dir, env={**self.env, **(env or {})}, stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.processes[index] = proc
        return proc

    def log(self, index: int) -> str:
        """Triggerer ``index``'s log so far."""
        return (self.dir / f"triggerer-{index}.log").read_text(errors="replace")

    def close(self) -> None:
        """Kill and reap every process still running (idempotent)."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
