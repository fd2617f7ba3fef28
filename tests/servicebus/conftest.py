"""A Service Bus for the session: the kit's test server, or the namespace in the environment.

The server's tests drive it with the real ``azure-servicebus`` SDK only;
without that package (or python-qpid-proton, for the kit's server) they
skip. Each test uses its own entities of :data:`ENTITIES`, created when the
server starts; against a real namespace or the official emulator
(``SHAREDSTREAM_SERVICEBUS_CONNECTION_STRING``) they must exist there with
these settings, and start empty.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sharedstream.testing.fixtures import servicebus_connection_string

__all__ = ["ENTITIES", "LOCK_SECONDS", "servicebus_connection_string"]

LOCK_SECONDS = 1.0
"""The lock duration of the queues whose tests wait for a lock to expire."""


SDK_LEAKS = pytest.mark.filterwarnings("ignore::ResourceWarning")
"""azure-servicebus 7.15 leaves the socket of a connection that broke, or whose
close was given up (see ``producers.servicebus.CLOSE_TIMEOUT``), to be
finalized whenever its last reference goes: often while the test's event loop
is torn down, in the test's own teardown. Its ``ResourceWarning`` (an error
under ``filterwarnings = error``) is the SDK's leak, not ours, so the Service
Bus tests ignore it in every phase."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this folder with :data:`SDK_LEAKS`."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(SDK_LEAKS)


@pytest.fixture(autouse=True)
def _collect_the_sdk_s_lost_sockets() -> Iterator[None]:
    """After each test (its event loop closed): collect the sockets the SDK left behind.

    Left to the collector, they would be finalized during whichever test ran
    next, outside this folder's :data:`SDK_LEAKS` mark.
    """
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _queue(name: str, **settings: Any) -> dict[str, Any]:
    return {"name": name, **settings}


ENTITIES: Mapping[str, Any] = {
    "queues": [
        _queue("complete"), _queue("abandon"), _queue("dead-letter"), _queue("peek"),
        _queue("batch"), _queue("receive-and-delete"), _queue("credit"), _queue("sync"),
        _queue("bodies"),
        _queue("expiry", lock_duration=LOCK_SECONDS),
        _queue("renew", lock_duration=LOCK_SECONDS),
        _queue("renew-batch"),
        _queue("poison", max_delivery_count=3),
        _queue("sessions", requires_session=True),
        _queue("session-lock", requires_session=True, lock_duration=2),
        _queue("session-expiry", requires_session=True, lock_duration=LOCK_SECONDS),
    ],
    "topics": [{"name": "events", "subscriptions": [
        {"name": "all"},
        {"name": "urgent", "filters": [{"subject": "urgent"}]},
        {"name": "eu", "filters": [{"properties": {"region": "eu"}},
                                   {"correlation_id": "eu-order"}]},
    ]}],
}


@pytest.fixture(scope="session")
def servicebus_entities() -> Mapping[str, Any]:
    """The entities of these tests, for the kit's server (:data:`ENTITIES`)."""
    return ENTITIES
