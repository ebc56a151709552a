"""Outbound HTTP for inferlets: allow-listed targets only, a few at a time per instance, on worker threads.

* **No redirects.** ``http.client`` follows none: a 3xx reaches the inferlet as a response like any
  other, so an allowed server cannot send a fetch on to a host or port the allow-list does not admit.
  The request is built from the :class:`~.http_allow.Target` the allow-list checked, never from the
  URL text again.
* **Per instance.** An instance has at most ``per_instance`` fetches in flight; more wait in its own
  queue (at most ``queue_per_instance``; past that a fetch fails at once), so one instance cannot
  occupy every shared worker. When an instance ends, its queued fetches are dropped and its running
  ones cut.
* **A total deadline.** A socket timeout bounds one read, and a server sending a byte a second never
  trips it; so a watchdog thread shuts a fetch's socket down once ``timeout_s`` have passed since it
  started, whatever phase it is in (connect, TLS, send, headers, body).

Results are handed back through ``post`` so futures are only ever completed on the loop thread.
"""

from __future__ import annotations

import functools
import http.client
import re
import socket
import ssl
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from .http_allow import AllowList, HttpRefused, Target

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: method and header names
# Headers that name the host, frame the body or steer the connection are http.client's to write, from the
# target the allow-list checked: an inferlet's Host would reach another virtual host behind an allowed
# proxy, its Content-Length or Transfer-Encoding would split one request into two (RFC 9110 7.6.1's
# hop-by-hop fields besides).
_CONNECTION_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                                 "proxy-connection", "te", "trailer", "upgrade"})


class _FetchFailed(Exception):
    """A fetch failed for a reason already worded for the inferlet."""


class _Fetch:
    """One request on its way; ``cut`` may be called from any thread to end it early."""

    def __init__(self, owner: str, target: Target, method: str, headers: dict[str, str], body: bytes,
                 on_done: Callable[[int, bytes], None], on_error: Callable[[str], None], client: str = ""):
        self.owner, self.target, self.method, self.headers, self.body = owner, target, method, headers, body
        self.client = client  # whose instance ``owner`` is: a client's instances share its part of the workers
        self.on_done, self.on_error = on_done, on_error
        self.deadline = float("inf")
        self.cut_reason: str | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def attach(self, conn: http.client.HTTPConnection) -> None:
        """From now on ``cut`` shuts ``conn``'s socket down; raises if the fetch was cut already."""
        with self._lock:
            self._conn = conn
        self.raise_if_cut()

    def raise_if_cut(self) -> None:
        with self._lock:
            if self.cut_reason is not None:
                raise _FetchFailed(self.cut_reason)

    def cut(self, reason: str) -> None:
        with self._lock:
            self.cut_reason = self.cut_reason or reason
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:  # socket.socket's own shutdown: SSLSocket's would also drop its SSL state under the reader
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: the fetch is over anyway


class _Watchdog:
    """One thread that cuts every watched fetch still running at its deadline."""

    def __init__(self, reason: str):
        self._reason, self._closed = reason, False
        self._watched: set[_Fetch] = set()
        self._cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True, name="oven-http-deadline").start()

    def watch(self, fetch: _Fetch) -> None:
        with self._cond:
            self._watched.add(fetch)
            self._cond.notify()

    def unwatch(self, fetch: _Fetch) -> None:
        with self._cond:
            self._watched.discard(fetch)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for fetch in [f for f in self._watched if f.deadline <= now]:
                    self._watched.discard(fetch)
                    fetch.cut(self._reason)
                next_deadline = min((f.deadline for f in self._watched), default=None)
                self._cond.wait(None if next_deadline is None else next_deadline - now)


class HttpClient:
    """Fetches for many instances (``owner`` = instance id) of many clients on ``workers`` shared threads.

    An instance has at most ``per_instance`` fetches in flight, and a client's instances together at most
    half the workers (at least one): however many instances one client runs, the others find workers.
    """

    def __init__(self, allow: AllowList, post: Callable[[Callable[[], None]], None], *, timeout_s: float = 30.0,
                 per_instance: int = 2, queue_per_instance: int = 64, workers: int = 8,
                 max_body_bytes: int = 16 << 20):
        self.allow, self._post = allow, post
        self._timeout_s, self._max_body_bytes = timeout_s, max_body_bytes
        self._per_instance, self._queue_per_instance = per_instance, queue_per_instance
        self._per_client = max(1, workers // 2)
        self._tls = ssl.create_default_context()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="oven-http")
        self._timeout_reason = f"no complete response within {timeout_s:g} s (oven serve --http-timeout-s)"
        self._watchdog = _Watchdog(self._timeout_reason)
        self._lock = threading.Lock()  # guards the three maps below
        self._running_by_owner: dict[str, set[_Fetch]] = {}  # handed to the pool (started or about to be)
        self._queued_by_owner: dict[str, deque[_Fetch]] = {}
        self._running_by_client: Counter[str] = Counter()

    def fetch(self, owner: str, method: str, url: str, headers: list[str], body: bytes,
              on_done: Callable[[int, bytes], None], on_error: Callable[[str], None], client: str = "") -> None:
        """Start (or queue) a fetch for instance ``owner`` of ``client``. Exactly one callback runs, on the loop
        thread (at once for a request refused here, else through ``post``), unless ``owner`` is forgotten first."""
        try:
            job = _Fetch(owner, self.allow.check(url), _method(method), _header_map(headers), body,
                         on_done, on_error, client)
        except HttpRefused as exc:
            on_error(str(exc))
            return
        with self._lock:
            self._running_by_owner.setdefault(owner, set())
            queued = self._queued_by_owner.setdefault(owner, deque())
            starts = not queued and self._may_start(job)
            fits = starts or len(queued) < self._queue_per_instance
            if starts:
                self._start(job)
            elif fits:
                queued.append(job)
        if starts:
            self._pool.submit(self._run, job)
        elif not fits:
            on_error(f"too many http fetches: this instance has {self._per_instance} in flight and "
                     f"{self._queue_per_instance} queued (oven serve --http-queue-per-instance)")

    def forget(self, owner: str) -> None:
        """An instance ended: drop its queued fetches and cut its running ones; none of them calls back."""
        with self._lock:
            running = self._running_by_owner.pop(owner, set())
            self._queued_by_owner.pop(owner, None)
            following = []
            for job in running:
                self._running_by_client[job.client] -= 1
                following += self._next_of(job.client)
        for job in running:
            job.cut("the instance ended")
        for job in following:
            self._pool.submit(self._run, job)

    def close(self) -> None:
        with self._lock:
            running = [job for jobs in self._running_by_owner.values() for job in jobs]
            self._running_by_owner.clear()
            self._queued_by_owner.clear()
            self._running_by_client.clear()
        for job in running:
            job.cut("the server is shutting down")
        self._watchdog.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, job: _Fetch) -> None:
        job.deadline = time.monotonic() + self._timeout_s
        self._watchdog.watch(job)
        try:
            status, data = self._exchange(job)
            outcome = functools.partial(job.on_done, status, data)
        except Exception as exc:  # DNS, refused, reset, cut: the inferlet sees the reason
            message = job.cut_reason or _describe(exc, self._timeout_reason)
            outcome = functools.partial(job.on_error, message)
        finally:
            self._watchdog.unwatch(job)
        if self._finish(job):
            self._post(outcome)

    def _exchange(self, job: _Fetch) -> tuple[int, bytes]:
        t = job.target
        if t.scheme == "https":
            conn = http.client.HTTPSConnection(t.host, t.port, timeout=self._timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(t.host, t.port, timeout=self._timeout_s)
        try:
            job.attach(conn)
            conn.connect()
            job.raise_if_cut()  # cut while connecting, before there was a socket to shut down
            conn.request(job.method, t.path, body=job.body or None, headers=job.headers)
            response = conn.getresponse()
            data = response.read(self._max_body_bytes + 1)
            if len(data) > self._max_body_bytes:
                raise _FetchFailed(f"the response body exceeds {self._max_body_bytes} bytes "
                                   "(oven serve --http-max-body-mib)")
            job.raise_if_cut()  # a cut socket reads as the end of the message: what came is not all of it
            return response.status, data
        finally:
            conn.close()

    def _finish(self, job: _Fetch) -> bool:
        """Retire ``job`` and start the next queued fetch its slot allows (its owner's first, else another
        instance's of its client); False if the owner was forgotten."""
        with self._lock:
            running = self._running_by_owner.get(job.owner)
            if running is None or job not in running:
                return False
            running.discard(job)
            self._running_by_client[job.client] -= 1
            following = self._next_of(job.client, first=job.owner)
            if not running and not self._queued_by_owner[job.owner]:
                # nothing left for this owner: keep the maps as small as the live fetches
                del self._running_by_owner[job.owner], self._queued_by_owner[job.owner]
        for job in following:
            self._pool.submit(self._run, job)
        return True

    # -- under self._lock ------------------------------------------------------------------------

    def _may_start(self, job: _Fetch) -> bool:
        return (len(self._running_by_owner[job.owner]) < self._per_instance
                and self._running_by_client[job.client] < self._per_client)

    def _start(self, job: _Fetch) -> None:
        self._running_by_owner[job.owner].add(job)
        self._running_by_client[job.client] += 1

    def _next_of(self, client: str, first: str | None = None) -> list[_Fetch]:
        """Queued fetches of ``client``'s instances that may start now (``first``'s before the others'),
        marked running; the caller submits them."""
        owners = [first] if first is not None else []
        owners += [o for o, q in self._queued_by_owner.items() if o != first and q and q[0].client == client]
        started = []
        for owner in owners:
            queued = self._queued_by_owner.get(owner)
            while queued and self._may_start(queued[0]):
                started.append(queued.popleft())
                self._start(started[-1])
        return started


def _method(method: str) -> str:
    if _TOKEN.fullmatch(method) is None:
        raise HttpRefused(f"{method!r} is not an HTTP method")
    return method.upper()


def _header_map(lines: list[str]) -> dict[str, str]:
    headers = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or _TOKEN.fullmatch(name.strip()) is None or any(c in value for c in "\r\n\0"):
            raise HttpRefused(f"header {line!r} is not a 'Name: value' line")
        if name.strip().lower() in _CONNECTION_HEADERS:
            raise HttpRefused(f"header {name.strip()!r} is set by oven, not by an inferlet")
        headers[name.strip()] = value.strip()
    return headers


def _describe(exc: Exception, timeout_reason: str) -> str:
    if isinstance(exc, _FetchFailed):
        return str(exc)
    if isinstance(exc, TimeoutError):  # one socket operation (connect, say) took the whole deadline
        return timeout_reason
    return f"{type(exc).__name__}: {exc}"
