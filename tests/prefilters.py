"""The check both broker trigger suites run on their declarative-match prefilters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sharedstream.engine.fanout import FanOut, Subscriber


def assert_prefilters_agree(triggers: Sequence[Any], make_raw: Callable[[], Any],
                            context: object) -> None:
    """Each prefilter, asked alone and through the fan-out, passes what its filter needs.

    ``make_raw()`` builds the raw event afresh (an empty decode cache) each
    call. A trigger's filter needs the raw event when it matches or cannot
    decode it (it rejects it); the prefilter must accept exactly those. The
    fan-out asks all the tests together (one selection per shape) and must
    hand over the same.
    """
    accepts = [trigger.shared_stream_prefilter() for trigger in triggers]
    fanout = FanOut(capacity=1)
    subs = [Subscriber(i, accept) for i, accept in enumerate(accepts)]
    for sub in subs:
        fanout.add(sub)
    fanned = make_raw()
    fanout.broadcast(fanned, fanned)
    raw = make_raw()
    for trigger, accept, sub in zip(triggers, accepts, subs, strict=True):
        try:
            handed = trigger.matches(trigger.decode(raw), raw)
        except ValueError:
            handed = True  # rejected by the filter, so it must see it
        if accept is None:
            assert handed, "no prefilter only when everything matches"
        else:
            assert accept(raw) == handed, (trigger.match, context)
        assert (fanned in sub.inbox) == handed, (trigger.match, context)
