"""``azure.mgmt.servicebus.models`` for the SDK's tests: the access rights of a policy."""

from __future__ import annotations

import enum

__all__ = ["AccessRights"]


class AccessRights(enum.StrEnum):
    """A shared access policy's rights, spelt as Service Bus and the test server spell them."""

    manage = "Manage"
    send = "Send"
    listen = "Listen"
