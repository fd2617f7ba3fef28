"""Shared access signatures: a namespace's keys, the tokens clients put on ``$cbs`` (no I/O).

Terms:

* a *key* (:class:`AccessKey`) is a shared access policy of the namespace:
  a name, a secret and rights (``Listen``, ``Send``, ``Manage``; ``Manage``
  includes the other two, as in Service Bus);
* a *token* is what the SDK makes of a key: ``SharedAccessSignature
  sr=<resource URI>&sig=<signature>&se=<expiry>&skn=<key name>``, the
  signature being the base64 HMAC-SHA256, under the key's secret, of the
  url-encoded resource URI, a newline and the expiry (epoch seconds);
* the *audience* is the ``name`` of a ``put-token`` request: the resource
  the client asks access to (``sb://host/queue``);
* a *grant* (:class:`Grant`) is what a verified token allows on the one
  connection it was put on: the audience's entity path, the key's rights,
  until the token's expiry.

Invariants (each checked by a test of ``tests/servicebus/test_auth.py``):

1. :func:`verify` returns a grant only for a token signed with the secret
   of the namespace key its ``skn`` names, not expired, whose resource
   covers the audience; anything else raises :class:`TokenRefused` with
   status 401, as Service Bus answers such a ``put-token``.
2. A resource covers a path when its path is a prefix of it at a segment
   boundary, ignoring case (a namespace-wide token, path ``""``, covers
   every entity). Hosts are not compared: a client may reach the server
   by any name, or through a proxy on another port.
3. :func:`authorize` lets a link open only with a live grant covering its
   entity that has the right the link needs (``Listen`` to receive,
   ``Send`` to send); else it raises :class:`~.model.Refused` with
   ``amqp:unauthorized-access``, which the SDK reports as
   ``ServiceBusAuthorizationError``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, quote_plus, urlsplit

from sharedstream.testing.servicebus.model import UNAUTHORIZED, AccessKey, Refused, Right

__all__ = ["Grant", "TokenRefused", "authorize", "covers", "sign", "verify"]

SAS_PREFIX: Final = "SharedAccessSignature "


@dataclass(frozen=True, slots=True)
class Grant:
    """What one accepted token allows on its connection."""

    path: str
    """The audience's entity path (``""``: the whole namespace)."""
    key: AccessKey
    expires: float
    """Epoch seconds."""


class TokenRefused(Exception):
    """A ``put-token`` refused: ``status`` (an HTTP code) and ``description`` go in the answer."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status, self.description = status, description


def _path(uri: str) -> str:
    return (urlsplit(uri).path if "://" in uri else uri).strip("/")


def covers(resource_path: str, path: str) -> bool:
    """Whether ``resource_path`` covers ``path`` (invariant 2); both without slashes at the ends."""
    resource, wanted = resource_path.lower(), path.lower()
    return not resource or wanted == resource or wanted.startswith(resource + "/")


def sign(resource: str, key: AccessKey, expiry: int) -> str:
    """A token for ``resource`` under ``key`` until ``expiry``, made as the SDK makes one."""
    encoded = quote_plus(resource)
    signature = _signature(key.secret, encoded, expiry)
    return (f"{SAS_PREFIX}sr={encoded}&sig={quote_plus(signature)}&se={expiry}"
            f"&skn={quote_plus(key.name)}")


def _signature(secret: str, encoded_resource: str, expiry: int) -> str:
    digest = hmac.new(secret.encode(), f"{encoded_resource}\n{expiry}".encode(), hashlib.sha256)
    return base64.b64encode(digest.digest()).decode()


def verify(token: str, token_type: str, audience: str, keys: Iterable[AccessKey],
           now: float) -> Grant:
    """The grant of ``token`` put for ``audience`` (invariant 1); :class:`TokenRefused` if none.

    A token is a signature by its shape, whatever ``token_type`` says (the
    SDK puts its signatures as ``jwt``); any other token (a Microsoft Entra
    ID JWT) is refused: the server cannot verify one.
    """
    if not token.startswith(SAS_PREFIX):
        raise TokenRefused(401, f"the test server verifies shared access signatures only, not "
                                f"{token_type!r} tokens (it has no identity provider)")
    fields: Mapping[str, list[str]] = parse_qs(token.removeprefix(SAS_PREFIX),
                                               keep_blank_values=True)
    resource, signature, expiry, name = (fields.get(part, [""])[0]
                                         for part in ("sr", "sig", "se", "skn"))
    if not resource or not signature or not expiry.isdigit():
        raise TokenRefused(401, "MalformedToken: sr, sig and se are required")
    key = next((k for k in keys if k.name == name), None)
    if key is None:
        raise TokenRefused(401, f"InvalidSignature: no shared access policy named {name!r}")
    expected = _signature(key.secret, quote_plus(resource), int(expiry))
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise TokenRefused(401, "InvalidSignature: the token has an invalid signature")
    if int(expiry) <= now:
        raise TokenRefused(401, f"ExpiredToken: the token expired at {expiry} "
                                f"(epoch seconds)")
    if not covers(_path(resource), _path(audience)):
        raise TokenRefused(401, f"InvalidAudience: the token is for {resource!r}, "
                                f"not {audience!r}")
    return Grant(_path(audience), key, float(expiry))


def authorize(grants: Iterable[Grant], path: str, right: Right, now: float, *,
              or_else: Right | None = None) -> None:
    """Let a link on ``path`` needing ``right`` (or ``or_else``) open (invariant 3).

    Raises :class:`~.model.Refused` with ``amqp:unauthorized-access`` when no
    live grant covering ``path`` has it.
    """
    grants = list(grants)
    live = [grant for grant in grants if grant.expires > now and covers(grant.path, path)]
    if not any(grant.key.allows(right) or (or_else is not None and grant.key.allows(or_else))
               for grant in live):
        found = "an expired token" if not live and any(covers(g.path, path) for g in grants) \
            else "no token with it" if not live else "tokens without it"
        raise Refused(UNAUTHORIZED, f"Unauthorized access. '{right.value}' claim(s) are "
                                    f"required to perform this operation on {path!r}; "
                                    f"the connection has {found}.")
