"""The lazy SDK import and the error hierarchy every broker's errors derive from."""

from __future__ import annotations

import pytest

from sharedstream.brokerkit.errors import (
    BrokerConfigError,
    BrokerConnectError,
    BrokerDeadLetterError,
    BrokerError,
    BrokerRequestError,
)
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.engine.errors import SharedStreamError


class AcmeConfigError(BrokerConfigError):
    pass


def test_a_missing_sdk_is_a_config_error_naming_the_extra() -> None:
    sdk = OptionalSdk(broker="Acme", package="acme_sdk_not_installed", extra="acme",
                      error=AcmeConfigError)
    with pytest.raises(AcmeConfigError, match=r"pip install 'sharedstream\[acme\]'") as caught:
        sdk()
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value.__cause__, ImportError)


def test_an_installed_module_is_returned() -> None:
    sdk = OptionalSdk(broker="Json", package="json", extra="json")
    assert sdk().dumps([1]) == "[1]"
    assert sdk("json.decoder").__name__ == "json.decoder"


def test_one_hierarchy_saying_whether_retrying_helps() -> None:
    for error in (BrokerConfigError, BrokerConnectError, BrokerRequestError,
                  BrokerDeadLetterError):
        assert issubclass(error, BrokerError)
    assert issubclass(BrokerError, SharedStreamError)
    assert not BrokerConfigError.retryable
    assert BrokerConnectError.retryable
    assert BrokerRequestError.retryable
    assert BrokerDeadLetterError.retryable
