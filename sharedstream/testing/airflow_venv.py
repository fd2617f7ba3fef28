"""Apache Airflow from the package index in a virtualenv of its own, cached between runs.

Airflow pins its dependencies (SQLAlchemy, FastAPI, pydantic, ...) and ours
must never meet them: :func:`airflow_venv` builds a separate virtualenv with
``apache-airflow==<version>`` (plus any extra requirements, a provider) and
returns its directory; :mod:`sharedstream.testing.airflow` runs Airflow from
it. Nothing here imports Airflow.

Invariants:

1. A cached virtualenv is complete or absent. It is built in a temporary
   sibling directory (``.<name>.building-<pid>``), its scripts are pointed at
   the final path, and it is renamed into place: the rename is the one step
   that makes it visible. A build that fails or is interrupted removes its
   directory; one that was killed is removed by the next build.
2. One builder at a time: an ``fcntl`` lock (``.<name>.lock`` beside it) is
   held while building, and a waiting caller reuses what the holder built.
3. Only a directory with ``bin/airflow`` counts as installed; nothing else is
   checked, so a virtualenv named by ``$SHAREDSTREAM_AIRFLOW_VENV`` is used
   as is.
4. Every failure is :class:`BrokerNotInstalled` with a one-line message
   naming the command and its last line of output; the full output is in
   ``<name>.install.log`` beside the virtualenv.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sharedstream.testing.brokers.process import BrokerNotInstalled, LocalBrokerError

__all__ = [
    "DEFAULT_AIRFLOW_VERSION",
    "VENV_ENV",
    "airflow_venv",
    "airflow_venv_path",
    "last_line",
    "run_logged",
]

DEFAULT_AIRFLOW_VERSION = os.environ.get("SHAREDSTREAM_AIRFLOW_VERSION") or "3.3.2"
"""The Airflow installed unless told otherwise: ``$SHAREDSTREAM_AIRFLOW_VERSION`` at import."""

VENV_ENV = "SHAREDSTREAM_AIRFLOW_VENV"
"""Names the virtualenv to use (built there if it has no ``bin/airflow`` yet)."""

_PIP_TIMEOUT = 900.0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # an install takes half a minute: say why


def last_line(path: Path) -> str:
    """The last non-blank line of ``path`` (at most 200 characters), or ``""``."""
    try:
        with path.open("rb") as file:
            file.seek(max(0, file.seek(0, 2) - 4096))
            lines = [line.strip() for line in file.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    last = next((line for line in reversed(lines) if line), "")
    return last if len(last) <= 200 else last[:199] + "…"


def airflow_venv_path(version: str = DEFAULT_AIRFLOW_VERSION, extra: Sequence[str] = ()) -> Path:
    """Where :func:`airflow_venv` keeps this version with these extras (it may not exist yet).

    ``$SHAREDSTREAM_AIRFLOW_VENV`` when set; otherwise
    ``~/.cache/sharedstream/airflow-<version>[-<hash of extras>]-py<major><minor>``
    (``$XDG_CACHE_HOME`` instead of ``~/.cache`` when set). The hash does not
    depend on the order of ``extra``.
    """
    explicit = os.environ.get(VENV_ENV)
    if explicit:
        return Path(explicit)
    name = f"airflow-{version}"
    if extra:
        name += "-" + hashlib.sha256("\n".join(sorted(extra)).encode()).hexdigest()[:10]
    name += f"-py{sys.version_info.major}{sys.version_info.minor}"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sharedstream" / name


def airflow_venv(version: str = DEFAULT_AIRFLOW_VERSION, *, extra: Sequence[str] = (),
                 pip: Sequence[str] | None = None) -> Path:
    """A virtualenv with ``apache-airflow==version`` and ``extra`` installed; built on first use.

    Returns :func:`airflow_venv_path` at once if it has ``bin/airflow``
    (nothing more is checked). Otherwise builds it there (about 30 s), one
    process at a time: a second caller waits, then reuses the result.
    ``pip`` replaces the new virtualenv's own pip as the install command
    (the requirements are appended; ``VIRTUAL_ENV`` names the virtualenv).
    The output goes to ``<name>.install.log`` beside it.

    Raises :class:`BrokerNotInstalled` (retrying does not help) when the
    virtualenv cannot be created, the install fails or takes over 15
    minutes (the message names the command and its last line of output), or
    the path exists but is neither a complete virtualenv nor empty.
    """
    target = airflow_venv_path(version, extra)
    if (target / "bin" / "airflow").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        if (target / "bin" / "airflow").is_file():  # built by another process meanwhile
            return target
        if target.exists():
            with contextlib.suppress(OSError):
                target.rmdir()  # empty: ours to fill; anything else is not ours to delete
            if target.exists():
                raise BrokerNotInstalled(f"{target} exists but has no bin/airflow; remove it "
                                         f"(or point {VENV_ENV} elsewhere) to install Airflow")
        what = f"Apache Airflow {version}" + (f" with {', '.join(extra)}" if extra else "")
        _build(target, what, [f"apache-airflow=={version}", *extra], pip)
    return target


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``.<name>.lock`` beside ``target`` (bounded wait)."""
    with (target.parent / f".{target.name}.lock").open("a") as handle:
        patience = _PIP_TIMEOUT + 120
        deadline = time.monotonic() + patience
        for attempt in itertools.count():
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            if attempt == 0:
                _say(f"waiting for another process to finish installing into {target}")
            if time.monotonic() > deadline:
                raise BrokerNotInstalled(f"another process has been installing into {target} "
                                         f"for over {patience:.0f} s")
            time.sleep(0.2)
        yield  # closing the file releases the lock


def _build(target: Path, what: str, requirements: list[str], pip: Sequence[str] | None) -> None:
    building = target.with_name(f".{target.name}.building-{os.getpid()}")
    for leftover in target.parent.glob(f".{target.name}.building-*"):
        shutil.rmtree(leftover, ignore_errors=True)  # a killed build's: we hold the lock
    log = target.parent / f"{target.name}.install.log"
    log.write_bytes(b"")
    _say(f"installing {what} into {target} (about 30 s, once)")
    started = time.monotonic()
    try:
        run_logged([sys.executable, "-m", "venv", str(building)], log, None)
        command = [*(pip if pip is not None else [
            str(building / "bin" / "python"), "-m", "pip", "install",
            "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]), *requirements]
        run_logged(command, log, {**os.environ, "VIRTUAL_ENV": str(building)})
        _relocate(building, target)
        building.rename(target)  # the one step that makes it visible, all at once
    except BaseException:  # a failure or Ctrl-C: leave no half-built virtualenv behind
        shutil.rmtree(building, ignore_errors=True)
        raise
    _say(f"{what} installed in {time.monotonic() - started:.0f} s: {target}")


def run_logged(command: list[str], log: Path, env: Mapping[str, str] | None,
               timeout: float = _PIP_TIMEOUT,
               failure: type[LocalBrokerError] = BrokerNotInstalled) -> None:
    """Run ``command`` to its end, its output appended to ``log``; raise ``failure`` unless 0.

    ``failure``'s one-line message names the command (its program's base
    name) and ``log``'s last line; so does a timeout. Shared with the
    server's ``airflow db migrate``.
    """
    shown = shlex.join([Path(command[0]).name, *command[1:]]).replace("\n", "\\n")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        try:
            completed = subprocess.run(  # noqa: S603 - a command the kit built (or its caller gave)
                command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env), timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise failure(f"`{shown}` did not finish within {timeout:.0f} s: {last_line(log)} "
                          f"(see {log})") from None
        except OSError as exc:
            raise failure(f"`{shown}` could not run: {exc}") from exc
    if completed.returncode != 0:
        raise failure(f"`{shown}` failed with exit code {completed.returncode}: {last_line(log)} "
                      f"(see {log})")


def _relocate(built: Path, final: Path) -> None:
    """Point the scripts' ``#!`` lines (and ``activate``) at ``final``, where they will live."""
    old, new = os.fsencode(built), os.fsencode(final)
    for path in [*(built / "bin").iterdir(), built / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data and (data.startswith(b"#!") or path.name.startswith(("activate", "pyvenv"))):
            path.write_bytes(data.replace(old, new))


