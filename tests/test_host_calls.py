"""Host imports called directly on a live instance: exports/imports, topics, http, program cache."""

from __future__ import annotations

import http.server
import threading

import pytest
from harness import seed_store
from wasmtime import component

from oven.client.paths import inferlets_dir
from oven.control.config import ControlConfig
from oven.control.inference_process import start_inference_process
from oven.proto.auth import OPERATOR
from oven.proto.endpoints import private_endpoint
from oven.control.runner import local
from oven.control.runtime import host
from oven.control.runtime.instance import State
from oven.control.runtime.loop import ControlLoop
from oven.control.runtime.programs import ProgramStore
from oven.inference.config import InferenceConfig


class _Handler(http.server.BaseHTTPRequestHandler):
    held: list[str] = []  # /hold requests seen; each answers once ``release`` is set
    lock, release = threading.Condition(), threading.Event()

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path != "/hold":
            return self.send_error(501)
        with self.lock:
            self.held.append(self.path)
            self.lock.notify_all()
        self.release.wait(30)
        self.send_response(200)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.end_headers()
        self.wfile.write(b"got " + body + b" " + self.headers["X-Tool"].encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def tool_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def loop(tmp_path_factory, tool_server):
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=32, num_embeds=64,
                             torch_threads=1)
    with start_inference_process(config, timeout_s=120) as process:
        control = ControlLoop(process.client(),
                              ControlConfig(program_dir=str(seed_store(tmp_path_factory.mktemp("p"), "echo")),
                                            http_allow=f"127.0.0.1:{tool_server.server_port}"), lambda *a: None)
        control.programs.add((inferlets_dir() / "echo" / "echo.wasm").read_bytes(), "echo")
        yield control
        control.close()


def call(inst, interface: str, name: str, *args):
    return host.INTERFACES[interface][name](inst, *args)


def idle_echo(loop, owner: str = OPERATOR):
    """An ``echo`` instance whose guest has made its one call (receive) and waits on it. Host calls made
    here then take the handles after the guest's, as its runner numbers them; made before the guest's
    first slice was applied (a loaded machine), they took its receive's handle and the instance failed
    ("receive: the runner gave the guest 1, the host made 2")."""
    inst = loop.launch("echo", [], owner=owner)
    assert loop.run_until(lambda: inst.state is State.WAITING, 30), (inst.state, inst.error)
    return inst


def take(loop, inst, handle: int, getter: str):
    """What the runner's getter would give the guest (its take-* read a table like the control side's)."""
    assert loop.run_until(lambda: inst.futures.ready([handle]), 30)
    return local.FUTURES[getter](inst, handle)


def test_export_import_shares_pages_with_refcounts(loop):
    a, b = idle_echo(loop), idle_echo(loop)
    pages = take(loop, a, call(a, "kvpages", "alloc-kvpages", 0, 2), "take-handles")
    physical = a.resources.physical_pages(pages)
    assert call(a, "kvpages", "export-kvpages", pages, "prefix") is None
    assert call(b, "kvpages", "export-kvpages", [], "prefix") == "export name 'prefix' is taken"
    imported = call(b, "kvpages", "import-kvpages", "prefix")
    assert b.resources.physical_pages(imported) == physical
    assert call(b, "kvpages", "import-kvpages", "nothing") == "no kvpage export named 'nothing'"
    take(loop, a, call(a, "kvpages", "dealloc-kvpages", 0, pages), "take-unit")
    assert all(loop.replicas[0].kv_pool.refcount(p) == 2 for p in physical)  # the export and b still hold them
    assert "only its exporter may release it" in call(b, "kvpages", "release-export", "prefix")
    loop.kill(b, "test over")
    assert call(a, "kvpages", "release-export", "prefix") is None
    assert all(loop.replicas[0].kv_pool.refcount(p) == 0 for p in physical)
    loop.kill(a, "test over")
    assert loop.replicas[0].kv_pool.num_free == 32


def test_broadcast_reaches_subscribers_only(loop):
    a, b, c = (idle_echo(loop) for _ in range(3))
    wait_a, wait_b = call(a, "messaging", "subscribe", "news"), call(b, "messaging", "subscribe", "sports")
    call(c, "messaging", "broadcast", "news", "hello")
    assert take(loop, a, wait_a, "take-text").payload == "hello"
    assert not b.futures.ready([wait_b])
    for inst in (a, b, c):
        loop.kill(inst, "test over")


def test_http_fetch_allow_list(loop, tool_server):
    inst = idle_echo(loop)
    url = f"http://127.0.0.1:{tool_server.server_port}/tool"
    response = take(loop, inst, call(inst, "http", "fetch", "POST", url, ["X-Tool: clock"], b"now"), "take-http")
    assert (response.status, bytes(response.body)) == (201, b"got now clock")
    unsupported = take(loop, inst, call(inst, "http", "fetch", "GET", url, [], b""), "take-http")
    assert unsupported.status == 501  # an error status is a response, not a failure
    denied = take(loop, inst, call(inst, "http", "fetch", "GET", "http://example.com/", [], b""), "take-http")
    assert denied == "host 'example.com' is not on the server's http allow-list (oven serve --http-allow)"
    other_port = f"http://127.0.0.1:{tool_server.server_port + 1}/tool"
    denied = take(loop, inst, call(inst, "http", "fetch", "GET", other_port, [], b""), "take-http")
    assert denied.startswith(f"port {tool_server.server_port + 1} of '127.0.0.1' is not on")
    loop.kill(inst, "test over")


def test_a_killed_instance_fetches_no_more(loop, tool_server):
    """Its queued fetches are dropped: only the two in flight (the default share) ever reach the server."""
    _Handler.held.clear()
    inst = idle_echo(loop)
    url = f"http://127.0.0.1:{tool_server.server_port}/hold"
    handles = [call(inst, "http", "fetch", "GET", url, [], b"") for _ in range(5)]
    with _Handler.lock:
        assert _Handler.lock.wait_for(lambda: len(_Handler.held) == 2, 30)
    loop.kill(inst, "test over")
    _Handler.release.set()
    survivor = idle_echo(loop)  # the killed instance's share of workers is back
    url = f"http://127.0.0.1:{tool_server.server_port}/"
    fetch = call(survivor, "http", "fetch", "POST", url, ["X-Tool: after"], b"kill")
    response = take(loop, survivor, fetch, "take-http")
    assert bytes(response.body) == b"got kill after"
    assert len(_Handler.held) == 2 and inst.futures.ready(handles) == []  # and none of its fetches called back
    loop.kill(survivor, "test over")


def test_warm_program_load_never_recompiles(loop, monkeypatch):
    digest = loop.programs.resolve("echo")
    fresh = ProgramStore(loop.programs.root, loop.engine)  # a new process would start like this

    def no_compile(*_args, **_kwargs):
        raise AssertionError("compiled again")
    monkeypatch.setattr(component.Component, "__init__", no_compile)
    assert fresh.component(digest) is not None
    assert fresh.resolve("echo") == digest  # names survive restarts too
