"""Dead letters kept in the store, published to their source again (``deadletters redrive``).

A raw event whose broker dead-letter destination refused it is kept in the
store's table (``sharedstream deadletters list``). Once the cause is fixed,
:func:`redrive` hands it back to the stream it came from: the trigger that
failed or rejected it names the stream (its kwargs, decrypted with the
configuration's key, rebuild it through the trigger registry), the
trigger's producer publishes it again (``SharedStreamProducer.republish``:
body and headers as kept), and the store records the re-drive. The stream's
watchers then see it as a new message. Letters are handled per stream, in
one ``republish`` call each; a stream that fails leaves its letters as they
were (to try again) and the others go on.

Refused, one line each: a letter the store kept only a prefix of (its body
was larger than the table keeps), a letter none of whose triggers is in the
store any more, and a producer that cannot republish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sharedstream.connections import ConnectionNotFound, InvalidConnection
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.producer import DeadLetter
from sharedstream.engine.trigger import BaseEventTrigger, uses_ack_mode
from sharedstream.runtime.crypto import KwargsCipher
from sharedstream.runtime.registry import TriggerRegistry
from sharedstream.runtime.serde import unpack_kwargs
from sharedstream.store import DeadLetterRow, MetadataStore, TriggerRow

__all__ = ["RedriveReport", "redrive"]


@dataclass
class RedriveReport:
    """What :func:`redrive` did: letters re-driven per stream, and why others were not."""

    redriven: dict[str, list[int]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)


def _letter(row: DeadLetterRow) -> DeadLetter:
    return DeadLetter(stream=row.stream, source=row.source, reason=row.reason,
                      triggers=row.triggers, payload=row.payload, headers=row.headers)


def _owner(store: MetadataStore, row: DeadLetterRow) -> TriggerRow | None:
    """The first of the letter's triggers the store still has."""
    for trigger in row.triggers:
        if trigger.isdigit():
            found = store.get_trigger(int(trigger))
            if found is not None:
                return found
    return None


async def redrive(store: MetadataStore, rows: Sequence[DeadLetterRow], *, key: str | None,
                  registry: TriggerRegistry) -> RedriveReport:
    """Publish ``rows`` to their sources again and record it; see the module docstring.

    ``key`` is ``[store] kwargs_key`` (stored kwargs are encrypted with it).
    Raises :class:`SharedStreamError` (one line) only when nothing can be
    done at all (no key); per-letter and per-stream problems are reported.
    """
    if not key:
        raise SharedStreamError("re-driving needs [store] kwargs_key (the triggers' kwargs are "
                                "encrypted with it)")
    cipher = KwargsCipher(key)
    report = RedriveReport()
    by_trigger: dict[int, tuple[TriggerRow, list[DeadLetterRow]]] = {}
    for row in rows:
        if row.truncated:
            report.refused.append(f"dead letter {row.id}: only {len(row.payload)} of its "
                                  f"{row.payload_size} bytes were kept; it cannot be re-driven")
            continue
        owner = _owner(store, row)
        if owner is None:
            report.refused.append(f"dead letter {row.id}: none of its triggers "
                                  f"({', '.join(row.triggers) or 'none'}) is in the store")
            continue
        by_trigger.setdefault(owner.id, (owner, []))[1].append(row)
    for owner, letters in by_trigger.values():
        stream = letters[0].stream
        try:
            await _republish(owner, letters, cipher, registry)
        except (NotImplementedError, SharedStreamError, ConnectionNotFound,
                InvalidConnection) as exc:
            report.refused.append(f"{stream}: {len(letters)} dead letter(s) not re-driven: "
                                  f"{' '.join(str(exc).split())}")
            continue
        ids = [row.id for row in letters]
        store.mark_redriven(ids)
        report.redriven.setdefault(stream, []).extend(ids)
    return report


async def _republish(owner: TriggerRow, letters: Sequence[DeadLetterRow], cipher: KwargsCipher,
                     registry: TriggerRegistry) -> None:
    try:
        trigger = registry.rehydrate(owner.classpath, unpack_kwargs(
            cipher.decrypt(owner.kwargs_blob)))
    except (SharedStreamError, TypeError, ValueError) as exc:
        raise SharedStreamError(f"trigger {owner.id} ({owner.classpath}) cannot be rebuilt: "
                                f"{exc}") from exc
    if not isinstance(trigger, BaseEventTrigger) or not uses_ack_mode(type(trigger)):
        raise SharedStreamError(f"trigger {owner.id} ({owner.classpath}) has no producer to "
                                "publish with")
    producer = type(trigger).create_shared_stream_producer(trigger.serialize()[1])
    await producer.republish([_letter(row) for row in letters])
