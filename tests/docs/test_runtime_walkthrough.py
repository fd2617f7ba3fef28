"""Replay the complete example of ``docs/runtime.md``, command by command.

The page marks each step of its example with an HTML comment (invisible when
rendered) that applies to the fenced block right after it:

* ``<!-- walkthrough: file NAME -->`` - the block is saved as ``NAME`` in the
  working directory (the definitions file).
* ``<!-- walkthrough: shell [ignore=COLUMN,...] -->`` - a ``console`` block.
  Every ``$ command`` runs in the working directory; the lines after it are
  its expected output (stdout and stderr, as a terminal shows them). The
  triggerer works asynchronously, so a command with expected output is
  re-run until its output matches (it must only read); a command without
  must succeed, once. ``ignore=`` blanks table columns whose values change
  with time (``ERRORS``, which grows with every restart).
* ``<!-- walkthrough: start -->`` - the block's one command, the triggerer,
  is started in the background; the lines after it must show up in its log.
* ``<!-- walkthrough: stop -->`` - the triggerer gets SIGTERM and must exit
  0; every line of the block must be in its log (``...`` stands for lines
  not shown) and the block's last line must be the log's last line.

Before comparing, timestamps become ``<time>``, log lines lose their
timestamp prefix, and the test's working directory is written as the page's
``/home/you/shop``. ``sharedstream`` runs as ``sys.executable -m
sharedstream``; every other command runs under ``bash``. So what the page
shows is what a user typing it sees, up to the clock and the directory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "runtime.md"
DOC_DIR = "/home/you/shop"
"""The directory the page's example runs in; the test's directory stands in for it."""

WAIT = 10.0
"""Seconds an expected output or log line may take to appear."""

SHELL_LANGUAGES = frozenset({"console", "bash", "sh", "shell", "shell-session", "zsh"})

_MARKER = re.compile(r"^<!-- walkthrough: (?P<kind>\w+)(?: (?P<arg>[^>]*?))? -->$")
_FENCE_OPEN = re.compile(r"^```(?P<info>\S*)\s*$")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:\d\d)?")
_KEYGEN = re.compile(
    r'`python -c "(?P<code>from sharedstream\.runtime\.crypto import generate_key;[^"`]*)"`'
)


@dataclass(frozen=True)
class Step:
    """One marked block of the page."""

    kind: str
    arg: str
    body: list[str]
    line: int

    def where(self) -> str:
        """``docs/runtime.md:LINE`` of the block."""
        return f"{PAGE.relative_to(ROOT)}:{self.line}"


@dataclass
class Command:
    """A ``$ command`` of a console block and the output shown under it."""

    text: str
    expected: list[str] = field(default_factory=list)


def fences(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """``(line of the opening fence, info string, body lines)`` of every fenced block."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE_OPEN.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        yield index + 1, opening["info"], lines[index + 1 : end]
        index = end + 1


def steps(text: str) -> list[Step]:
    """The marked blocks of the page, in order."""
    lines = text.splitlines()
    bodies = {line: (info, body) for line, info, body in fences(text)}
    found = []
    for number, line in enumerate(lines, 1):
        marker = _MARKER.match(line)
        if marker is None:
            continue
        fence = number + 1
        while fence <= len(lines) and not lines[fence - 1].strip():
            fence += 1
        assert fence in bodies, f"docs/runtime.md:{number}: a walkthrough marker needs a block"
        found.append(Step(marker["kind"], marker["arg"] or "", bodies[fence][1], fence))
    return found


def commands(step: Step) -> list[Command]:
    """The ``$ commands`` of a console block, each with its expected output."""
    parsed: list[Command] = []
    for line in step.body:
        if line.startswith("$ "):
            parsed.append(Command(line[2:]))
        else:
            assert parsed, f"{step.where()}: output before the first command"
            parsed[-1].expected.append(line)
    return parsed


def blank_columns(lines: list[str], columns: list[str]) -> list[str]:
    """Blank the given columns of a table, located by the header line naming them."""
    for column in columns:
        title = re.compile(rf"(?<!\S){re.escape(column)}(?!\S) *")
        header = next((i for i, line in enumerate(lines) if title.search(line)), None)
        if header is None:
            continue
        match = title.search(lines[header])
        assert match is not None
        start, end = match.start(), match.end()
        lines = lines[:header] + [
            line[:start] + " " * len(line[start:end]) + line[end:] for line in lines[header:]
        ]
    return lines


class Session:
    """The working directory of the example, and the triggerer running in it."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "shop"
        self.dir.mkdir()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.env = {
            name: value for name, value in os.environ.items()
            if not name.upper().startswith("SHAREDSTREAM")
        }
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])
        )
        self.triggerer: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    def normalize(self, text: str) -> list[str]:
        """Lines of ``text`` with the directory and timestamps made comparable."""
        for directory in sorted({str(self.dir.resolve()), str(self.dir)}, key=len, reverse=True):
            text = text.replace(directory, DOC_DIR)
        text = _TIMESTAMP.sub("<time>", text)
        return [line.rstrip() for line in text.strip("\n").splitlines()]

    def argv(self, command: str) -> list[str]:
        """How to run ``command``: the CLI through this interpreter, anything else in bash."""
        words = shlex.split(command)
        if words[0] == "sharedstream":
            return [sys.executable, "-m", "sharedstream", *words[1:]]
        return ["bash", "-c", command]

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run one command to completion; stdout and stderr together, as on a terminal."""
        return subprocess.run(
            self.argv(command), cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=60, check=False,
        )

    def shell(self, step: Step) -> None:
        """Run a console block, each command until it shows the page's output."""
        ignore = [c for c in step.arg.removeprefix("ignore=").split(",") if c] if step.arg else []
        for command in commands(step):
            result = self.run(command.text)
            if not command.expected:
                assert result.returncode == 0, f"{step.where()}: $ {command.text}\n{result.stdout}"
                continue
            expected = self.normalize("\n".join(blank_columns(command.expected, ignore)))
            deadline = time.monotonic() + WAIT
            while True:
                shown = blank_columns(result.stdout.splitlines(), ignore)
                if self.normalize("\n".join(shown)) == expected:
                    break
                if time.monotonic() > deadline:
                    pytest.fail(f"{step.where()}: $ {command.text}\nexpected:\n"
                                + "\n".join(expected) + "\nactual:\n" + result.stdout)
                time.sleep(0.1)
                result = self.run(command.text)

    def log_lines(self) -> list[str]:
        """The running (or last) triggerer's log, timestamp prefixes removed."""
        assert self.log is not None
        return [line.removeprefix("<time> ") for line in self.normalize(self.log.read_text())]

    def wait_for_log(self, step: Step, expected: list[str]) -> None:
        """Wait until every expected line (but ``...``) is in the log."""
        wanted = [line.removeprefix("<time> ") for line in expected if line != "..."]
        deadline = time.monotonic() + WAIT
        while missing := [line for line in wanted if line not in self.log_lines()]:
            assert self.triggerer is not None
            if self.triggerer.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{step.where()}: not in the triggerer's log: {missing}\nlog:\n"
                            + "\n".join(self.log_lines()))
            time.sleep(0.05)

    def start(self, step: Step) -> None:
        """Start the block's command in the background and wait for the lines shown."""
        [command] = commands(step)
        assert command.text.startswith("sharedstream triggerer "), step.where()
        assert self.triggerer is None, f"{step.where()}: the previous triggerer still runs"
        self.log = self.logs / f"triggerer-{step.line}.log"
        with self.log.open("wb") as log:
            self.triggerer = subprocess.Popen(
                self.argv(command.text), cwd=self.dir, env=self.env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
        self.wait_for_log(step, self.normalize("\n".join(command.expected)))

    def stop(self, step: Step) -> None:
        """SIGTERM the triggerer: exit status 0, and the block's lines in its log."""
        assert self.triggerer is not None, f"{step.where()}: no triggerer is running"
        self.triggerer.send_signal(signal.SIGTERM)
        code = self.triggerer.wait(timeout=30)
        self.triggerer = None
        assert code == 0, f"{step.where()}: the triggerer exited with {code}:\n" + "\n".join(
            self.log_lines()
        )
        expected = self.normalize("\n".join(step.body))
        missing = [
            line for line in (e.removeprefix("<time> ") for e in expected)
            if line != "..." and line not in self.log_lines()
        ]
        assert not missing, f"{step.where()}: not in the triggerer's log: {missing}"
        assert self.log_lines()[-1] == expected[-1].removeprefix("<time> "), step.where()

    def close(self) -> None:
        """Kill a triggerer a failed step left behind."""
        if self.triggerer is not None and self.triggerer.poll() is None:
            self.triggerer.kill()
            self.triggerer.wait(timeout=10)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    """A fresh working directory; any triggerer left running is killed afterwards."""
    s = Session(tmp_path)
    yield s
    s.close()


def test_the_complete_example_does_what_the_page_shows(session: Session) -> None:
    """Every command of the example, replayed; outputs and logs as shown on the page."""
    page_steps = steps(PAGE.read_text(encoding="utf-8"))
    kinds = [step.kind for step in page_steps]
    assert kinds.count("file") == 1
    assert kinds.count("start") == kinds.count("stop") >= 2
    for step in page_steps:
        if step.kind == "file":
            (session.dir / step.arg).write_text("\n".join(step.body) + "\n", encoding="utf-8")
        elif step.kind == "shell":
            session.shell(step)
        elif step.kind == "start":
            session.start(step)
        elif step.kind == "stop":
            session.stop(step)
        else:
            pytest.fail(f"{step.where()}: unknown walkthrough step {step.kind!r}")
    assert session.triggerer is None, "the example must end with the triggerer stopped"

    # What the prose around the session claims, checked on what it left behind.
    config = session.dir / "sharedstream.toml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    result = session.run("sharedstream triggers list --json")
    assert result.returncode == 0, result.stdout
    failing = [t for t in json.loads(result.stdout) if t["errors"]]
    assert [t["id"] for t in failing] == [1, 3]
    assert all("Traceback" in t["last_traceback"] and t["last_error_at"] for t in failing)


def test_every_shell_block_is_replayed() -> None:
    """A shell example the replay does not run would go unproven."""
    text = PAGE.read_text(encoding="utf-8")
    replayed = {step.line for step in steps(text) if step.kind in ("shell", "start")}
    for line, info, _ in fences(text):
        language = info.split(" ", 1)[0]
        assert language not in SHELL_LANGUAGES or line in replayed, (
            f"docs/runtime.md:{line}: a ```{info} block outside the walkthrough is not "
            "tested; mark it <!-- walkthrough: shell --> or fence it as text"
        )


def test_the_key_generation_command_prints_a_usable_key(tmp_path: Path) -> None:
    """The one-liner the key rotation section gives prints a valid Fernet key."""
    from sharedstream.runtime.crypto import KwargsCipher  # noqa: PLC0415 - only this test needs it

    match = _KEYGEN.search(PAGE.read_text(encoding="utf-8"))
    assert match is not None, "the key generation command is gone from the page"
    result = subprocess.run(
        [sys.executable, "-c", match["code"]], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=True,
    )
    KwargsCipher(result.stdout.strip())


def test_the_metrics_table_lists_every_instrument() -> None:
    """The page's metrics table names exactly the instruments ``telemetry.py`` creates."""
    source = (ROOT / "sharedstream" / "engine" / "telemetry.py").read_text(encoding="utf-8")
    created = set(re.findall(r'"(sharedstream\.[a-z_.]+)"', source))
    section = PAGE.read_text(encoding="utf-8").partition("\n## Metrics\n")[2]
    listed = set(re.findall(r"^\| `(sharedstream\.[a-z_.]+)` \|", section, re.MULTILINE))
    assert created, "no instrument names found in sharedstream/engine/telemetry.py"
    assert listed == created
