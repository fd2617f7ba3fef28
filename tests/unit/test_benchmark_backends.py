"""Which backends an end-to-end benchmark runs (``benchmarks/_e2e.py``'s ``chosen_backends``).

The Kafka, Pub/Sub and Service Bus benchmarks share it: a local broker
always, a container backend when a Docker engine answers, and a clear
reason (exit status 2) when the container backend was asked for by name
and cannot run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_e2e() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_e2e_under_test", BENCHMARKS / "_e2e.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


e2e = _load_e2e()


def _docker_answers() -> str | None:
    return None


def _no_docker() -> str | None:
    return "no Docker engine answers (test)"


def _choose(choice: str, unavailable: object) -> list[str] | str:
    chosen: list[str] | str = e2e.chosen_backends(
        choice, local="server", container="emulator", label="Pub/Sub emulator",
        unavailable=unavailable)
    return chosen


def test_auto_runs_the_local_backend_then_the_container_when_docker_answers() -> None:
    assert _choose("auto", _docker_answers) == ["server", "emulator"]


def test_auto_without_docker_runs_the_local_backend_and_says_why_it_skipped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _choose("auto", _no_docker) == ["server"]
    assert capsys.readouterr().err == (
        "skipping the Pub/Sub emulator backend: no Docker engine answers (test)\n")


def test_the_local_backend_alone_never_asks_for_docker() -> None:
    def asked() -> str | None:
        raise AssertionError("containers were looked for")

    assert _choose("server", asked) == ["server"]


def test_the_container_backend_by_name_runs_alone_or_says_why_it_cannot() -> None:
    assert _choose("emulator", _docker_answers) == ["emulator"]
    assert _choose("emulator", _no_docker) == (
        "cannot run the Pub/Sub emulator backend: no Docker engine answers (test)")


def test_an_unknown_choice_is_refused_by_name() -> None:
    assert _choose("docker", _docker_answers) == (
        "unknown backend 'docker' (auto, server or emulator)")
