"""What installing sharedstream asks of a user's machine (issue 31, item 7).

Read from ``pyproject.toml``: an extra a user installs to reach a broker
never compiles anything (``python-qpid-proton`` has no wheels: only the
testing kit's Service Bus server needs it, so only the ``testing`` extra
brings it); the license is an SPDX expression with its file present (the
form newer setuptools takes without a deprecation banner); the dev extra
keeps moto's boto3 within aiobotocore's botocore range, so pip does not
search through boto3's releases.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def names(extra: str) -> set[str]:
    """The distributions an extra names (its own extras followed, ``sharedstream[...]``)."""
    found: set[str] = set()
    for requirement in EXTRAS[extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name is not None, requirement
        if name.group(0) == "sharedstream":
            inner = re.search(r"\[([^\]]*)\]", requirement)
            assert inner is not None, requirement
            for each in inner.group(1).split(","):
                found |= names(each.strip())
        else:
            found.add(name.group(0).lower())
    return found


def test_no_broker_extra_builds_from_source() -> None:
    for extra in ("kafka", "sqs", "pubsub", "servicebus", "postgres", "ops", "dispatch", "all"):
        assert "python-qpid-proton" not in names(extra), extra
    assert "python-qpid-proton" in names("testing")
    assert "python-qpid-proton" in names("dev")  # the tests run the Service Bus test server


def test_the_license_is_an_spdx_expression_with_its_file() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_dev_bounds_boto3_by_aiobotocore() -> None:
    dev = " ".join(EXTRAS["dev"])
    assert re.search(r'\bboto3>=[\d.]+,<[\d.]+', dev), dev
    assert re.search(r'\baiobotocore>=[\d.]+,<[\d.]+', dev), dev
