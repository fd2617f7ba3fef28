"""``devtools_testutils`` for the SDK's tests, and the pytest plugin that starts the test server.

What the tests import: the test base classes (plain classes here: no
recording, every test talks to the server), no-op recording sanitizers and
matchers, ``get_credential`` (the namespace's root key as an
``AzureNamedKeyCredential``: the server accepts shared access signatures,
not Microsoft Entra ID tokens), and ``RandomNameResourceGroupPreparer``.

As a plugin (``-p``) it provides the ``test_proxy`` session fixture that the
SDK's ``conftest.py`` asks for (Microsoft's starts its recording proxy):
here it starts the kit's Service Bus test server on ``127.0.0.1:5671`` with
TLS, and AMQP over WebSockets (``wss``) on ``127.0.0.1:443``, with the
entities the preparers planned (:mod:`.servicebus_resources`), and stops it
after the session. The SDK
trusts ``certifi``'s bundle unless told otherwise, so the plugin points
``certifi.where`` at the server's certificate authority, as a machine that
trusts a private CA would. The run's working directory comes from
``SHAREDSTREAM_FIDELITY_WORKDIR``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.fidelity.standins.servicebus_resources import (
    DEFAULT_KEY,
    PLAN,
    ServiceBusResourceGroupPreparer,
)

__all__ = [
    "AzureMgmtRecordedTestCase",
    "AzureRecordedTestCase",
    "RandomNameResourceGroupPreparer",
    "add_general_regex_sanitizer",
    "add_oauth_response_sanitizer",
    "add_remove_header_sanitizer",
    "get_credential",
    "set_custom_default_matcher",
    "test_proxy",
]

SERVER_PORT = 5671
"""Azure's AMQP-over-TLS port: the tests give the SDK a host name only."""
WEBSOCKET_PORT = 443
"""Azure's port for AMQP over WebSockets (``TransportType.AmqpOverWebsocket``)."""


class AzureRecordedTestCase:
    """Base of the SDK's test classes: nothing to record or play back."""

    @staticmethod
    def await_prepared_test(test: Callable[..., Any]) -> Callable[..., Any]:
        """Microsoft's runs an async test's preparers; ours are coroutine functions already."""
        return test


class AzureMgmtRecordedTestCase(AzureRecordedTestCase):
    """Base of the SDK's test classes that use resource preparers."""


RandomNameResourceGroupPreparer = ServiceBusResourceGroupPreparer


def get_credential(*, is_async: bool = False, **_azure_only: object) -> Any:
    """The namespace's root key as a credential, for the sync or the ``aio`` client alike."""
    from azure.core.credentials import AzureNamedKeyCredential  # noqa: PLC0415 - the SDK's

    return AzureNamedKeyCredential(*DEFAULT_KEY)


def add_remove_header_sanitizer(**_recording_only: object) -> None:
    """Recording only: nothing to do."""


def add_general_regex_sanitizer(**_recording_only: object) -> None:
    """Recording only: nothing to do."""


def add_oauth_response_sanitizer(**_recording_only: object) -> None:
    """Recording only: nothing to do."""


def set_custom_default_matcher(**_recording_only: object) -> None:
    """Recording only: nothing to do."""


def _workdir() -> Path:
    return Path(os.environ.get("SHAREDSTREAM_FIDELITY_WORKDIR", ".")).resolve()


def pytest_configure(config: pytest.Config) -> None:
    """Make the server's certificate authority now and have the SDK trust it."""
    import certifi  # noqa: PLC0415 - the SDK's dependency, only in the SDK's test run

    from sharedstream.testing.tls import kit_tls_dir, make_certificates  # noqa: PLC0415

    ca_file = str(make_certificates(kit_tls_dir(_workdir())).ca_file)
    certifi.where = lambda: ca_file


@pytest.fixture(scope="session")
def test_proxy() -> Iterator[None]:
    """The test server with every planned entity, for the whole session."""
    from sharedstream.testing.brokers.servicebus import (  # noqa: PLC0415
        start_servicebus,
        stop_servicebus,
    )

    process, _ = start_servicebus(_workdir(), entities=PLAN.document(), port=SERVER_PORT,
                                  tls=True, websocket_port=WEBSOCKET_PORT)
    try:
        yield
    finally:
        stop_servicebus(process)
