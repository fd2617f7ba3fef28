"""Whether a Docker engine can be used: the testing kit's check, under the benchmarks' old name."""

from __future__ import annotations

from sharedstream.testing.brokers.containers import docker_unavailable

__all__ = ["docker_unavailable"]
