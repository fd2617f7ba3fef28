"""PostgreSQL for tests and benchmarks: a throwaway cluster (``initdb`` + ``pg_ctl``) on loopback.

:func:`postgres_server` runs ``initdb`` into a fresh temporary directory and
starts the cluster with ``pg_ctl`` on a free ``127.0.0.1`` port, its unix
socket in the same directory (never the system's ``/var/run/postgresql``),
trust authentication for the ``postgres`` superuser; it yields the admin
URL (``postgresql://postgres@127.0.0.1:<port>/postgres``) and stops the
cluster (``pg_ctl stop -m fast``) and removes the directory when the block
ends, however it ends. :func:`fresh_database` creates an empty database on
such a server (or any server the URL names) and drops it afterwards.

The binaries are Debian's ``postgresql`` package: ``initdb`` and ``pg_ctl``
on ``PATH``, else the newest ``/usr/lib/postgresql/<version>/bin``. When
neither exists :class:`~.process.BrokerNotInstalled` says to
``apt-get install -y postgresql``. PostgreSQL refuses to run as root; as
root the cluster runs as the ``postgres`` user the package creates.

``durable=False`` (the default) turns ``fsync`` off: a test cluster is
thrown away, and its commits then cost no disk flush. Benchmarks pass
``durable=True`` (``fsync`` and ``synchronous_commit`` on, the defaults).

The server runs in a session of its own, so a Ctrl-C in the terminal
reaches only the caller, which stops it. ``python -m
sharedstream.testing.brokers.postgres`` (:func:`main`) runs one for a
person to try things on: it prints the URL to give ``sharedstream init
--db`` and runs until Ctrl-C or SIGTERM, then stops the server and deletes
its data.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sharedstream.testing.brokers.process import (
    BrokerDidNotStart,
    BrokerNotInstalled,
    LocalBrokerError,
    free_port,
)

__all__ = [
    "POSTGRES_INSTALL_HINT",
    "fresh_database",
    "main",
    "postgres_bin_dir",
    "postgres_server",
]

POSTGRES_INSTALL_HINT = "apt-get install -y postgresql"
_TIMEOUT = 60.0


def postgres_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``; :class:`BrokerNotInstalled` if none."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1].parent
    raise BrokerNotInstalled(f"no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under "
                             f"/usr/lib/postgresql; {POSTGRES_INSTALL_HINT}")


def _run_as() -> list[str]:
    """The prefix running a command as the ``postgres`` user when we are root, else nothing."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise BrokerNotInstalled("running as root, and PostgreSQL refuses root: no 'postgres' "
                                 f"user to run it as; {POSTGRES_INSTALL_HINT}") from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise BrokerNotInstalled("running as root without runuser to start PostgreSQL as the "
                                 "'postgres' user")
    return [runuser, "-u", "postgres", "--"]


def _run(command: Sequence[str], what: str, log_path: Path) -> None:
    """Run one setup command to completion; :class:`BrokerDidNotStart` naming its log otherwise."""
    with log_path.open("ab") as log:
        try:
            subprocess.run(  # noqa: S603 - a PostgreSQL command the kit built
                list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                check=True, timeout=_TIMEOUT, start_new_session=True,
            )
        except subprocess.CalledProcessError as exc:
            raise BrokerDidNotStart(f"{what} failed with {exc.returncode}; see {log_path}") from exc
        except subprocess.TimeoutExpired as exc:
            raise BrokerDidNotStart(f"{what} took over {_TIMEOUT:.0f} s; see {log_path}") from exc


@contextlib.contextmanager
def postgres_server(*, durable: bool = False) -> Iterator[str]:
    """A new PostgreSQL cluster on a free loopback port for the block; yields its admin URL.

    The cluster lives in a temporary directory (data, unix socket, log),
    stopped and removed when the block ends. Raises
    :class:`BrokerNotInstalled` without the binaries,
    :class:`~.process.BrokerDidNotStart` (naming the log) when ``initdb`` or
    the start fails. ``durable`` keeps ``fsync`` on (see the module docstring).
    """
    bin_dir = postgres_bin_dir()
    prefix = _run_as()
    workdir = Path(tempfile.mkdtemp(prefix="sharedstream-pg-"))
    try:
        if prefix:
            shutil.chown(workdir, "postgres", "postgres")
        data, log_path = workdir / "data", workdir / "postgres.log"
        log_path.touch()
        if prefix:
            shutil.chown(log_path, "postgres", "postgres")
        _run([*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
              "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"], "initdb", log_path)
        port = free_port()
        options = [f"-p {port}", "-c listen_addresses=127.0.0.1",
                   f"-c unix_socket_directories={workdir}", "-c max_connections=200"]
        if not durable:
            options += ["-c fsync=off", "-c full_page_writes=off"]
        pg_ctl = [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data)]
        _run([*pg_ctl, "-l", str(log_path), "-o", " ".join(options), "-w",
              "-t", str(int(_TIMEOUT)), "start"], "pg_ctl start", log_path)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            _run([*pg_ctl, "-m", "fast", "-w", "stop"], "pg_ctl stop", log_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextlib.contextmanager
def fresh_database(admin_url: str, *, prefix: str = "sharedstream_test") -> Iterator[str]:
    """An empty database on the server of ``admin_url`` for the block; yields its URL.

    ``admin_url`` must name a role allowed to create databases. The database
    (``<prefix>_<random hex>``, from ``template0``) is dropped when the block
    ends, connections still open to it included (``WITH (FORCE)``).
    """
    import psycopg  # noqa: PLC0415 - the postgres extra; only those who ask for a database need it

    if not re.fullmatch(r"[a-z_][a-z0-9_]*", prefix):
        raise ValueError(f"database prefix must be a lower-case SQL identifier, got {prefix!r}")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    try:
        yield _with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main(argv: Sequence[str] | None = None) -> int:
    """A throwaway PostgreSQL until Ctrl-C or SIGTERM (see the module docstring); the exit status.

    0 once stopped; 2 and one line when it cannot start (no binaries: what
    to install).
    """
    parser = argparse.ArgumentParser(
        prog="python -m sharedstream.testing.brokers.postgres",
        description="Run a throwaway PostgreSQL server on a free 127.0.0.1 port (initdb into a "
        "temporary directory, trust authentication) until Ctrl-C; print its URL.")
    parser.parse_args(argv)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: stopping.set())
    try:
        with postgres_server(durable=True) as url:
            print(f"PostgreSQL running: {url}\n\n"
                  f"  sharedstream init --db {url}\n\n"
                  "Ctrl-C stops it and deletes its data.", flush=True)
            while not stopping.wait(0.2):
                pass
    except LocalBrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("stopped PostgreSQL", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
