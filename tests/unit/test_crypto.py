"""Encryption at rest of packed kwargs: round trips, wrong keys, bad keys, rotation."""

from __future__ import annotations

import base64

import pytest

from sharedstream.engine.errors import SharedStreamError
from sharedstream.runtime.crypto import DecryptionError, InvalidKeyError, KwargsCipher, generate_key
from sharedstream.runtime.serde import pack_kwargs, unpack_kwargs

SECRET = "hunter2-very-secret-password"  # noqa: S105 - a fake secret to look for


def test_a_well_formed_key_is_accepted() -> None:
    KwargsCipher("0" * 43 + "=")


def test_generate_key_gives_distinct_usable_text_keys() -> None:
    first, second = generate_key(), generate_key()
    assert isinstance(first, str)
    assert len(first) == 44
    assert first != second
    assert len(base64.urlsafe_b64decode(first)) == 32
    KwargsCipher(first)


def test_roundtrip_of_packed_kwargs() -> None:
    cipher = KwargsCipher(generate_key())
    kwargs = {"topic": "orders", "password": SECRET, "options": (1, 2)}
    token = cipher.encrypt(pack_kwargs(kwargs))
    assert unpack_kwargs(cipher.decrypt(token)) == kwargs
    assert cipher.decrypt(cipher.encrypt(b"")) == b""


def test_ciphertext_does_not_contain_the_secret() -> None:
    cipher = KwargsCipher(generate_key())
    plain = pack_kwargs({"password": SECRET})
    token = cipher.encrypt(plain)
    assert SECRET.encode() not in token
    assert SECRET.encode() not in base64.urlsafe_b64decode(token)
    assert plain not in base64.urlsafe_b64decode(token)
    # A random IV per token: the same data never encrypts to the same bytes twice.
    assert cipher.encrypt(plain) != token


def test_wrong_key_raises_decryption_error() -> None:
    token = KwargsCipher(generate_key()).encrypt(b"data")
    with pytest.raises(DecryptionError, match="does not match the one the database was written"):
        KwargsCipher(generate_key()).decrypt(token)


@pytest.mark.parametrize("position", [0, 10, -5])
def test_tampered_token_raises_decryption_error(position: int) -> None:
    cipher = KwargsCipher(generate_key())
    raw = bytearray(base64.urlsafe_b64decode(cipher.encrypt(b"some packed kwargs")))
    raw[position] ^= 0x01
    with pytest.raises(DecryptionError):
        cipher.decrypt(base64.urlsafe_b64encode(bytes(raw)))


def test_garbage_token_raises_decryption_error() -> None:
    with pytest.raises(DecryptionError):
        KwargsCipher(generate_key()).decrypt(b"not a token at all")


@pytest.mark.parametrize(
    "key", ["not-a-key", "", "  ", ",", "c2hvcnQ=", "0" * 40, "0" * 43 + "=!", "0" * 21 + " " * 22]
)
def test_invalid_key_says_how_to_generate_one(key: str) -> None:
    with pytest.raises(InvalidKeyError, match="run `sharedstream init`") as excinfo:
        KwargsCipher(key)
    if key.strip(" ,"):
        assert key not in str(excinfo.value)


def test_invalid_key_in_a_list_is_named_by_position_not_value() -> None:
    good = generate_key()
    with pytest.raises(InvalidKeyError, match="key 2 of 3") as excinfo:
        KwargsCipher(f"{good},oops-secret,{generate_key()}")
    assert "oops-secret" not in str(excinfo.value)
    assert good not in str(excinfo.value)


def test_non_str_key_is_invalid() -> None:
    with pytest.raises(InvalidKeyError, match="must be a str"):
        KwargsCipher(generate_key().encode())  # type: ignore[arg-type]


def test_errors_are_part_of_the_hierarchy_and_not_retryable() -> None:
    for error in (InvalidKeyError, DecryptionError):
        assert issubclass(error, SharedStreamError)
        assert error.retryable is False


def test_key_rotation() -> None:
    old, new = generate_key(), generate_key()
    old_token = KwargsCipher(old).encrypt(b"written with the old key")

    rotating = KwargsCipher(f" {new} , {old} ")
    assert rotating.decrypt(old_token) == b"written with the old key"
    new_token = rotating.encrypt(b"written during rotation")
    # The first key encrypts: the new key alone reads it, the old key alone does not.
    assert KwargsCipher(new).decrypt(new_token) == b"written during rotation"
    with pytest.raises(DecryptionError):
        KwargsCipher(old).decrypt(new_token)

    rotated = rotating.rotate(old_token)
    assert KwargsCipher(new).decrypt(rotated) == b"written with the old key"
    with pytest.raises(DecryptionError):
        KwargsCipher(generate_key()).rotate(old_token)


def test_repr_does_not_reveal_keys() -> None:
    first, second = generate_key(), generate_key()
    text = repr(KwargsCipher(f"{first},{second}"))
    assert first not in text
    assert second not in text
    assert "2 key" in text
