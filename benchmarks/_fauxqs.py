"""fauxqs for the benchmarks: the testing kit's (:mod:`sharedstream.testing.brokers.fauxqs`).

The only differences are where it is installed - ``benchmarks/results/.fauxqs/``
(gitignored) rather than the user cache - and the keys the benchmarks sign
with. Installing, starting on a free loopback port, the readiness check and
stopping are the kit's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from sharedstream.testing.brokers import fauxqs as kit
from sharedstream.testing.brokers.process import LocalBrokerError as FauxqsError

__all__ = ["CACHE", "FauxqsError", "ensure_fauxqs", "start_fauxqs", "stop_fauxqs"]

CACHE = Path(__file__).resolve().parent / "results" / ".fauxqs"
REGION = kit.FAUXQS_REGION
# fauxqs accepts any keys; these only satisfy botocore's signer.
CREDENTIALS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
stop_fauxqs = kit.stop_fauxqs


def ensure_fauxqs(cache: Path = CACHE) -> Path:
    """Install Node 22 and fauxqs into ``cache`` unless already there (see the kit)."""
    return kit.ensure_fauxqs(cache)


def start_fauxqs(cache: Path = CACHE, *, log_path: Path | None = None,
                 timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start fauxqs from ``cache`` on a free port; the process and its endpoint URL."""
    return kit.start_fauxqs(cache, log_path=log_path, timeout=timeout)
