"""Encryption at rest for packed trigger kwargs.

Trigger kwargs often carry secrets (broker passwords, tokens), so the
metadata store keeps them encrypted with Fernet (AES-128-CBC plus
HMAC-SHA256, from the ``cryptography`` package). A key is the urlsafe
base64 text of 32 random bytes; :func:`generate_key` makes one, and
``sharedstream init`` writes one into the configuration.

Key rotation: a :class:`KwargsCipher` accepts a comma-separated list of
keys. The first key encrypts; every key in the list is tried to decrypt. To
rotate, put the new key first and keep the old one after it
(``"NEW,OLD"``), re-encrypt the stored rows with :meth:`KwargsCipher.rotate`,
then drop the old key.
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from sharedstream.engine.errors import SharedStreamError

__all__ = ["DecryptionError", "InvalidKeyError", "KwargsCipher", "generate_key"]

_HOW_TO_GET_A_KEY = "run `sharedstream init` to generate one"
_KEY_MISMATCH = (
    "cannot decrypt stored trigger kwargs: the kwargs key does not match the one the "
    "database was written with (or the stored data was altered); configure the original "
    "key, or list it after the new one to rotate keys"
)


class InvalidKeyError(SharedStreamError, ValueError):
    """The kwargs encryption key is missing or is not a Fernet key.

    The message says which key of a comma-separated list is wrong, never the
    key itself, and how to generate a valid one.
    """


class DecryptionError(SharedStreamError):
    """Stored kwargs could not be decrypted.

    None of the configured keys is the one the data was encrypted with, or
    the data was altered after it was written. Retrying cannot help.
    """


def generate_key() -> str:
    """Return a fresh random Fernet key, as urlsafe base64 text (44 characters)."""
    return Fernet.generate_key().decode("ascii")


class KwargsCipher:
    """Encrypt and decrypt packed trigger kwargs with one or more Fernet keys.

    ``key`` is a Fernet key or a comma-separated list of them (whitespace
    around each and empty entries are ignored). The first key encrypts; all of them are tried
    when decrypting, which is how keys are rotated (see the module
    docstring). Raises :class:`InvalidKeyError` when ``key`` is empty or any
    entry is not a valid Fernet key. The keys never appear in the repr or in
    error messages.
    """

    def __init__(self, key: str) -> None:
        if not isinstance(key, str):
            raise InvalidKeyError(
                f"the kwargs encryption key must be a str, got {type(key).__qualname__}; "
                f"{_HOW_TO_GET_A_KEY}"
            )
        parts = [part.strip() for part in key.split(",") if part.strip()]
        if not parts:
            raise InvalidKeyError(f"no kwargs encryption key is configured; {_HOW_TO_GET_A_KEY}")
        fernets = []
        for position, part in enumerate(parts, start=1):
            try:
                # Fernet's decoder skips stray characters; insist on a clean key text.
                base64.b64decode(part, altchars=b"-_", validate=True)
                fernets.append(Fernet(part))
            except (ValueError, TypeError) as exc:
                which = (
                    "the kwargs encryption key"
                    if len(parts) == 1
                    else f"key {position} of {len(parts)} in the kwargs encryption key list"
                )
                raise InvalidKeyError(
                    f"{which} is not a valid Fernet key (32 bytes, urlsafe base64); "
                    f"{_HOW_TO_GET_A_KEY}"
                ) from exc
        self._fernet = MultiFernet(fernets)
        self._key_count = len(fernets)

    def encrypt(self, data: bytes) -> bytes:
        """Encrypt ``data`` with the first key; the token is urlsafe base64 bytes.

        Tokens are authenticated and include a timestamp and a random IV, so
        encrypting the same data twice gives different tokens.
        """
        return self._fernet.encrypt(data)

    def decrypt(self, token: bytes) -> bytes:
        """Return the data ``token`` was made from, trying every configured key.

        Raises :class:`DecryptionError` when no configured key matches or the
        token was altered.
        """
        try:
            return self._fernet.decrypt(token)
        except InvalidToken as exc:
            raise DecryptionError(_KEY_MISMATCH) from exc

    def rotate(self, token: bytes) -> bytes:
        """Re-encrypt ``token`` with the first key, whichever key it was written with.

        Raises :class:`DecryptionError` as :meth:`decrypt` does.
        """
        try:
            return self._fernet.rotate(token)
        except InvalidToken as exc:
            raise DecryptionError(_KEY_MISMATCH) from exc

    def __repr__(self) -> str:
        return f"<KwargsCipher with {self._key_count} key(s)>"
