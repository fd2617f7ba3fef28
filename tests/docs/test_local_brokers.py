"""Replay the local-broker sessions of the docs: ``broker start``, then ``send``, as shown.

A page marks each step with an HTML comment (invisible when rendered) that
applies to the ``console`` block right after it:

* ``<!-- local-broker: start -->`` - the block's one command, ``sharedstream
  broker start BROKER --port N``, is started in the background; what it
  prints until ``Ctrl-C stops it.`` must be the block's other lines. A
  page's broker runs until its next ``start`` or the page's end, then gets
  SIGINT and must exit 0.
* ``<!-- local-broker: shell -->`` - every ``$ command`` runs in bash in
  the page's working directory (``export`` lines set the environment of
  the commands after them); the lines after a command are its expected
  output (stdout and stderr together); a command without must succeed.

Before comparing, the page's port ``N`` becomes a port free here (in the
commands and the outputs alike) and the temporary directory of the
broker's log becomes ``.../sharedstream-<broker>-*/``. ``sharedstream`` is
this tree's CLI, through the running interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sharedstream.testing.brokers import BrokerNotInstalled, free_port, tansu_binary
from tests.cli import cli_environment

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("local-brokers.md", "kafka.md", "sqs.md", "pubsub.md", "servicebus.md")
NEEDS = {"kafka": ("aiokafka",), "sqs": ("aiobotocore", "moto"),
         "pubsub": ("google.pubsub_v1",), "servicebus": ("azure.servicebus", "proton")}
"""What each broker's session needs installed (else the page is skipped)."""
STOP_WITHIN = 5.0
BASH = shutil.which("bash") or "/bin/bash"

_MARKER = re.compile(r"^<!-- local-broker: (?P<kind>start|shell) -->$")
_FENCE = re.compile(r"^```(?P<info>\S*)\s*$")
_LOG_DIR = re.compile(r"\S*/sharedstream-(?P<broker>[a-z]+)-\w+/")


@dataclass
class Step:
    kind: str
    line: int
    body: list[str]
    commands: list[tuple[str, list[str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for text in self.body:
            if text.startswith("$ "):
                self.commands.append((text[2:], []))
            else:
                assert self.commands, f"line {self.line}: output before the first command"
                self.commands[-1][1].append(text)


def steps(page: str) -> list[Step]:
    """The marked console blocks of ``page``, in order."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    found = []
    for number, text in enumerate(lines):
        marker = _MARKER.match(text)
        if marker is None:
            continue
        opened = _FENCE.match(lines[number + 1])
        assert opened is not None, f"{page}:{number + 1}: a marker needs a block"
        assert opened["info"] == "console", f"{page}:{number + 1}: needs a console block"
        end = next(i for i in range(number + 2, len(lines)) if lines[i].startswith("```"))
        found.append(Step(marker["kind"], number + 3, lines[number + 2:end]))
    return found


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Replay:
    """One page's session: its directory, environment, port and running broker."""

    def __init__(self, page: str, workdir: Path) -> None:
        self.page, self.dir = page, workdir
        bin_dir = workdir / ".bin"
        bin_dir.mkdir()
        shim = bin_dir / "sharedstream"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sharedstream "$@"\n')
        shim.chmod(0o755)
        self.env = {name: value for name, value in cli_environment().items()
                    if not name.startswith(("SHAREDSTREAM", "AIRFLOW_CONN", "PUBSUB_EMULATOR"))}
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}"
        self.ports: dict[str, str] = {}
        self.broker: subprocess.Popen[str] | None = None

    def localize(self, text: str) -> str:
        """``text`` with the page's port made this run's, and the log directory generic."""
        for page_port, port in self.ports.items():
            text = text.replace(f":{page_port}", f":{port}").replace(
                f"--port {page_port}", f"--port {port}")
        return _LOG_DIR.sub(r".../sharedstream-\g<broker>-*/", text).rstrip()

    def where(self, step: Step, command: str) -> str:
        return f"docs/{self.page}:{step.line}: $ {command}"

    def start(self, step: Step) -> None:
        self.stop()
        [(command, expected)] = step.commands
        words = shlex.split(command)
        assert words[:3] == ["sharedstream", "broker", "start"], self.where(step, command)
        for module in NEEDS[words[3]]:
            if not _installed(module):
                pytest.skip(f"{words[3]} needs {module}")
        if words[3] == "kafka":
            try:
                tansu_binary()
            except BrokerNotInstalled as exc:
                pytest.skip(str(exc))
        self.ports[words[words.index("--port") + 1]] = str(free_port())
        self.broker = subprocess.Popen(
            [BASH, "-c", self.localize(command)], cwd=self.dir, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.broker.stdout is not None
        shown: list[str] = []
        while not shown or shown[-1] != "Ctrl-C stops it.":
            line = self.broker.stdout.readline()
            assert line, f"{self.where(step, command)}: exited: {self.broker.communicate()[1]}"
            shown.append(line.rstrip("\n"))
        assert [self.localize(line) for line in shown] == [
            self.localize(line) for line in expected], self.where(step, command)

    def shell(self, step: Step) -> None:
        for command, expected in step.commands:
            local = self.localize(command)
            if local.startswith("export "):
                name, _, value = local.removeprefix("export ").partition("=")
                self.env[name] = shlex.split(value)[0]
                continue
            result = subprocess.run([BASH, "-c", local], cwd=self.dir, env=self.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, timeout=60, check=False)
            if not expected:
                assert result.returncode == 0, f"{self.where(step, command)}\n{result.stdout}"
                continue
            assert [self.localize(line) for line in result.stdout.splitlines()] == [
                self.localize(line) for line in expected], (
                f"{self.where(step, command)}\n{result.stdout}")

    def stop(self) -> None:
        """SIGINT to the running broker: it must exit 0, quickly."""
        broker, self.broker = self.broker, None
        if broker is None:
            return
        broker.send_signal(signal.SIGINT)
        began = time.monotonic()
        assert broker.wait(timeout=STOP_WITHIN) == 0, broker.communicate()[1]
        assert time.monotonic() - began < STOP_WITHIN
        broker.communicate()

    def kill(self) -> None:
        if self.broker is not None and self.broker.poll() is None:
            self.broker.kill()
            self.broker.wait()


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("page", PAGES)
def test_the_page_s_session_does_what_it_shows(page: str, tmp_path: Path) -> None:
    found = steps(page)
    assert found, f"docs/{page} has no local-broker session"
    assert found[0].kind == "start", f"docs/{page}: a session opens with a broker start"
    replay = Replay(page, tmp_path)
    try:
        for step in found:
            getattr(replay, step.kind)(step)
        replay.stop()
    finally:
        replay.kill()
