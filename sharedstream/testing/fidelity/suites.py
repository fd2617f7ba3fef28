"""The two SDK test suites, set up against the kit's servers and run as pytest processes.

A suite is the SDK's source distribution (:mod:`.sources`), the test files
of it that cover what the server implements, and the adapted fixtures:

* **pubsub** - ``tests/system.py`` of google-cloud-pubsub. The runner
  starts the kit's Pub/Sub server (``pubsub_server()``) and points the
  client at it through what Google's tests read from the environment:
  ``PUBSUB_EMULATOR_HOST``, ``GOOGLE_CLOUD_PROJECT``, and
  ``GOOGLE_APPLICATION_CREDENTIALS`` naming a throwaway user credential
  made in the work directory (``google.auth.default()`` needs one; the
  client sends no credentials to an emulator host). The samples of
  python-pubsub are not in the source distribution and not on PyPI, so they
  are not run.
* **servicebus** - azure-servicebus's sync and async tests of queues,
  topics, subscriptions, sessions and the client, on the pyamqp transport
  (uamqp is not installed). Their helpers are replaced by our stand-ins
  (:mod:`.standins`, through one-line shims written to the work directory),
  whose plugin starts the kit's Service Bus server on ``localhost:5671``
  with TLS, and AMQP over WebSockets on ``localhost:443``. With root and
  ``unshare`` each shard runs in a network namespace of its own (a private
  loopback, so several servers can take ports 5671 and 443 at once);
  otherwise one shard runs on this machine's loopback, and both ports must
  be free to bind.

Each shard is one pytest process with :mod:`.report` loaded; the
processes of both suites run at once, since the tests mostly wait (lock
expiries, receive timeouts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path

import sharedstream
from sharedstream.testing.fidelity.sources import Sdist, fetch_sdist, install_helpers
from sharedstream.testing.fidelity.verdict import Exclusion

__all__ = ["SUITES", "Shard", "Suite", "run_shards"]

_REPO_ROOT = Path(sharedstream.__file__).resolve().parent.parent
_SHIMS = {
    "devtools_testutils/__init__.py": "from sharedstream.testing.fidelity.standins.devtools "
                                      "import *",
    "devtools_testutils/sanitizers.py": "from sharedstream.testing.fidelity.standins.devtools "
                                        "import *",
    "servicebus_preparer.py": "from sharedstream.testing.fidelity.standins.servicebus_resources "
                              "import *",
    "azure/mgmt/servicebus/models.py": "from sharedstream.testing.fidelity.standins.mgmt_models "
                                       "import *",
}
_PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
timeout = {timeout}
markers =
    liveTest: a live test (all of them are, here)
    live_test_only: a live test (all of them are, here)
    playback_test_only: recording playback (none here)
"""


@dataclasses.dataclass(frozen=True)
class Shard:
    """One pytest process of a suite: its command, environment and outcome file."""

    suite: str
    index: int
    command: list[str]
    env: dict[str, str]
    cwd: Path
    outcomes: Path
    log: Path


@dataclasses.dataclass(frozen=True)
class Suite:
    """One SDK's tests: where they come from and how they are pointed at the server."""

    name: str
    sdist: Sdist
    test_files: tuple[str, ...]
    helpers: tuple[str, ...] = ()
    per_test_timeout: int = 120
    import_mode: str = "prepend"
    """``append`` where our shims must come before the SDK's own test helpers on ``sys.path``."""

    def shards(self, workdir: Path, cache: Path, exclusions: Sequence[Exclusion],
               count: int, *, select: str | None = None,
               timeouts: Mapping[str, int] | None = None,
               ) -> tuple[list[Shard], AbstractContextManager[object]]:
        """The shards of a run in ``workdir``, and what must run around them (a server).

        ``select`` is a pytest ``-k`` expression: only the tests it selects run.
        ``timeouts``: node id -> seconds, for the tests that wait longer than
        :attr:`per_test_timeout` by design.
        """
        source = fetch_sdist(self.sdist, cache)
        helpers = install_helpers(self.helpers, cache)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "pytest.ini").write_text(
            _PYTEST_INI.format(timeout=self.per_test_timeout), encoding="utf-8")
        exclude = workdir / "exclude.json"
        exclude.write_text(json.dumps([item.pattern for item in exclusions]), encoding="utf-8")
        slow = workdir / "timeouts.json"
        slow.write_text(json.dumps(dict(timeouts or {})), encoding="utf-8")
        path = [str(p) for p in (self._shims(workdir), helpers, _REPO_ROOT) if p is not None]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path),
               "SHAREDSTREAM_FIDELITY_EXCLUDE": str(exclude),
               "SHAREDSTREAM_FIDELITY_TIMEOUTS": str(slow), "PYTHONDONTWRITEBYTECODE": "1"}
        plugins = ["-p", "sharedstream.testing.fidelity.report", *self._plugins()]
        shards = []
        for index in range(count):
            shard_dir = workdir / f"shard-{index}"
            shard_dir.mkdir(exist_ok=True)
            outcomes = shard_dir / "outcomes.json"
            outcomes.unlink(missing_ok=True)
            pytest = [sys.executable, "-m", "pytest", "-c", str(workdir / "pytest.ini"),
                      "--rootdir", str(source), f"--import-mode={self.import_mode}",
                      "-p", "no:cacheprovider", "-q", "-rN", *plugins,
                      *(["-k", select] if select is not None else []),
                      *(str(source / name) for name in self.test_files)]
            shards.append(Shard(
                self.name, index, self._wrap(pytest, count),
                {**env, "SHAREDSTREAM_FIDELITY_OUTCOMES": str(outcomes),
                 "SHAREDSTREAM_FIDELITY_WORKDIR": str(shard_dir),
                 "SHAREDSTREAM_FIDELITY_SHARD": f"{index}/{count}"},
                shard_dir, outcomes, shard_dir / "pytest.log"))
        return shards, self._around(workdir, shards)

    def _shims(self, workdir: Path) -> Path | None:
        return None

    def _plugins(self) -> list[str]:
        return []

    def _wrap(self, command: list[str], count: int) -> list[str]:
        return command

    def _around(self, workdir: Path, shards: Sequence[Shard]) -> AbstractContextManager[object]:
        return nullcontext()

    def max_shards(self) -> int:
        """How many shards can run at once on this machine."""
        return 1


class PubSubSuite(Suite):
    """google-cloud-pubsub's system tests against one kit Pub/Sub server."""

    def _around(self, workdir: Path, shards: Sequence[Shard]) -> AbstractContextManager[object]:
        return _pubsub_environment(workdir, [shard.env for shard in shards])


@contextmanager
def _pubsub_environment(workdir: Path, envs: Sequence[dict[str, str]]) -> Iterator[None]:
    from sharedstream.testing.brokers import pubsub_server  # noqa: PLC0415 - needs grpc

    credentials = workdir / "user-credentials.json"
    credentials.write_text(json.dumps({  # a user credential that is never sent anywhere
        "type": "authorized_user", "client_id": "fidelity", "client_secret": "fidelity",
        "refresh_token": "fidelity"}), encoding="utf-8")
    with pubsub_server(workdir / "server") as host:
        for env in envs:
            env.update(PUBSUB_EMULATOR_HOST=host, GOOGLE_CLOUD_PROJECT="fidelity-project",
                       GOOGLE_APPLICATION_CREDENTIALS=str(credentials))
        yield


class ServiceBusSuite(Suite):
    """azure-servicebus's tests against a kit Service Bus server per shard, on port 5671."""

    def _shims(self, workdir: Path) -> Path:
        shims = workdir / "shims"
        for name, line in _SHIMS.items():
            (shims / name).parent.mkdir(parents=True, exist_ok=True)
            (shims / name).write_text(f"{line}  # noqa: F403 - written by the fidelity runner\n",
                                      encoding="utf-8")
        return shims

    def _plugins(self) -> list[str]:
        return ["-p", "sharedstream.testing.fidelity.standins.devtools"]

    def max_shards(self) -> int:
        return 24 if _private_loopback_possible() else 1

    def _wrap(self, command: list[str], count: int) -> list[str]:
        if not _private_loopback_possible():
            return command
        return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]

    def _around(self, workdir: Path, shards: Sequence[Shard]) -> AbstractContextManager[object]:
        if not _private_loopback_possible():
            for port in (5671, 443):  # AMQP over TLS, and over WebSockets
                with socket.socket() as probe:
                    try:
                        probe.bind(("127.0.0.1", port))
                    except OSError as exc:
                        raise OSError(f"port {port} cannot be bound on 127.0.0.1 ({exc.strerror}) "
                                      "and no private network namespace can be made here "
                                      "(needs root and unshare)") from exc
        return nullcontext()


def _private_loopback_possible() -> bool:
    return (sys.platform == "linux" and os.geteuid() == 0
            and shutil.which("unshare") is not None and shutil.which("ip") is not None)


SUITES: Mapping[str, Suite] = {
    "pubsub": PubSubSuite(
        "pubsub", Sdist("google-cloud-pubsub", "2.44.0"), ("tests/system.py",),
        helpers=("flaky==3.8.1", "psutil==7.2.2", "google-cloud-testutils==1.10.1")),
    "servicebus": ServiceBusSuite(
        "servicebus", Sdist("azure-servicebus", "7.15.0"),
        (*(f"tests/{folder}test_{area}{suffix}.py"
           for folder, suffix in (("", ""), ("async_tests/", "_async"))
           for area in ("queues", "sessions", "subscriptions", "topic", "sb_client",
                        "list_sessions")),
         # the message tests that go through a queue (the rest of the file needs no server)
         "tests/test_message.py::TestServiceBusMessageBackcompat"),
        # websocket-client: the SDK's sync AMQP over WebSockets (an extra the SDK does not pull)
        helpers=("azure-common==1.1.28", "websocket-client==1.9.2"), import_mode="append"),
}
"""The suites by name, with the SDK versions sharedstream is tested with."""


def run_shards(shards: Sequence[Shard], timeout: float,
               on_done: Callable[[Shard, int, float], None]) -> dict[str, dict[str, str]]:
    """Run every shard at once; the outcomes per suite (node id -> outcome).

    A shard still running after ``timeout`` seconds is killed (its tests
    then have no outcome, and the verdict names those on the list).
    ``on_done(shard, returncode, seconds)`` is called as each one ends.
    """
    started = time.monotonic()
    with ExitStack() as stack:
        running = []
        for shard in shards:
            log = stack.enter_context(shard.log.open("w", encoding="utf-8"))
            process = subprocess.Popen(  # noqa: S603 - our interpreter, arguments we built
                shard.command, env=shard.env, cwd=shard.cwd, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
            running.append((shard, process))
        for shard, process in running:
            try:
                returncode = process.wait(timeout=max(0.0, timeout - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # pytest and the server it started
                returncode = process.wait()
            on_done(shard, returncode, time.monotonic() - started)
    outcomes: dict[str, dict[str, str]] = {}
    for shard in shards:
        if shard.outcomes.is_file():
            found = json.loads(shard.outcomes.read_text(encoding="utf-8"))
            outcomes.setdefault(shard.suite, {}).update(found)
    return outcomes
