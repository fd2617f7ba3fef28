"""The SDKs' own sources and the packages their tests import, fetched at run time into a cache.

Nothing of the SDKs' is kept in this repository: each run takes the
pinned source distribution from PyPI with ``pip download`` (once; later
runs reuse the unpacked copy under the cache directory) and installs the
test helpers their tests import (``flaky``, ``psutil``,
``google-cloud-testutils``) with ``pip install --target`` into the cache, not
into the running environment. The pins are the SDK versions sharedstream
is tested with; a run whose installed SDK is another version stops with
one line saying so (its tests would test a different client).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Sdist", "SourcesError", "cache_dir", "fetch_sdist", "install_helpers"]


class SourcesError(RuntimeError):
    """A source or helper could not be had; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Sdist:
    """A pinned source distribution on PyPI."""

    name: str
    version: str

    @property
    def folder(self) -> str:
        """The folder the archive unpacks to (``azure_servicebus-7.15.0``)."""
        return f"{self.name.replace('-', '_')}-{self.version}"

    def check_installed(self) -> None:
        """Raise :class:`SourcesError` unless the running environment has this version."""
        try:
            installed = importlib.metadata.version(self.name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise SourcesError(f"{self.name} is not installed: pip install "
                               f"'{self.name}=={self.version}'") from exc
        if installed != self.version:
            raise SourcesError(f"{self.name} {installed} is installed, but the fidelity suite "
                               f"runs the tests of {self.version}")


def cache_dir() -> Path:
    """``$SHAREDSTREAM_FIDELITY_CACHE``, else ``~/.cache/sharedstream/fidelity``."""
    configured = os.environ.get("SHAREDSTREAM_FIDELITY_CACHE")
    return Path(configured) if configured else Path.home() / ".cache/sharedstream/fidelity"


def _pip(arguments: Sequence[str], what: str) -> None:
    completed = subprocess.run(  # noqa: S603 - our own interpreter's pip, fixed arguments
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *arguments],
        capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SourcesError(f"pip could not {what}: {last}")


def fetch_sdist(sdist: Sdist, cache: Path) -> Path:
    """The unpacked source distribution (downloaded and unpacked on first use)."""
    unpacked = cache / "src" / sdist.folder
    if (unpacked / "PKG-INFO").is_file():
        return unpacked
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        _pip(["download", "--no-deps", "--no-binary", ":all:", "--dest", scratch,
              f"{sdist.name}=={sdist.version}"], f"download {sdist.name} {sdist.version}")
        [archive] = Path(scratch).glob("*.tar.gz")
        staging = Path(scratch) / "unpacked"
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        if unpacked.exists():
            shutil.rmtree(unpacked)
        unpacked.parent.mkdir(parents=True, exist_ok=True)
        (staging / sdist.folder).rename(unpacked)
    return unpacked


def install_helpers(requirements: Sequence[str], cache: Path) -> Path | None:
    """A folder with ``requirements`` installed (``--no-deps``), for ``PYTHONPATH``; or ``None``.

    One folder per set of pins, reused by later runs.
    """
    if not requirements:
        return None
    digest = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    target = cache / f"helpers-{digest}"
    if (target / ".complete").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    _pip(["install", "--quiet", "--no-deps", "--target", str(target), *requirements],
         f"install {', '.join(requirements)}")
    (target / ".complete").write_text("\n".join(requirements), encoding="utf-8")
    return target
