"""``servicebus_preparer`` for the SDK's tests: resource decorators that name test-server entities.

Microsoft's preparers create a resource group, a namespace, queues, topics,
subscriptions and access policies in Azure before each test and pass them
to it as keyword arguments. These take the same constructor arguments and
pass the same keyword arguments, but the resources are entities of the
kit's Service Bus test server, which creates its entities when it starts
(it has no management API). So each decorator *plans* its entity when it is
applied, at import, into :data:`PLAN`; the session fixture of
:mod:`.devtools` starts the server with the whole plan once every test
module is imported (collection), before the first test runs.

Invariants:

1. Every decorator application plans entities of its own (``q7``, ``t3``,
   ``t3/s9``, ``rule4``), also the ``Cached*`` ones: a test never sees
   another test's messages. (Azure's cached resources are shared to save
   minutes of provisioning, which the test server does not need.)
2. A subscription's topic is the one whose decorator wraps it; a queue
   policy's queue is the ``servicebus_queue`` keyword argument when the test
   runs.
3. The namespace is ``localhost`` with an empty endpoint suffix, so the
   tests' ``f"{namespace.name}{SERVICEBUS_ENDPOINT_SUFFIX}"`` is the
   server's host name; the server listens on Azure's port, 5671, with TLS.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

__all__ = [
    "HOST",
    "PLAN",
    "SERVICEBUS_ENDPOINT_SUFFIX",
    "CachedServiceBusNamespacePreparer",
    "CachedServiceBusQueuePreparer",
    "CachedServiceBusResourceGroupPreparer",
    "CachedServiceBusSubscriptionPreparer",
    "CachedServiceBusTopicPreparer",
    "EntityPlan",
    "FakeResource",
    "ServiceBusNamespaceAuthorizationRulePreparer",
    "ServiceBusNamespacePreparer",
    "ServiceBusQueueAuthorizationRulePreparer",
    "ServiceBusQueuePreparer",
    "ServiceBusResourceGroupPreparer",
    "ServiceBusSubscriptionPreparer",
    "ServiceBusTopicPreparer",
    "connection_string",
]

HOST = "localhost"
"""The namespace's host name: the server's certificate names it."""
SERVICEBUS_ENDPOINT_SUFFIX = os.environ.get("SERVICEBUS_ENDPOINT_SUFFIX", "")
DEFAULT_KEY = ("k", "v")
"""The namespace's ``RootManageSharedAccessKey``: every right."""


class FakeResource(NamedTuple):
    """What a preparer passes for a resource: the tests read ``.name``."""

    name: str
    id: str


@dataclasses.dataclass
class EntityPlan:
    """The entities and keys the test server must have when it starts."""

    queues: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    topics: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    keys: dict[str, tuple[str, list[str]]] = dataclasses.field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        """The server's entities document (:mod:`sharedstream.testing.servicebus.config`)."""
        keys: list[dict[str, Any]] = [{"name": DEFAULT_KEY[0], "key": DEFAULT_KEY[1]}]
        keys += [{"name": name, "key": secret, "rights": rights}
                 for name, (secret, rights) in self.keys.items()]
        return {
            "keys": keys,
            "queues": [{"name": name, **settings} for name, settings in self.queues.items()],
            "topics": [{"name": topic, "subscriptions": [
                {"name": name, **settings} for name, settings in subscriptions.items()]}
                for topic, subscriptions in self.topics.items()],
        }


PLAN = EntityPlan()
"""Everything the decorators applied so far need (invariant 1)."""
_serials = itertools.count(1)


def connection_string(key: tuple[str, str] = DEFAULT_KEY, entity: str | None = None) -> str:
    """A TLS connection string to the server signed with ``key`` (scoped to ``entity``)."""
    scoped = f"EntityPath={entity};" if entity else ""
    return (f"Endpoint=sb://{HOST}/;SharedAccessKeyName={key[0]};"
            f"SharedAccessKey={key[1]};{scoped}")


_DURATION = re.compile(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?")


def _seconds(duration: str) -> float:
    """An ISO 8601 time duration (``"PT5S"``, ``"PT1M"``), as the preparers take it, in seconds."""
    match = _DURATION.fullmatch(duration)
    if match is None or duration == "PT":
        raise ValueError(f"not an ISO 8601 time duration: {duration!r}")
    hours, minutes, seconds = (float(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


class _Preparer:
    """Wraps a test so that it gets :meth:`resource`'s keyword arguments.

    The wrapper keeps the test's name, marks and signature
    (``functools.wraps``: pytest reads the parametrize marks and the
    arguments through it) and is a coroutine function when the test is one.
    """

    def __init__(self, name_prefix: str = "", **_azure_only: object) -> None:
        self.serial = next(_serials)

    def resource(self, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments for the test, given those the outer preparers passed."""
        raise NotImplementedError

    def wrapped(self, inner: Callable[..., Any]) -> None:
        """Called once with the (already wrapped) test this preparer wraps."""

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.wrapped(fn)
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await fn(*args, **kwargs, **self.resource(**kwargs))
        else:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return fn(*args, **kwargs, **self.resource(**kwargs))
        wrapper = functools.wraps(fn)(wrapper)
        preparers: list[_Preparer] = [*getattr(fn, "_fidelity_preparers", []), self]
        wrapper._fidelity_preparers = preparers  # type: ignore[attr-defined]
        return wrapper


class ServiceBusResourceGroupPreparer(_Preparer):
    """A resource group: nothing on the server."""

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        return {"resource_group": FakeResource("fidelity", "fidelity"), "location": "local"}


class ServiceBusNamespacePreparer(_Preparer):
    """The namespace: the server itself, through its root key."""

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        return {
            "servicebus_namespace": FakeResource(HOST, HOST),
            "servicebus_namespace_connection_string": connection_string(),
            "servicebus_namespace_key_name": DEFAULT_KEY[0],
            "servicebus_namespace_primary_key": DEFAULT_KEY[1],
        }


def _entity_settings(*, lock_duration: str | None = None, requires_session: bool = False,
                     dead_lettering_on_message_expiration: bool = False,
                     requires_duplicate_detection: bool = False) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "requires_session": requires_session,
        "dead_lettering_on_message_expiration": dead_lettering_on_message_expiration,
    }
    if lock_duration is not None:
        settings["lock_duration"] = _seconds(lock_duration)
    if requires_duplicate_detection:
        settings["duplicate_detection_window"] = 600.0  # Azure's default: ten minutes
    return settings


class ServiceBusQueuePreparer(_Preparer):
    """A queue of its own (invariant 1); partitioning is not modelled and is ignored."""

    def __init__(self, name_prefix: str = "", *, parameter_name: str = "servicebus_queue",
                 lock_duration: str = "PT30S", requires_session: bool = False,
                 dead_lettering_on_message_expiration: bool = False,
                 requires_duplicate_detection: bool = False, enable_partitioning: bool = False,
                 **azure_only: object) -> None:
        super().__init__(name_prefix, **azure_only)
        self.parameter_name = parameter_name
        self.name = f"q{self.serial}"
        PLAN.queues[self.name] = _entity_settings(
            lock_duration=lock_duration, requires_session=requires_session,
            dead_lettering_on_message_expiration=dead_lettering_on_message_expiration,
            requires_duplicate_detection=requires_duplicate_detection)

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        return {self.parameter_name: FakeResource(self.name, self.name)}


class ServiceBusTopicPreparer(_Preparer):
    """A topic of its own, the topic of the subscription preparers it wraps (invariant 2)."""

    def __init__(self, name_prefix: str = "", *, parameter_name: str = "servicebus_topic",
                 **azure_only: object) -> None:
        super().__init__(name_prefix, **azure_only)
        self.parameter_name = parameter_name
        self.name = f"t{self.serial}"
        PLAN.topics[self.name] = {}

    def wrapped(self, inner: Callable[..., Any]) -> None:  # noqa: D102 - see _Preparer
        preparers: Iterable[_Preparer] = getattr(inner, "_fidelity_preparers", [])
        for preparer in preparers:
            if isinstance(preparer, ServiceBusSubscriptionPreparer):
                PLAN.topics[self.name][preparer.name] = preparer.settings

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        return {self.parameter_name: FakeResource(self.name, self.name)}


class ServiceBusSubscriptionPreparer(_Preparer):
    """A subscription of its own on the topic whose preparer wraps it (``$Default`` rule)."""

    def __init__(self, name_prefix: str = "", *,
                 parameter_name: str = "servicebus_subscription", requires_session: bool = False,
                 lock_duration: str = "PT60S", dead_lettering_on_message_expiration: bool = False,
                 **azure_only: object) -> None:
        super().__init__(name_prefix, **azure_only)
        self.parameter_name = parameter_name
        self.name = f"s{self.serial}"
        self.settings = _entity_settings(
            lock_duration=lock_duration, requires_session=requires_session,
            dead_lettering_on_message_expiration=dead_lettering_on_message_expiration)

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        return {self.parameter_name: FakeResource(self.name, self.name)}


def _rights(access_rights: Iterable[object] | None) -> list[str]:
    return [str(right) for right in access_rights or ("Manage", "Send", "Listen")]


class ServiceBusNamespaceAuthorizationRulePreparer(_Preparer):
    """A namespace key of its own with the given rights."""

    def __init__(self, name_prefix: str = "", *, access_rights: Iterable[object] | None = None,
                 parameter_name: str = "servicebus_authorization_rule",
                 **azure_only: object) -> None:
        super().__init__(name_prefix, **azure_only)
        self.parameter_name = parameter_name
        self.key = (f"rule{self.serial}", f"secret{self.serial}")
        PLAN.keys[self.key[0]] = (self.key[1], _rights(access_rights))

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        return {self.parameter_name: FakeResource(self.key[0], self.key[0]),
                f"{self.parameter_name}_connection_string": connection_string(self.key)}


class ServiceBusQueueAuthorizationRulePreparer(_Preparer):
    """A key with the given rights whose connection string names the test's queue.

    The server's keys are the namespace's; Service Bus's queue-level policy
    is scoped by the connection string's ``EntityPath``, which the SDK
    checks before it connects.
    """

    def __init__(self, name_prefix: str = "", *, access_rights: Iterable[object] | None = None,
                 parameter_name: str = "servicebus_queue_authorization_rule",
                 servicebus_queue_parameter_name: str = "servicebus_queue",
                 **azure_only: object) -> None:
        super().__init__(name_prefix, **azure_only)
        self.parameter_name = parameter_name
        self.queue_parameter = servicebus_queue_parameter_name
        self.key = (f"qrule{self.serial}", f"secret{self.serial}")
        PLAN.keys[self.key[0]] = (self.key[1], _rights(access_rights))

    def resource(self, **kwargs: Any) -> dict[str, Any]:  # noqa: D102 - see _Preparer
        queue = kwargs[self.queue_parameter].name
        return {self.parameter_name: FakeResource(self.key[0], self.key[0]),
                f"{self.parameter_name}_connection_string": connection_string(self.key, queue)}


CachedServiceBusResourceGroupPreparer = ServiceBusResourceGroupPreparer
CachedServiceBusNamespacePreparer = ServiceBusNamespacePreparer
CachedServiceBusQueuePreparer = ServiceBusQueuePreparer
CachedServiceBusTopicPreparer = ServiceBusTopicPreparer
CachedServiceBusSubscriptionPreparer = ServiceBusSubscriptionPreparer
