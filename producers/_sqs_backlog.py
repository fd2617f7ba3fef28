"""SQS's backlog of a shared stream: the queue's message counts and its dead-letter queue's.

One lane, the queue's name, with three kinds:

* ``visible`` - ``ApproximateNumberOfMessages``: waiting to be received;
* ``in_flight`` - ``ApproximateNumberOfMessagesNotVisible``: received by a
  consumer (this triggerer or another) and not yet deleted or shown again;
* ``dead_letter`` - the dead-letter queue's ``ApproximateNumberOfMessages``,
  when there is one: the producer's ``dead_letter_queue`` setting, or else
  the queue's own ``RedrivePolicy`` target. Absent when neither is set.

SQS calls these approximate (eventually consistent, about a minute behind
at worst); they are the numbers CloudWatch's ``ApproximateNumberOf...``
metrics show. A FIFO queue gives no count per message group, so the lane is
the queue, not the producer's lanes. Two or three ``GetQueueAttributes``
calls (and a ``GetQueueUrl`` for a redrive target) per poll, through the
producer's client; read only.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sharedstream.engine.producer import BrokerBacklog
from sharedstream.producers._sqs_types import SqsRequestError, queue_name

__all__ = ["queue_backlog", "queue_counts", "redrive_target"]

Call = Callable[..., Awaitable[dict[str, Any]]]
"""The producer's counted, error-wrapping ``_call(operation, **kwargs)``."""

VISIBLE = "ApproximateNumberOfMessages"
NOT_VISIBLE = "ApproximateNumberOfMessagesNotVisible"
REDRIVE = "RedrivePolicy"
_ARN_PARTS = 6


def queue_counts(attributes: Mapping[str, str]) -> dict[str, int]:
    """``visible`` and ``in_flight`` from a ``GetQueueAttributes`` answer's ``Attributes``."""
    try:
        return {"visible": int(attributes[VISIBLE]), "in_flight": int(attributes[NOT_VISIBLE])}
    except (KeyError, ValueError) as exc:
        raise SqsRequestError(f"GetQueueAttributes gave no message counts: {exc!r}") from exc


def redrive_target(policy: str | None) -> tuple[str, str] | None:
    """``(queue name, account id)`` of a ``RedrivePolicy``'s dead-letter queue, or ``None``.

    The policy names it by ARN (``arn:aws:sqs:region:account:name``); one
    that cannot be read counts as none.
    """
    if not policy:
        return None
    try:
        arn = str(json.loads(policy)["deadLetterTargetArn"])
    except (ValueError, KeyError, TypeError):
        return None
    parts = arn.split(":")  # arn:aws:sqs:region:account:name
    return (parts[5], parts[4]) if len(parts) == _ARN_PARTS and parts[5] else None


async def queue_backlog(call: Call, url: str, dead_letter_url: str | None) -> BrokerBacklog:
    """``{queue name: {visible, in_flight[, dead_letter]}}`` of the queue at ``url``.

    ``dead_letter_url`` is the producer's resolved ``dead_letter_queue``
    (``None``: the queue's redrive policy says, if it names one). Raises
    :class:`SqsRequestError` when a call fails.
    """
    attributes = (await call("GetQueueAttributes", QueueUrl=url,
                             AttributeNames=[VISIBLE, NOT_VISIBLE, REDRIVE]))["Attributes"]
    counts = queue_counts(attributes)
    if dead_letter_url is None:
        target = redrive_target(attributes.get(REDRIVE))
        if target is not None:
            name, account = target
            dead_letter_url = str((await call("GetQueueUrl", QueueName=name,
                                              QueueOwnerAWSAccountId=account))["QueueUrl"])
    if dead_letter_url is not None:
        letters = (await call("GetQueueAttributes", QueueUrl=dead_letter_url,
                              AttributeNames=[VISIBLE]))["Attributes"]
        try:
            counts["dead_letter"] = int(letters[VISIBLE])
        except (KeyError, ValueError) as exc:
            raise SqsRequestError(
                f"GetQueueAttributes gave no count for {queue_name(dead_letter_url)}") from exc
    return {queue_name(url): counts}
