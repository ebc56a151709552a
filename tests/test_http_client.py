"""HttpClient against real HTTP servers on 127.0.0.1: no redirects, ports, deadlines, per-instance shares."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from contextlib import contextmanager

import pytest

from oven.control.runtime.http_allow import AllowList
from oven.control.runtime.http_client import HttpClient

WAIT_S = 20  # generous bound on waits that end far sooner; no assertion depends on it


class Server(http.server.ThreadingHTTPServer):
    """Answers by path; remembers every request it saw and how many /hold requests it held at once."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1"):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), Handler)
        self.paths: list[str] = []
        self.release = threading.Event()  # /hold answers once this is set
        self.holding = self.max_holding = 0
        self.lock = threading.Condition()
        self.redirect_to = ""

    @property
    def port(self) -> int:
        return self.server_address[1]

    def wait_holding(self, count: int) -> None:
        with self.lock:
            assert self.lock.wait_for(lambda: self.holding == count, WAIT_S), f"{self.holding} held, not {count}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def do_GET(self):  # noqa: N802 (http.server's naming)
        with self.server.lock:
            self.server.paths.append(self.path)
        getattr(self, "answer_" + self.path.strip("/").split("?")[0].replace("-", "_"), self.answer_other)()

    def answer_redirect(self):
        self.reply(302, b"moved", [("Location", self.server.redirect_to)])

    def answer_hold(self):
        with self.server.lock:
            self.server.holding += 1
            self.server.max_holding = max(self.server.max_holding, self.server.holding)
            self.server.lock.notify_all()
        self.server.release.wait(WAIT_S)
        with self.server.lock:
            self.server.holding -= 1
        self.reply(200, b"held")

    def answer_trickle_headers(self):  # a byte of header every 50 ms: no socket read ever waits long
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        self.trickle(b"X-Slow: " + b"." * 400 + b"\r\n")

    def answer_trickle_body(self):
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n")
        self.trickle(b"." * 400)

    def answer_host(self):
        self.reply(200, self.headers["Host"].encode())

    def answer_big(self):
        self.reply(200, b"x" * int(self.path.split("=")[1]))

    def answer_other(self):
        self.reply(200, b"secret of " + self.path.encode())

    def trickle(self, data: bytes) -> None:
        try:
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the client cut the connection, as it should

    def reply(self, status: int, body: bytes, headers=()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def running(*servers: Server):
    for server in servers:
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield servers
    finally:
        for server in servers:
            server.release.set()
            server.shutdown()
            server.server_close()


@pytest.fixture
def server():
    with running(Server()) as (s,):
        yield s


@contextmanager
def client_for(allow: str, **limits):
    # Callbacks run on the worker thread here; the control loop posts them to its own thread instead.
    client = HttpClient(AllowList.parse(allow), post=lambda callback: callback(), **limits)
    try:
        yield client
    finally:
        client.close()


class Outcome:
    """(status, body) or an error message, once the fetch calls back."""

    def __init__(self, client: HttpClient, url: str, owner: str = "a", headers=(), of: str = ""):
        """``of``: the client whose instance ``owner`` is."""
        self.value, self.done = None, threading.Event()
        client.fetch(owner, "GET", url, list(headers), b"", on_done=self._set, on_error=self._set, client=of)

    def _set(self, *value) -> None:
        self.value = value if len(value) > 1 else value[0]
        self.done.set()

    def wait(self):
        assert self.done.wait(WAIT_S), "the fetch never called back"
        return self.value


def test_a_redirect_comes_back_as_a_response_and_is_never_followed(server):
    with running(Server()) as (target,):
        server.redirect_to = f"http://localhost:{target.port}/admin"
        with client_for(f"127.0.0.1:{server.port}") as client:
            assert Outcome(client, f"http://127.0.0.1:{server.port}/redirect").wait() == (302, b"moved")
        with client_for(f"127.0.0.1:{server.port}, localhost:{target.port}") as client:  # not even to an allowed one
            assert Outcome(client, f"http://127.0.0.1:{server.port}/redirect").wait() == (302, b"moved")
        assert target.paths == []
        assert server.paths == ["/redirect", "/redirect"]


def test_only_the_listed_port_is_reachable(server):
    with client_for(f"127.0.0.1:{server.port + 1}, localhost") as client:
        error = Outcome(client, f"http://127.0.0.1:{server.port}/").wait()
        assert error == (f"port {server.port} of '127.0.0.1' is not on the server's http allow-list "
                         "(entries are host:port; a bare host admits 80 for http and 443 for https)")
        bare = Outcome(client, f"http://localhost:{server.port}/").wait()
        assert bare.startswith(f"port {server.port} of 'localhost' is not on")
    with client_for(f"127.0.0.1:{server.port}") as client:
        assert Outcome(client, f"http://127.0.0.1:{server.port}/ok").wait() == (200, b"secret of /ok")
    assert server.paths == ["/ok"]


def test_an_ipv6_target_is_named_in_brackets():
    try:
        server = Server("::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with running(server), client_for(f"[::1]:{server.port}") as client:
        assert Outcome(client, f"http://[0:0::1]:{server.port}/six").wait() == (200, b"secret of /six")
        assert Outcome(client, f"http://[::1]:{server.port + 1}/").wait().startswith(f"port {server.port + 1} of '[::1]'")
    assert server.paths == ["/six"]


def test_userinfo_odd_urls_and_bad_headers_are_refused_before_any_connection(server):
    with client_for(f"127.0.0.1:{server.port}") as client:
        assert "user info" in Outcome(client, f"http://127.0.0.1:{server.port}@evil.example/").wait()
        assert "user info" in Outcome(client, f"http://x@127.0.0.1:{server.port}/").wait()
        assert "backslashes" in Outcome(client, f"http://127.0.0.1:{server.port}\\@evil.example/").wait()
        injected = Outcome(client, f"http://127.0.0.1:{server.port}/", headers=["X-A: 1\r\nX-B: 2"]).wait()
        assert injected == "header 'X-A: 1\\r\\nX-B: 2' is not a 'Name: value' line"
    assert server.paths == []


@pytest.mark.parametrize("header", ["Host: intranet.example", "host :intranet.example", "Content-Length: 0",
                                    "Transfer-Encoding: chunked", "Connection: Upgrade", "Upgrade: websocket",
                                    "Keep-Alive: timeout=600", "TE: trailers"])
def test_an_inferlet_cannot_set_the_host_or_how_its_request_is_framed(server, header):
    """Refused before any connection, with the reason the inferlet's future fails with; a fetch beside it
    with headers of its own is sent, with the Host of the target the allow-list checked."""
    url = f"http://127.0.0.1:{server.port}/host"
    with client_for(f"127.0.0.1:{server.port}") as client:
        name = header.partition(":")[0].strip()
        assert Outcome(client, url, headers=["X-Mine: 1", header]).wait() == (
            f"header {name!r} is set by oven, not by an inferlet")
        assert Outcome(client, url, headers=["X-Mine: 1"]).wait() == (200, f"127.0.0.1:{server.port}".encode())
    assert server.paths == ["/host"]


@pytest.mark.parametrize("path", ["/trickle-headers", "/trickle-body"])
def test_a_trickling_server_is_cut_at_the_total_deadline(server, path):
    """Every socket read gets a byte within 50 ms, so only a deadline on the whole fetch ends it."""
    with client_for(f"127.0.0.1:{server.port}", timeout_s=0.5) as client:
        error = Outcome(client, f"http://127.0.0.1:{server.port}{path}").wait()
    assert error == "no complete response within 0.5 s (oven serve --http-timeout-s)"


def test_a_response_body_past_the_cap_fails_the_fetch(server):
    with client_for(f"127.0.0.1:{server.port}", max_body_bytes=1000) as client:
        assert Outcome(client, f"http://127.0.0.1:{server.port}/big?n=1000").wait() == (200, b"x" * 1000)
        error = Outcome(client, f"http://127.0.0.1:{server.port}/big?n=1001").wait()
    assert error == "the response body exceeds 1000 bytes (oven serve --http-max-body-mib)"


def test_a_flood_from_one_instance_leaves_workers_for_another(server):
    url = f"http://127.0.0.1:{server.port}"
    with client_for(url.removeprefix("http://"), per_instance=2, workers=8) as client:
        flood = [Outcome(client, f"{url}/hold", owner="a") for _ in range(20)]
        server.wait_holding(2)
        assert Outcome(client, f"{url}/quick", owner="b").wait() == (200, b"secret of /quick")
        assert not any(o.done.is_set() for o in flood)  # b finished while every one of a's waits
        assert server.paths.count("/hold") == 2
        server.release.set()
        assert [o.wait() for o in flood] == [(200, b"held")] * 20
    assert server.max_holding == 2


def test_one_clients_instances_leave_half_the_workers_to_others(server):
    """A client's instances together hold at most half the workers, whatever their number; its queued
    fetches go on as its running ones end, another instance's of it too."""
    url = f"http://127.0.0.1:{server.port}"
    with client_for(url.removeprefix("http://"), per_instance=2, workers=4) as client:
        flood = [Outcome(client, f"{url}/hold", owner=f"m{i}", of="mallory") for i in range(4) for _ in range(2)]
        server.wait_holding(2)  # half of 4 workers, though its 4 instances may have 2 each
        assert Outcome(client, f"{url}/quick", owner="a", of="alice").wait() == (200, b"secret of /quick")
        assert server.paths.count("/hold") == 2
        server.release.set()
        assert [o.wait() for o in flood] == [(200, b"held")] * 8
    assert server.max_holding == 2


def test_an_instance_queue_is_bounded(server):
    url = f"http://127.0.0.1:{server.port}/hold"
    with client_for(f"127.0.0.1:{server.port}", per_instance=1, queue_per_instance=1) as client:
        running_one, queued_one = Outcome(client, url), Outcome(client, url)
        assert Outcome(client, url).wait() == ("too many http fetches: this instance has 1 in flight and 1 queued "
                                               "(oven serve --http-queue-per-instance)")
        server.release.set()
        assert running_one.wait() == queued_one.wait() == (200, b"held")


def test_forgetting_an_instance_drops_its_queue_and_frees_its_worker(server):
    url = f"http://127.0.0.1:{server.port}"
    with client_for(url.removeprefix("http://"), per_instance=1, workers=1) as client:
        gone = [Outcome(client, f"{url}/hold", owner="a") for _ in range(3)]
        server.wait_holding(1)
        client.forget("a")  # its running fetch is cut, so the only worker is free for b
        assert Outcome(client, f"{url}/quick", owner="b").wait() == (200, b"secret of /quick")
    assert server.paths == ["/hold", "/quick"]  # a's two queued fetches never left
    assert not any(o.done.is_set() for o in gone)
