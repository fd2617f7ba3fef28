"""Checking a broker's settings: one clear line naming the first unusable one.

Every broker's settings dataclass has int options, text options, a number
of seconds or two, and rules between them (``max_in_flight`` at least
``max_messages``...). :func:`check_settings` checks the types first, then
the rules (so a rule never compares a str with an int), and raises the
broker's configuration error naming the setting and where it belongs::

    check_settings(self, error=SqsConfigError, where=f"queue {self.queue!r}",
                   ints=("max_messages", ...), texts=("queue", ...), numbers=("retry_backoff",),
                   rules=lambda: [(self.max_messages <= 10, "max_messages must be within 1..10")])

Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["check_settings"]


def check_settings(
    settings: object,
    *,
    error: Callable[[str], Exception],
    where: str,
    ints: Iterable[str] = (),
    texts: Iterable[str] = (),
    numbers: Iterable[str] = (),
    rules: Callable[[], Iterable[tuple[bool, str]]] = tuple,
) -> None:
    """Raise ``error("<problem> (<where>)")`` for the first unusable setting of ``settings``.

    ``ints`` must be exactly ``int`` (``True`` is not a number of
    messages); ``texts`` a ``str`` or ``None``; ``numbers`` an ``int`` or
    ``float`` (not ``bool``). Then ``rules()`` gives ``(ok, problem)``
    pairs, asked only once every type is right; the first one not ok is
    raised.
    """
    for name in ints:
        value = getattr(settings, name)
        if type(value) is not int:
            raise error(f"{name} must be an int, got {type(value).__qualname__} ({where})")
    for name in texts:
        value = getattr(settings, name)
        if value is not None and type(value) is not str:
            raise error(f"{name} must be a str, got {type(value).__qualname__} ({where})")
    for name in numbers:
        value = getattr(settings, name)
        if type(value) not in (int, float):
            raise error(f"{name} must be a number, got {type(value).__qualname__} ({where})")
    for ok, problem in rules():
        if not ok:
            raise error(f"{problem} ({where})")
