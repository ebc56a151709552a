"""Outbound HTTP for inferlets: allow-listed hosts only, run on worker threads.

Results are handed back to the control loop through ``post`` so futures are
only ever completed on the loop thread.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

MAX_BODY_BYTES = 16 << 20


class HttpClient:
    def __init__(self, allowed_hosts: tuple[str, ...], post: Callable[[Callable[[], None]], None],
                 timeout_s: float = 30.0, workers: int = 8):
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self._post, self._timeout_s = post, timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="oven-http")

    def fetch(self, method: str, url: str, headers: list[str], body: bytes,
              on_done: Callable[[int, bytes], None], on_error: Callable[[str], None]) -> None:
        parsed = urllib.parse.urlsplit(url)
        host = (parsed.hostname or "").lower()
        if parsed.scheme not in ("http", "https"):
            on_error(f"only http and https URLs are allowed, not {url!r}")
        elif host not in self.allowed_hosts:
            on_error(f"host {host!r} is not on the server's http allow-list")
        else:
            self._pool.submit(self._run, method, url, headers, body, on_done, on_error)

    def _run(self, method, url, headers, body, on_done, on_error) -> None:
        request = urllib.request.Request(url, data=body or None, method=method.upper())
        for line in headers:
            name, _, value = line.partition(":")
            request.add_header(name.strip(), value.strip())
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                data, status = response.read(MAX_BODY_BYTES), response.status
            self._post(lambda: on_done(status, data))
        except urllib.error.HTTPError as exc:  # a 4xx/5xx answer is a response, not a failure
            data, status = exc.read(MAX_BODY_BYTES), exc.code
            self._post(lambda: on_done(status, data))
        except Exception as exc:  # DNS, refused, timeout: the inferlet sees the reason
            message = f"{type(exc).__name__}: {exc}"
            self._post(lambda: on_error(message))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
