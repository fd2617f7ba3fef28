"""The Service Bus test server's token checks alone (:mod:`sharedstream.testing.servicebus.auth`).

Pure: no AMQP, no SDK. Each test names the invariant it checks; the SDK's
own token maker (``generate_sas_token``) signs where one is at hand, so a
signature the server accepts is one the SDK makes.
"""

from __future__ import annotations

from typing import Any

import pytest

from sharedstream.testing.servicebus import auth, config
from sharedstream.testing.servicebus.model import (
    UNAUTHORIZED,
    AccessKey,
    Namespace,
    Refused,
    Right,
)

NOW = 1_800_000_000.0
ADMIN = AccessKey("admin", "s3cret")
LISTENER = AccessKey("listener", "l1sten", frozenset({Right.LISTEN}))
KEYS = (ADMIN, LISTENER)
QUEUE = "sb://ns.example/orders"


def sdk_token(resource: str, key: AccessKey, expiry: int) -> str:
    """A token made by the SDK's own code."""
    utils: Any = pytest.importorskip("azure.servicebus._pyamqp.utils")
    return str(utils.generate_sas_token(resource, key.name, key.secret, expiry))


def test_1_a_token_the_sdk_signs_with_a_namespace_key_is_granted() -> None:
    grant = auth.verify(sdk_token(QUEUE, ADMIN, int(NOW) + 60), "jwt", QUEUE, KEYS, NOW)
    assert (grant.path, grant.key, grant.expires) == ("orders", ADMIN, NOW + 60)
    assert auth.sign(QUEUE, ADMIN, int(NOW) + 60) == sdk_token(QUEUE, ADMIN, int(NOW) + 60)


@pytest.mark.parametrize(("token", "reason"), [
    (auth.sign(QUEUE, AccessKey("admin", "wrong"), int(NOW) + 60), "InvalidSignature"),
    (auth.sign(QUEUE, AccessKey("nobody", "s3cret"), int(NOW) + 60), "no shared access policy"),
    (auth.sign(QUEUE, ADMIN, int(NOW) - 1), "ExpiredToken"),
    (auth.sign("sb://ns.example/other", ADMIN, int(NOW) + 60), "InvalidAudience"),
    (auth.sign("sb://ns.example/ord", ADMIN, int(NOW) + 60), "InvalidAudience"),
    (auth.sign(QUEUE, ADMIN, int(NOW) + 60).replace("se=", "se=1"), "InvalidSignature"),
    ("SharedAccessSignature sr=x", "MalformedToken"),
    ("eyJhbGciOiJSUzI1NiJ9.e30.sig", "shared access signatures only"),
], ids=["wrong-secret", "unknown-key", "expired", "other-entity", "name-prefix", "tampered",
        "malformed", "jwt"])
def test_1_a_token_not_signed_by_a_key_live_and_for_the_audience_is_refused_401(
        token: str, reason: str) -> None:
    with pytest.raises(auth.TokenRefused, match=reason) as refused:
        auth.verify(token, "jwt", QUEUE, KEYS, NOW)
    assert refused.value.status == 401


def test_2_a_namespace_token_covers_every_entity_and_hosts_are_not_compared() -> None:
    token = auth.sign("sb://ns.example/", ADMIN, int(NOW) + 60)
    grant = auth.verify(token, "jwt", "sb://127.0.0.1:5672/Events/Subscriptions/All", KEYS, NOW)
    assert grant.path == "Events/Subscriptions/All"
    assert auth.covers("", "anything/at/all")
    assert auth.covers("events", "EVENTS/Subscriptions/all")
    assert not auth.covers("events", "eventsource")


def test_3_a_link_needs_a_live_grant_with_its_right() -> None:
    listen = auth.Grant("orders", LISTENER, NOW + 60)
    auth.authorize([listen], "orders", Right.LISTEN, NOW)
    auth.authorize([auth.Grant("", ADMIN, NOW + 60)], "orders", Right.SEND, NOW)  # Manage
    cases = [([listen], Right.SEND, "tokens without it"),
             ([listen], Right.LISTEN, "an expired token"),
             ([auth.Grant("other", ADMIN, NOW + 60)], Right.LISTEN, "no token with it")]
    for grants, right, why in cases:
        at = NOW + 61 if why == "an expired token" else NOW
        with pytest.raises(Refused, match=f"'{right.value}'.*{why}") as refused:
            auth.authorize(grants, "orders", right, at)
        assert refused.value.condition == UNAUTHORIZED
    auth.authorize([listen], "orders", Right.LISTEN, NOW, or_else=Right.SEND)
    auth.authorize([auth.Grant("orders", AccessKey("s", "s", frozenset({Right.SEND})),
                               NOW + 60)], "orders", Right.LISTEN, NOW, or_else=Right.SEND)


def test_the_entities_document_names_keys_the_message_size_and_the_next_session_wait() -> None:
    assert config.namespace({}) == Namespace()
    assert Namespace().next_session_wait == 65  # Service Bus's "allotted timeout of 00:01:05"
    assert config.namespace({"next_session_wait": 2.5}).next_session_wait == 2.5
    with pytest.raises(ValueError, match="next_session_wait must be positive"):
        config.namespace({"next_session_wait": 0})
    document = {"keys": [{"name": "admin", "key": "s3cret"},
                         {"name": "listener", "key": "l1sten", "rights": ["Listen"]}],
                "max_message_size": 100 * 1024 * 1024}
    assert config.namespace(document) == Namespace(KEYS, 100 * 1024 * 1024)
    with pytest.raises(ValueError, match="rights are Listen, Send or Manage"):
        config.namespace({"keys": [{"name": "a", "key": "b", "rights": ["Read"]}]})
    with pytest.raises(ValueError, match="needs a name and a key"):
        config.namespace({"keys": [{"name": "a"}]})
