"""Which URLs an inferlet may fetch: the server's allow-list of ``host:port`` entries.

A URL is parsed once, strictly, into a :class:`Target` (scheme, host, port,
path); the allow-list checks that target and the HTTP client connects to that
same target, so no second parser can read another host out of the URL. What
the strict parse cannot place (userinfo, backslashes, control characters, a
second colon) is refused rather than guessed at.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass

DEFAULT_PORT_BY_SCHEME = {"http": 80, "https": 443}
# host, or [IPv6 address], then an optional :port. Anything else in a netloc (userinfo, a zone id,
# percent escapes, a second colon) fails the match.
_NETLOC = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?")
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")


class HttpRefused(ValueError):
    """A URL the allow-list does not admit, or one too odd to check; the message says which."""


@dataclass(frozen=True, slots=True)
class Target:
    """What a fetch connects to and asks for: exactly what the allow-list checked."""

    scheme: str  # "http" or "https"
    host: str  # lower case, no trailing dot; an IPv6 address without brackets
    port: int
    path: str  # path and query, as sent in the request line ("/" at least)


class AllowList:
    """``host:port`` entries; a bare host admits its scheme's default port (80 for http, 443 for https)."""

    def __init__(self, ports_by_host: dict[str, frozenset[int | None]]):
        self._ports_by_host = ports_by_host  # None in a host's set = its scheme's default port

    @classmethod
    def parse(cls, text: str) -> "AllowList":
        """Comma-separated ``host``, ``host:port``, ``[v6addr]`` or ``[v6addr]:port``.

        Raises ValueError naming the first bad entry."""
        ports_by_host: dict[str, set[int | None]] = {}
        for entry in (e.strip() for e in text.split(",")):
            if entry:
                try:
                    host, port = _split_netloc(entry)
                except HttpRefused as exc:
                    raise ValueError(f"http_allow: {exc}") from None
                ports_by_host.setdefault(host, set()).add(port)
        return cls({host: frozenset(ports) for host, ports in ports_by_host.items()})

    def check(self, url: str) -> Target:
        """The target of ``url`` if the allow-list admits it; HttpRefused (saying why) if not."""
        target = _parse_url(url)
        ports = self._ports_by_host.get(target.host, frozenset())
        if target.port in ports or (None in ports and target.port == DEFAULT_PORT_BY_SCHEME[target.scheme]):
            return target
        shown = f"[{target.host}]" if ":" in target.host else target.host
        if not ports:
            raise HttpRefused(f"host {shown!r} is not on the server's http allow-list (oven serve --http-allow)")
        raise HttpRefused(f"port {target.port} of {shown!r} is not on the server's http allow-list "
                          "(entries are host:port; a bare host admits 80 for http and 443 for https)")


def _parse_url(url: str) -> Target:
    """``url`` split strictly into a Target; HttpRefused for anything the split would have to guess at."""
    if not url.isascii() or any(c <= " " or c in "\x7f\\" for c in url):
        raise HttpRefused(f"URL {url!r} holds spaces, control characters, backslashes or non-ASCII "
                          "(percent-encode them; write an international host name in its xn-- form)")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # an unbalanced [ in the host, say
        raise HttpRefused(f"URL {url!r} does not parse: {exc}") from None
    if parts.scheme not in DEFAULT_PORT_BY_SCHEME or not url[len(parts.scheme):].startswith("://"):
        raise HttpRefused(f"only http:// and https:// URLs may be fetched, not {url!r}")
    if "@" in parts.netloc:
        raise HttpRefused(f"URL {url!r} carries user info (user@host); credentials go in a header")
    host, port = _split_netloc(parts.netloc)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, DEFAULT_PORT_BY_SCHEME[parts.scheme] if port is None else port, path)


def _split_netloc(netloc: str) -> tuple[str, int | None]:
    """(normalised host, port or None) of ``host[:port]`` / ``[v6addr][:port]``."""
    match = _NETLOC.fullmatch(netloc)
    if match is None:
        raise HttpRefused(f"{netloc!r} is not host, host:port or [IPv6 address]:port")
    if match["v6"] is not None:
        try:
            host = ipaddress.IPv6Address(match["v6"]).compressed
        except ValueError:
            raise HttpRefused(f"[{match['v6']}] is not an IPv6 address") from None
    else:  # names compare without case and without the root's trailing dot
        host = match["name"].lower().removesuffix(".")
        if _NAME.fullmatch(host) is None:
            raise HttpRefused(f"{match['name']!r} is not a host name")
    port = None if match["port"] is None else int(match["port"])
    if port is not None and not 1 <= port <= 65535:
        raise HttpRefused(f"port {port} is outside 1..65535")
    return host, port
