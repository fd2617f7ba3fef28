"""The ``sharedstream`` command as the end-to-end tests drive it (a real subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class TriggererCli:
    """``sharedstream`` in ``workdir``: ``init``, listings, and triggerer processes.

    Every call uses the configuration file ``workdir/sharedstream.toml`` and
    the environment ``env``; triggerer processes run ``definitions`` and
    write their stderr to ``triggerer-N.log`` in ``workdir``.
    """

    def __init__(self, workdir: Path, env: dict[str, str], definitions: Path) -> None:
        self.dir = workdir
        self.config = workdir / "sharedstream.toml"
        self.env = env
        self.definitions = definitions

    def run(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "sharedstream", "--config", str(self.config), *args],
            cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def start(self, index: int, *, log_level: str | None = "WARNING",
              ) -> subprocess.Popen[bytes]:
        """``sharedstream triggerer`` on the definitions; stderr to ``triggerer-<index>.log``.

        ``log_level``: ``--log-level`` (``None``: the command's default, INFO).
        """
        level = [] if log_level is None else ["--log-level", log_level]
        with self.log_path(index).open("wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "sharedstream", "--config", str(self.config),
                 "triggerer", "--definitions", str(self.definitions), *level],
                cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL, stderr=log,
            )

    @contextlib.contextmanager
    def running(self, index: int, *, log_level: str | None = "WARNING",
                ) -> Iterator[subprocess.Popen[bytes]]:
        """Triggerer ``index`` while the block runs; then SIGTERM, and it must exit 0.

        Killed instead when the block raises (its log is in the failure).
        """
        process = self.start(index, log_level=log_level)
        try:
            yield process
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, self.log(index)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    def wait_for_log(self, index: int, text: str, within: float = 30.0) -> None:
        """Wait until triggerer ``index``'s log says ``text`` (its log in the failure)."""
        deadline = time.monotonic() + within
        while text not in self.log(index):
            assert time.monotonic() < deadline, self.log(index)
            time.sleep(0.1)

    async def until(self, index: int, process: subprocess.Popen[bytes],
                    check: Callable[[], Awaitable[bool]], within: float = 60.0) -> None:
        """Poll ``check`` until true; triggerer ``index`` (``process``) must stay up meanwhile."""
        deadline = time.monotonic() + within
        while not await check():
            assert process.poll() is None, self.log(index)
            assert time.monotonic() < deadline, self.log(index)
            await asyncio.sleep(0.1)

    def log_path(self, index: int) -> Path:
        """Where triggerer ``index`` writes its log."""
        return self.dir / f"triggerer-{index}.log"

    def log(self, index: int) -> str:
        """Triggerer ``index``'s log so far."""
        return self.log_path(index).read_text(errors="replace")


def run_sharedstream(
    *args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``sharedstream ARGS`` as a user runs it (this tree's code first on the path); not checked.

    ``env`` adds to (and overrides) the test process's environment.
    """
    return subprocess.run(
        [sys.executable, "-m", "sharedstream", *args], cwd=cwd, env=cli_environment(env),
        input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
    )


def cli_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment with this tree first on ``PYTHONPATH``, plus ``extra``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}
