"""The secrets of one HTTP request (its header values, the URL's password and query tokens) and their
removal from what a reply shows: a failed reply's excerpt, every string of a parsed one, a URL in a
repr. ``async_reward._core.http`` applies them to every reply.

A server may echo a secret in another spelling than ours: JSON-escaped (``\\/`` for ``/`` as PHP's
``json_encode`` writes it, ``\\u0042`` for ``B``), or URL-encoded. So a JSON body is redacted as the
decoded tree it stands for, and every string is also searched for the escaped spellings of each
secret; a body that is not JSON (or is cut short) has its JSON escapes decoded before it is searched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit, urlunsplit

import aiohttp
from yarl import URL

from async_reward._core.redaction import HIDDEN, is_secret_name

__all__ = ["REDACTED", "excerpt", "redact", "redact_tree", "redact_url", "secrets_of", "shown_url"]

#: What replaces a secret in a reply.
REDACTED = "[redacted]"
_PLAIN_HEADERS = frozenset({"accept", "accept-encoding", "content-type", "user-agent"})
"""Request headers that never hold a secret; every other header's value is redacted from replies."""
_MIN_PLAIN_SECRET = 8
"""The shortest value (or last word) of a header or query parameter with a plain name (``X-Region:
eu``, ``?mode=fast``) taken for a secret: such a value is a setting, not a token, and replacing ``eu``
in every string of the reply would garble it. A parameter or header whose name reads as a secret's
(``api_key``, ``token``, ``Authorization``) has its value redacted whatever its length, as the URL's
password is."""

_MIN_SECRET = 3
"""The shortest value searched for at all: one or two characters are no secret a server could be
kept from echoing, and replacing ``7`` in every string would garble the judge's ``[[7]]`` itself."""

# A JSON escape: a surrogate pair, one \uXXXX (not a lone surrogate, which no str can hold), or \" \\ \/
# \b \f \n \r \t.
_JSON_ESCAPE = re.compile(
    r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})|\\u(?!d[89a-f])([0-9a-f]{4})|\\([\"\\/bfnrt])",
    re.IGNORECASE,
)
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def secrets_of(url: str, headers: Mapping[str, str] | None) -> list[str]:
    """What a reply must not show, in every spelling searched for, longest first (so that a shorter
    secret inside a longer one cannot leave the longer one's ends in view).

    Whatever their length (a short key is a key still): the URL's password (also as the ``Basic``
    credentials aiohttp sends for it), and a header's value and its last word (the token of ``Bearer
    <token>``) or a query value under a secret-looking name (``X-Api-Key``, ``Authorization``,
    ``?token=``). Under any other name (``X-Region: eu``, ``?mode=fast``), from
    :data:`_MIN_PLAIN_SECRET` characters: a short one is a setting."""
    found: set[str] = set()
    for name, value in (headers or {}).items():
        if name.lower() in _PLAIN_HEADERS:
            continue
        for part in (value, value.rsplit(" ", 1)[-1]):  # the whole value, and a Bearer's token
            if is_secret_name(name) or len(part) >= _MIN_PLAIN_SECRET:  # not "eu" of "X-Region: eu"
                found.add(part)
    try:
        credentials = aiohttp.BasicAuth.from_url(URL(url))
        query = parse_qsl(urlsplit(url).query)
    except ValueError:  # aiohttp refuses such a URL itself, before anything is sent
        query, credentials = [], None
    if credentials is not None:
        basic = credentials.encode()
        found |= {credentials.password, basic, basic.rsplit(" ", 1)[-1]}
    found |= {value for name, value in query if is_secret_name(name) or len(value) >= _MIN_PLAIN_SECRET}
    spellings = {
        spelling for secret in found if len(secret) >= _MIN_SECRET for spelling in _spellings(secret)
    }
    return sorted(spellings, key=lambda spelling: (-len(spelling), spelling))


def _spellings(secret: str) -> set[str]:
    """``secret`` as written, JSON-escaped (with and without ``\\u`` for non-ASCII, with ``/`` and
    ``\\/``) and URL-encoded (``%2F`` or ``/``, ``%20`` or ``+``)."""
    escaped = {json.dumps(secret, ensure_ascii=ascii_only)[1:-1] for ascii_only in (False, True)}
    escaped |= {text.replace("/", "\\/") for text in escaped}
    return {secret, *escaped, quote(secret, safe=""), quote(secret), quote_plus(secret, safe="")}


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (:func:`secrets_of`, longest first) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def redact_tree(value: Any, secrets: Sequence[str]) -> Any:
    """Parsed JSON with ``secrets`` redacted from every string in it, keys included, at any depth
    (in place). A loop over a stack, not recursion: ``json.loads`` accepts nesting close to the
    recursion limit, which a recursive walk started further down the stack would pass."""
    if not secrets:
        return value
    if isinstance(value, str):
        return redact(value, secrets)
    stack: list[Any] = [value] if isinstance(value, (list, dict)) else []
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pairs = list(node.items())
            node.clear()
            node.update((redact(key, secrets), _redacted_item(item, secrets, stack)) for key, item in pairs)
        else:
            node[:] = [_redacted_item(item, secrets, stack) for item in node]
    return value


def _redacted_item(item: Any, secrets: Sequence[str], stack: list[Any]) -> Any:
    """A string redacted; a list or dict put on ``stack``, to be redacted in place in its turn."""
    if isinstance(item, str):
        return redact(item, secrets)
    if isinstance(item, (list, dict)):
        stack.append(item)
    return item


def excerpt(body: bytes, secrets: Sequence[str], chars: int) -> str:
    """The start of a reply's ``body``, ``chars`` long at most, with no secret in any spelling.

    A JSON body is redacted as the tree it decodes to, then written out again: an escape spells a
    secret in more ways than can be listed. Any other body (one cut short by the read cap too) has
    its JSON escapes decoded, then is redacted."""
    try:
        text = json.dumps(redact_tree(json.loads(body), secrets), ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError), or too deep
        # Decode more than we keep, so a secret straddling the cut is still found and redacted.
        text = _decode_json_escapes(body[: chars * 8].decode("utf-8", errors="replace"))
    return redact(text, secrets)[:chars]


def _decode_json_escapes(text: str) -> str:
    def decode(match: re.Match[str]) -> str:
        high, low, single, simple = match.groups()
        if simple is not None:
            return _SIMPLE_ESCAPES[simple]
        if single is not None:
            return chr(int(single, 16))
        return chr(0x10000 + ((int(high, 16) - 0xD800) << 10) + (int(low, 16) - 0xDC00))

    return _JSON_ESCAPE.sub(decode, text)


def redact_url(url: str) -> str:
    """``url`` without its ``user:password@``, query and fragment: for errors about a call."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # drop user:password@
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def shown_url(url: str | None) -> str | None:
    """``url`` for a repr: its ``user:password@`` and its query as ``<hidden>`` (the form config
    errors print), so that it is still seen that the URL carries them; its fragment dropped."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:  # unreadable (a broken IPv6 host): nothing of it can be told safe
        return HIDDEN
    _user, at, host = parts.netloc.rpartition("@")
    netloc = f"{HIDDEN}@{host}" if at else host
    return urlunsplit((parts.scheme, netloc, parts.path, HIDDEN if parts.query else "", ""))
