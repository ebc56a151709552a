"""Host imports called directly on a live instance: exports/imports, topics, http, program cache."""

from __future__ import annotations

import http.server
import threading

import pytest
from wasmtime import component

from oven.client.commands import INFERLETS_DIR
from oven.control.config import ControlConfig
from oven.control.inference_process import start_inference_process
from oven.proto.endpoints import private_endpoint
from oven.control.runtime import host
from oven.control.runtime.loop import ControlLoop
from oven.control.runtime.programs import ProgramStore
from oven.inference.config import InferenceConfig


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.end_headers()
        self.wfile.write(b"got " + body + b" " + self.headers["X-Tool"].encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=32, num_embeds=64,
                             torch_threads=1)
    with start_inference_process(config, timeout_s=120) as process:
        control = ControlLoop(process.client(), ControlConfig(program_dir=str(tmp_path_factory.mktemp("p")),
                                                              http_allow="127.0.0.1"), lambda *a: None)
        control.programs.add((INFERLETS_DIR / "echo" / "echo.wasm").read_bytes(), "echo")
        yield control
        control.close()


def call(inst, interface: str, name: str, *args):
    return host.INTERFACES[interface][name](inst, *args)


def take(loop, inst, handle: int, getter: str):
    assert loop.run_until(lambda: inst.futures.ready([handle]), 30)
    return call(inst, "futures", getter, handle)


def test_export_import_shares_pages_with_refcounts(loop):
    a, b = loop.launch("echo", []), loop.launch("echo", [])
    pages = take(loop, a, call(a, "kvpages", "alloc-kvpages", 0, 2), "take-handles")
    physical = a.resources.physical_pages(pages)
    assert call(a, "kvpages", "export-kvpages", pages, "prefix") is None
    assert call(b, "kvpages", "export-kvpages", [], "prefix") == "export name 'prefix' is taken"
    imported = call(b, "kvpages", "import-kvpages", "prefix")
    assert b.resources.physical_pages(imported) == physical
    assert call(b, "kvpages", "import-kvpages", "nothing") == "no kvpage export named 'nothing'"
    take(loop, a, call(a, "kvpages", "dealloc-kvpages", 0, pages), "take-unit")
    assert all(loop.kv_pool.refcount(p) == 2 for p in physical)  # the export and b still hold them
    assert "only its exporter may release it" in call(b, "kvpages", "release-export", "prefix")
    loop.kill(b, "test over")
    assert call(a, "kvpages", "release-export", "prefix") is None
    assert all(loop.kv_pool.refcount(p) == 0 for p in physical)
    loop.kill(a, "test over")
    assert loop.kv_pool.num_free == 32


def test_broadcast_reaches_subscribers_only(loop):
    a, b, c = (loop.launch("echo", []) for _ in range(3))
    wait_a, wait_b = call(a, "messaging", "subscribe", "news"), call(b, "messaging", "subscribe", "sports")
    call(c, "messaging", "broadcast", "news", "hello")
    assert take(loop, a, wait_a, "take-text").payload == "hello"
    assert not b.futures.ready([wait_b])
    for inst in (a, b, c):
        loop.kill(inst, "test over")


def test_http_fetch_allow_list(loop):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    inst = loop.launch("echo", [])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/tool"
        response = take(loop, inst, call(inst, "http", "fetch", "POST", url, ["X-Tool: clock"], b"now"), "take-http")
        assert (response.status, bytes(response.body)) == (201, b"got now clock")
        unsupported = take(loop, inst, call(inst, "http", "fetch", "GET", url, [], b""), "take-http")
        assert unsupported.status == 501  # an error status is a response, not a failure
        denied = take(loop, inst, call(inst, "http", "fetch", "GET", "http://example.com/", [], b""), "take-http")
        assert "allow-list" in denied
    finally:
        server.shutdown()
        loop.kill(inst, "test over")


def test_warm_program_load_never_recompiles(loop, monkeypatch):
    digest = loop.programs.resolve("echo")
    fresh = ProgramStore(loop.programs.root, loop.engine)  # a new process would start like this

    def no_compile(*_args, **_kwargs):
        raise AssertionError("compiled again")
    monkeypatch.setattr(component.Component, "__init__", no_compile)
    assert fresh.component(digest) is not None
    assert fresh.resolve("echo") == digest  # names survive restarts too
