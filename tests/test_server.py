"""A real inference process over ZeroMQ: per-item errors, malformed messages, idle notices."""

from __future__ import annotations

import time
from unittest.mock import ANY

import msgpack
import pytest
import zmq

from oven.control.inference_client import InferenceError
from oven.control.inference_process import start_inference_process
from oven.proto.endpoints import private_endpoint
from oven.control.tokenizer import Tokenizer
from oven.inference.config import InferenceConfig
from oven.proto import inference as p
from oven.proto.auth import secure_client

NUM_PAGES, NUM_EMBEDS, NUM_HOST = 32, 256, 8


@pytest.fixture(scope="module")
def server():
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=NUM_PAGES,
                             num_embeds=NUM_EMBEDS, num_host_pages=NUM_HOST, max_batch_tokens=256,
                             torch_threads=1)
    with start_inference_process(config, timeout_s=120) as process:
        yield process


@pytest.fixture
def client(server):
    with server.client() as c:
        c.timeout_s = 60
        yield c


def good_item(top_k=3) -> p.ForwardTextItem:
    return p.ForwardTextItem([10, 11, 12], [0, 1, 2], [0], 3, [2], top_k=top_k)


def test_info_describes_model_and_tokenizer(client):
    info = client.info()
    assert (info.model_name, info.page_size, info.num_kv_pages) == ("tiny", 16, NUM_PAGES)
    assert (info.num_embeds, info.num_host_pages, info.attention_backend) == (NUM_EMBEDS, NUM_HOST, "torch")
    assert p.TRAIT_FORWARD_TEXT in info.traits and p.TRAIT_KVPAGE_HOST_TIER in info.traits
    tok = Tokenizer(info.tokenizer)
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.token_to_id("<|im_end|>") in tok.stop_token_ids


def test_bad_items_fail_alone(client):
    alone = client.call(p.ForwardTextRequest([good_item()]))
    bad = [
        (p.ForwardTextItem([10], [0], [NUM_PAGES], 1, [0]), p.ERR_BAD_PAGE),
        (p.ForwardTextItem([10], [0], [], 1, [0]), p.ERR_BAD_PAGE),
        (p.ForwardTextItem([10, 11], [0, 1], [1, 1], 2, [0]), p.ERR_BAD_PAGE),
        (p.ForwardTextItem([10], [10**9], [1], 1, [0]), p.ERR_BAD_POSITION),
        (p.ForwardTextItem([-1], [0], [1], 1, [0]), p.ERR_BAD_TOKEN),
        (p.ForwardTextItem([10, 11], [0], [1], 2, [0]), p.ERR_BAD_ARGUMENT),
        (p.ForwardTextItem([10], [0], [1], 0, [0]), p.ERR_BAD_ARGUMENT),
        (p.ForwardTextItem([10, 11, 12], [0, 1, 2], [1], 2, [0]), p.ERR_BAD_ARGUMENT),
        (p.ForwardTextItem([10], [0], [1], 1, [1]), p.ERR_BAD_ARGUMENT),
        (p.ForwardTextItem([10], [0], [1], 1, [0], top_k=10**6), p.ERR_BAD_ARGUMENT),
        (p.ForwardTextItem([10], [0], [1], 1, [0], attention_mask=[b"\x80", b"\x80"]), p.ERR_BAD_ARGUMENT),
    ]
    reply = client.call(p.ForwardTextRequest([item for item, _ in bad] + [good_item()]))
    assert [e.code for e in reply.errors[:-1]] == [code for _, code in bad]
    assert all(d is None for d in reply.dists[:-1])
    assert reply.errors[-1] is None and reply.dists[-1] == alone.dists[0]


def test_unknown_and_unwritten_embeds(client):
    reply = client.call(p.NextDistRequest([p.NextDistItem(NUM_EMBEDS), p.NextDistItem(NUM_EMBEDS - 1)]))
    assert [e.code for e in reply.errors] == [p.ERR_BAD_EMBED] * 2
    assert "never written" in reply.errors[1].message
    reply = client.call(p.ForwardRequest([p.ForwardItem([2], 1, [NUM_EMBEDS - 2], [0], [0])]))
    assert reply.errors[0].code == p.ERR_BAD_EMBED
    reply = client.call(p.EmbedTextRequest([p.EmbedTextItem([1], [0], [NUM_EMBEDS]),
                                            p.EmbedTextItem([1, 2], [0, 1], [0, 1])]))
    assert reply.errors[0].code == p.ERR_BAD_EMBED and reply.errors[1] is None


def test_page_management_errors(client):
    reply = client.call(p.RestoreRequest([p.RestoreItem(0, 0), p.RestoreItem(NUM_HOST, 0)]))
    assert [e.code for e in reply.errors] == [p.ERR_BAD_PAGE, p.ERR_BAD_PAGE]
    assert "holds no offloaded page" in reply.errors[0].message
    reply = client.call(p.OffloadRequest([p.OffloadItem(NUM_PAGES, 0), p.OffloadItem(3, 1)]))
    assert reply.errors[0].code == p.ERR_BAD_PAGE and reply.errors[1] is None
    reply = client.call(p.CopyKvPageRequest([p.CopyKvPageItem(0, 1, 10, 0, 7), p.CopyKvPageItem(0, 1, 0, 0, 16)]))
    assert reply.errors[0].code == p.ERR_BAD_ARGUMENT and reply.errors[1] is None
    reply = client.call(p.MaskKvPageRequest([p.MaskKvPageItem(0, [True]), p.MaskKvPageItem(-1, [False] * 16)]))
    assert [e.code for e in reply.errors] == [p.ERR_BAD_ARGUMENT, p.ERR_BAD_PAGE]


@pytest.mark.parametrize("payload, request_id, code", [
    (b"\xc1 not msgpack", 0, "malformed"),  # no request id to read: 0
    (msgpack.packb([p.PROTOCOL_VERSION + 1, "forward", 5, [[]]]), 5, "malformed"),
    (msgpack.packb([p.PROTOCOL_VERSION, "no_such_call", 5, []]), 5, "malformed"),
    (msgpack.packb([p.PROTOCOL_VERSION, "forward", 5, [[[["x"], 1, [], [], [], None]]]]), 5, "malformed"),
    (p.CODEC.encode(p.IdleNotice(0), 5), 5, "not_a_request"),
])
def test_malformed_messages_get_error_replies(client, payload, request_id, code):
    client.send_raw(payload)
    assert client.recv() == (request_id, p.ErrorReply(code, ANY))
    assert client.call(p.ForwardTextRequest([good_item()])).errors == [None]


def test_oversized_batch_is_rejected_whole(client):
    item = p.ForwardTextItem(list(range(200)), list(range(200)), list(range(13)), 8, [199])
    too_many_tokens = r"batch of 400 tokens exceeds the limit of 256 \(max_batch_tokens\)"
    with pytest.raises(InferenceError, match=too_many_tokens) as info:
        client.call(p.ForwardTextRequest([item, item]))
    assert info.value.code == "batch_too_large"
    assert client.call(p.ForwardTextRequest([item])).errors == [None]


def test_every_batch_type_has_the_item_limit(client):
    """Page management, too: 513 copies were run before, with no limit at all."""
    with pytest.raises(InferenceError, match=r"batch of 513 items exceeds the limit of 512 \(max_batch_items\)"):
        client.call(p.CopyKvPageRequest([p.CopyKvPageItem(0, 1, 0, 0, 1)] * 513))


def test_a_huge_batch_is_refused_before_its_items_are_decoded(client):
    """2M items are refused from the message's head (decoding them alone takes seconds, validating them more),
    and the server answers the next request."""
    item = [[10], [0], [0], 1, [0], 0, None]  # a ForwardTextItem on the wire
    payload = msgpack.packb([p.PROTOCOL_VERSION, "forward_text", 9, [[item] * 2_000_000]])
    started = time.perf_counter()
    client.send_raw(payload)
    request_id, reply = client.recv()
    print(f"2M items ({len(payload) >> 20} MiB) refused in {time.perf_counter() - started:.3f} s")
    assert (request_id, reply) == (9, p.ErrorReply("batch_too_large", "batch of 2000000 items exceeds the limit of "
                                                                      "512 (max_batch_items)"))
    assert client.call(p.ForwardTextRequest([good_item()])).errors == [None]


def test_idle_notice_follows_the_last_reply(server):
    """Replies come in order, and once the queue runs dry an idle notice follows the last one."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, server.token)  # the server admits the key of the process that started it alone
    sock.connect(server.config.endpoint)
    for request_id in (1, 2, 3):
        sock.send(p.CODEC.encode(p.ForwardTextRequest([good_item()]), request_id))
    seen = []
    while not (seen and seen[-1] == "idle" and "reply 3" in seen):
        assert sock.poll(60000), f"nothing more after {seen}"
        envelope = p.CODEC.decode(sock.recv())
        seen.append("idle" if isinstance(envelope.message, p.IdleNotice) else f"reply {envelope.request_id}")
    sock.close()
    assert [s for s in seen if s != "idle"] == ["reply 1", "reply 2", "reply 3"]


def test_client_keeps_replies_while_waiting_for_idle(client):
    request_ids = [client.send(p.ForwardTextRequest([good_item()])) for _ in range(2)]
    client.wait_idle(timeout_s=60)  # returns only after both replies and a later idle notice
    assert client.server_idle and client.num_idle_notices >= 1
    replies = [client.wait(rid, timeout_s=0) for rid in request_ids]  # kept: nothing is left to read
    assert all(r.errors == [None] for r in replies)


def test_req_socket_peer_and_health(server, client):
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, server.token)  # the server admits the key of the process that started it alone
    sock.connect(server.config.endpoint)
    sock.send(p.CODEC.encode(p.HealthRequest(), 9))
    assert sock.poll(30000)
    envelope = p.CODEC.decode(sock.recv())
    sock.close()
    assert envelope.request_id == 9 and envelope.message.ok
    health = client.call(p.HealthRequest())
    assert health.num_batches >= 1 and health.num_item_errors >= 1


def test_sigterm_stops_the_server_cleanly():
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=4, num_embeds=16, torch_threads=1)
    process = start_inference_process(config, timeout_s=120)
    assert process.stop() == 0


def test_the_timeline_keeps_the_last_batches_in_order_and_is_off_by_default(client):
    assert client.call(p.TimelineRequest()) == p.TimelineReply([], [], [], [], 0)  # the module's server: off
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=NUM_PAGES, torch_threads=1,
                             timeline_batches=3)
    with start_inference_process(config, timeout_s=120) as process, process.client() as timed:
        timed.call(p.ForwardTextRequest([good_item(), good_item()]))
        for _ in range(3):
            timed.call(p.CopyKvPageRequest([p.CopyKvPageItem(0, 1, 0, 0, 1)]))
        timed.call(p.HealthRequest())  # not a batch: not on the timeline
        timeline = timed.call(p.TimelineRequest(clear=True))
        assert (timeline.call_types, timeline.num_items, timeline.capacity) == (["copy_kvpage"] * 3, [1] * 3, 3)
        spans = list(zip(timeline.starts_ns, timeline.ends_ns))
        assert all(start <= end for start, end in spans)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))  # one at a time
        timed.call(p.ForwardTextRequest([good_item()]))
        assert timed.call(p.TimelineRequest()).call_types == ["forward_text"]  # cleared before it


class GatedEngine:
    """An engine whose health checks wait for a gate: the server's threads are observed without a model."""

    def __init__(self):
        import threading
        self.gate, self.started, self.num_batches = threading.Event(), threading.Event(), 0
        self.handlers = {p.HealthRequest: None}

    def check_batch_size(self, num_items: int, request=None) -> None:
        pass

    def llg_tokenizer(self):  # each connection's decoders are given it; no grammar reaches this engine
        raise AssertionError("no grammars here")

    def handle(self, request, futures=None):
        self.started.set()
        assert self.gate.wait(60)
        self.num_batches += 1
        return p.HealthReply(True, 0.0, self.num_batches, 0, 0)


def test_the_wire_thread_answers_and_decodes_while_a_batch_runs():
    """The device thread runs requests in arrival order; the wire thread meanwhile refuses a malformed
    message at once and queues the next request, and the idle notice comes after the last reply."""
    import threading

    from oven.inference.server import InferenceServer

    server, engine = InferenceServer(private_endpoint()), GatedEngine()
    device = threading.Thread(target=server.serve_forever, args=(engine, 20), daemon=True)
    device.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.endpoint)

    def receive():
        assert sock.poll(30000)
        envelope = p.CODEC.decode(sock.recv())
        return "idle" if isinstance(envelope.message, p.IdleNotice) else (envelope.request_id, envelope.message)
    try:
        sock.send(p.CODEC.encode(p.HealthRequest(), 1))
        assert engine.started.wait(30)  # request 1 holds the device thread
        sock.send(p.CODEC.encode(p.HealthRequest(), 2))
        sock.send(b"\xc1 not msgpack")
        assert receive() == (0, p.ErrorReply("malformed", ANY))  # answered while request 1 runs
        engine.gate.set()
        assert [receive(), receive(), receive()] == [(1, p.HealthReply(True, 0.0, 1, 0, 0)),
                                                     (2, p.HealthReply(True, 0.0, 2, 0, 0)), "idle"]
    finally:
        server.stop()
        device.join(10)
        sock.close()
    assert not device.is_alive()
