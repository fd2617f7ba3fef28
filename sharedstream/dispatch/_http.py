"""What the HTTP targets share: one aiohttp session, answers, and what an answer means.

The ``webhook`` and ``airflow`` targets talk HTTP through :class:`HttpClient`:
a session opened in the target's ``open`` and closed in its ``aclose``,
every request bounded by the target's timeout. aiohttp comes with the
``dispatch`` extra; it is imported only when an HTTP target opens, and its
absence is one line naming the extra (:func:`need_aiohttp`).

What an answer means for a delivery (:func:`refusal`), the same for every
HTTP target:

* a connection that fails, a timeout, ``408``, ``429`` and any ``5xx``:
  the target may take it later - a retryable :class:`TargetError`;
* any other ``4xx``: it never will - not retryable (the run is
  ``undeliverable``, with the status and the answer's first line);
* a redirect (``3xx``) is not followed: a client following one repeats a
  POST as a GET without its body, and the new address's ``200`` would count
  a run delivered that never arrived. It is not retryable; the message
  names the ``Location`` to configure instead.

Answers are read up to :data:`ANSWER_LIMIT` bytes (what a detail needs);
the standard proxy variables (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``)
apply, read once when the target opens (:func:`env_proxy`; aiohttp's own
``trust_env`` would look them up, and ``~/.netrc``, on a thread for every
request: a quarter of a millisecond each).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlsplit
from urllib.request import getproxies, proxy_bypass

from sharedstream.dispatch.target import TargetConfigError, TargetError

__all__ = ["ANSWER_LIMIT", "HttpAnswer", "HttpClient", "env_proxy", "first_line", "need_aiohttp",
           "refusal"]

ANSWER_LIMIT = 256 * 1024
"""Most bytes of an answer's body read (the rest is left unread)."""

_RETRYABLE_4XX = frozenset({408, 425, 429})
_LINE = 300  # characters of an answer kept in a detail


def need_aiohttp(target_type: str) -> ModuleType:
    """The ``aiohttp`` module; :class:`TargetConfigError` naming the extra when it is missing."""
    try:
        import aiohttp  # noqa: PLC0415 - the dispatch extra, needed only by HTTP targets
    except ImportError as exc:
        raise TargetConfigError(
            f"the {target_type} target needs the dispatch extra: pip install "
            f"'sharedstream[dispatch]' ({exc})") from exc
    return aiohttp


def env_proxy(url: str) -> tuple[str | None, dict[str, str]]:
    """The proxy the environment names for ``url``, and the headers it needs.

    ``(None, {})`` when no ``<scheme>_proxy`` variable is set or ``no_proxy``
    exempts the host. A proxy's ``user:password`` becomes a
    ``Proxy-Authorization`` header and leaves the proxy's address.
    """
    parts = urlsplit(url)
    if not parts.hostname or proxy_bypass(parts.hostname):
        return None, {}
    found = getproxies().get(parts.scheme)
    if not found:
        return None, {}
    proxy = urlsplit(found if "://" in found else f"http://{found}")
    if proxy.username is None:
        return proxy.geturl(), {}
    secret = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    address = proxy._replace(netloc=proxy.netloc.rpartition("@")[2]).geturl()
    return address, {"Proxy-Authorization": "Basic " + base64.b64encode(secret).decode()}


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, cut to a few hundred characters."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= _LINE else line[: _LINE - 1] + "…"


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A response: its status, its body as text, and that body as JSON when it is JSON."""

    status: int
    text: str
    document: Any = None
    location: str | None = None

    @property
    def ok(self) -> bool:
        """A ``2xx``."""
        return 200 <= self.status < 300

    def summary(self) -> str:
        """``HTTP <status>: <first line>``, preferring a JSON answer's ``detail`` or ``title``."""
        said = self.text
        if isinstance(self.document, Mapping):
            for key in ("detail", "title", "message", "error"):
                value = self.document.get(key)
                if value:
                    said = value if isinstance(value, str) else json.dumps(value)
                    break
        line = first_line(said)
        return f"HTTP {self.status}: {line}" if line else f"HTTP {self.status}"


def refusal(answer: HttpAnswer, what: str) -> TargetError:
    """The error a non-``2xx`` answer to ``what`` (``"POST /api/v2/..."``) is for a delivery."""
    if 300 <= answer.status < 400:
        return TargetError(f"{what}: HTTP {answer.status}: redirected to "
                           f"{answer.location or '(no Location)'}; configure that address "
                           "instead (redirects are not followed)", retryable=False)
    retryable = answer.status >= 500 or answer.status in _RETRYABLE_4XX
    return TargetError(f"{what}: {answer.summary()}", retryable=retryable)


async def _read_up_to(stream: Any, limit: int) -> bytes:
    """The body of ``stream`` (an aiohttp ``StreamReader``) to its end, at most ``limit`` bytes.

    One ``read(n)`` returns only what has arrived so far: an answer that comes
    in pieces (or is decompressed in pieces) needs a loop. A body read to its
    end lets the connection be kept for the next request.
    """
    pieces: list[bytes] = []
    size = 0
    while size < limit:
        piece = await stream.read(limit - size)
        if not piece:
            break
        pieces.append(piece)
        size += len(piece)
    return b"".join(pieces)


class HttpClient:
    """One aiohttp session of a target; :meth:`request` never raises but :class:`TargetError`.

    ``base`` is prefixed to every path; ``timeout`` bounds each request.
    :meth:`open` before the first request, :meth:`close` once at the end.
    """

    def __init__(self, target_type: str, base: str, timeout: float) -> None:
        self._type = target_type
        self.base = base.rstrip("/")
        self._timeout = timeout
        self._session: Any = None
        self._proxy: str | None = None
        self._proxy_headers: dict[str, str] = {}  # for the proxy's CONNECT (https)
        self._plain_proxy_headers: dict[str, str] = {}  # on each request (http)

    async def open(self) -> None:
        """Start the session (no connection is made yet); the proxy is looked up now."""
        aiohttp = need_aiohttp(self._type)
        self._proxy, self._proxy_headers = env_proxy(self.base)
        if not self.base.startswith("https:"):  # a plain request carries them itself (no CONNECT)
            self._plain_proxy_headers, self._proxy_headers = self._proxy_headers, {}
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._timeout), raise_for_status=False)

    async def close(self) -> None:
        """Close the session; idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def request(self, method: str, path: str, *, body: Any = None,
                      data: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> HttpAnswer:
        """One request to ``base + path`` (JSON ``body`` or raw ``data``); the answer, any status.

        A connection that cannot be made or breaks, or no answer within the
        timeout, raises a retryable :class:`TargetError` naming the host.
        """
        if self._session is None:
            raise TargetError(f"the {self._type} target is not open", retryable=True)
        aiohttp = need_aiohttp(self._type)
        url = self.base + path
        try:
            async with self._session.request(method, url, json=body, data=data,
                                             headers={**self._plain_proxy_headers,
                                                      **(headers or {})},
                                             allow_redirects=False, proxy=self._proxy,
                                             proxy_headers=self._proxy_headers or None,
                                             ) as response:
                raw = await _read_up_to(response.content, ANSWER_LIMIT)
                try:
                    text = raw.decode(response.charset or "utf-8", errors="replace")
                except LookupError:  # a charset Python does not know
                    text = raw.decode("utf-8", errors="replace")
                status = int(response.status)
                location = response.headers.get("Location")
        except TimeoutError as exc:
            raise TargetError(f"{method} {url}: no answer within {self._timeout:g} s",
                              retryable=True) from exc
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            reason = str(exc) or type(exc).__name__
            raise TargetError(f"{method} {url}: {reason}", retryable=True) from exc
        try:
            document = json.loads(text) if text else None
        except ValueError:
            document = None
        return HttpAnswer(status, text, document, location)
