"""Whether a Docker engine can be used: the condition for the testcontainers backends."""

from __future__ import annotations

import importlib
import shutil
import subprocess
from typing import Any


def docker_unavailable() -> str | None:
    """Why no Docker engine can be used here, or ``None`` when one answers a ping."""
    try:
        docker: Any = importlib.import_module("docker")  # the client testcontainers uses
    except ImportError:
        docker = None
    if docker is not None:
        try:
            docker.from_env(timeout=10).ping()
        except Exception as exc:  # noqa: BLE001 - whatever fails, there is no engine to use
            return f"no Docker engine answers ({type(exc).__name__}: {exc})"
        return None
    if shutil.which("docker") is None:
        return "no Docker client (neither the docker package nor the docker CLI)"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine answers (docker info: {exc})"
    return None if info.returncode == 0 else "no Docker engine answers (docker info failed)"
