from __future__ import annotations

import dataclasses
import re

import msgpack
import pytest

from oven.proto import control as c
from oven.proto import inference as p
from oven.proto.codec import Codec, Envelope, ProtocolError, _Reject


def roundtrip(message, request_id=7):
    envelope = p.CODEC.decode(p.CODEC.encode(message, request_id))
    assert envelope.request_id == request_id
    return envelope.message


@pytest.mark.parametrize("message", [
    p.ForwardRequest([p.ForwardItem([1, 2], 3, [4, 5], [1], [9]), p.ForwardItem([0], 1, [2], [], [], [b"\x80"])]),
    p.ForwardTextRequest([p.ForwardTextItem([5, 6], [0, 1], [3], 2, [1], top_k=4)]),
    p.ForwardTextRequest([p.ForwardTextItem([5, 6], [0, 1], [3], 2, [1], top_k=4, adapter_id=3)]),
    p.LoadAdapterRequest(1, "cml", "/adapters/cml"),
    p.MaskKvPageRequest([p.MaskKvPageItem(3, [True, False])]),
    p.NextDistReply([None, p.ItemError("bad_embed", "no")], [p.TopKDist(b"\x01\x00\x00\x00", b"\x00\x00\x80?"), None]),
    p.ForwardTextReply([None], [[p.TopKDist(b"", b"")]]),
    p.InfoRequest(),
    p.IdleNotice(3),
    p.HealthReply(True, 1.5, 2, 3, 0),
])
def test_roundtrip(message):
    assert roundtrip(message) == message


def test_float_fields_accept_ints():
    assert roundtrip(p.HealthReply(True, 2, 0, 0, 0)).uptime_s == 2.0


V = p.PROTOCOL_VERSION


def raw(*parts) -> bytes:
    return msgpack.packb(list(parts), use_bin_type=True)


@pytest.mark.parametrize("payload, fragment", [
    (b"\xc1garbage", "not a msgpack message"),
    (raw(V, "forward"), "envelope must be"),
    (raw(99, "forward", 1, [[]]), "protocol version 99"),
    (raw(V, "launch_missiles", 1, []), "unknown message tag"),
    (raw(V, "forward", -1, [[]]), "request_id"),
    (raw(V, "forward", 1, [[["x"], 1, [], [], []]]), "ForwardRequest.items[0]: expected ForwardItem"),
    (raw(V, "forward", 1, [[[["x"], 1, [], [], [], None, 0]]]), "ForwardRequest.items[0].kv_page_ids"),
    (raw(V, "forward", 1, [[[[1], True, [], [], [], None, 0]]]), "kv_last_page_len: expected int, got bool"),
    (raw(V, "forward", 1, [[[[1], 1, [], [], [], None, "lora"]]]), "adapter_id: expected int, got str"),
    (raw(V, "mask_kvpage", 1, [[[1, [1, 0]]]]), "masked[0]: expected bool"),
    (raw(V, "next_dist", 1, [[[1, "5"]]]), "top_k: expected int, got str"),
    (raw(V, "forward", 1, {"items": []}), "expected ForwardRequest"),
    (raw(V, "forward", 1, [{"items": []}]), "ForwardRequest.items: expected a list, got dict"),
])
def test_malformed_messages_name_the_problem(payload, fragment):
    with pytest.raises(ProtocolError, match=re.escape(fragment)):
        p.CODEC.decode(payload)


def test_peek_request_id_of_a_bad_message():
    assert p.CODEC.peek_request_id(raw(V, "nope", 42, [])) == 42
    assert p.CODEC.peek_request_id(b"\xc1") == 0


def test_peek_list_length_reads_only_the_head():
    items = [p.NextDistItem(i) for i in range(1000)]
    payload = p.CODEC.encode(p.NextDistRequest(items), 42)
    assert p.CODEC.peek_list_length(payload, "items") == (42, p.NextDistRequest, 1000)
    truncated = payload[:len(payload) // 2]  # the items are never read: a cut-off body still has its head
    assert p.CODEC.peek_list_length(truncated, "items") == (42, p.NextDistRequest, 1000)
    assert p.CODEC.peek_list_length(p.CODEC.encode(p.NextDistReply([None], [None]), 1), "dists") == (
        1, p.NextDistReply, 1)  # a field after others: those are skipped, not decoded


@pytest.mark.parametrize("payload", [
    b"\xc1garbage", raw(V, "forward"), raw(99, "forward", 1, [[]]), raw(V, "launch_missiles", 1, [[]]),
    raw(V, "forward", -1, [[]]), raw(V, "forward", 1, {"items": []}), raw(V, "forward", 1, [{"items": []}]),
    raw(V, "forward", 1, [[], []]), raw(V, "info", 1, []),
])
def test_peek_list_length_leaves_a_malformed_head_to_decode(payload):
    assert p.CODEC.peek_list_length(payload, "items") is None


def test_unregistered_message_cannot_be_encoded():
    with pytest.raises(TypeError, match="ForwardItem is not a registered message"):
        p.CODEC.encode(p.ForwardItem([1], 1, [1], [], []))


# -- compiled encoder/decoder vs the hint walker ---------------------------

ERR = p.ItemError(p.ERR_BAD_PAGE, "no")
DIST = p.TopKDist(b"\x01\x00\x00\x00", b"\x00\x00\x80?")
TOKENIZER = p.TokenizerSpec("{}", "", "<s>", "</s>", [2])
INFO = p.InfoReply("m", "llama", 10, 8, 2, 64, "cpu", "float32", "sdpa", 16, 4, 4, 0, 8, 64, 20, ["forward"], TOKENIZER)
ADAPTER = p.AdapterInfo(1, "cml", 8, 16.0, 2.0, ["q_proj", "v_proj"], 1024)
ENTRIES = [c.InstanceEntry("i-1", "prog", "ready", 1.25, None, "", "alice"),
           c.InstanceEntry("i-2", "prog", "finished", 3.0, 0, "boom", "operator")]

# Captured from the codec before it compiled its hints: the wire format must not move. (Since then
# ForwardTextItem gained adapter_id and InfoReply max_adapters and adapters: the trailing fields; the
# inference protocol is at version 6 (5: token futures, ForwardTextItem's token_futures and sample,
# ForwardTextReply's sampled; 6: shaping, ForwardTextReply's logprobs: the trailing fields), the control
# protocol at 5: the second byte.)
GOLDEN = [
    (p.CODEC, p.ForwardTextRequest([p.ForwardTextItem([5], [100], [1, 2, 3, 4, 5, 6, 7], 12, [0], top_k=4),
                                    p.ForwardTextItem([5, 6], [0, 1], [3], 2, [1], 0, [b"\xff"])]), 7,
     "9406ac666f72776172645f746578740791929a9105916497010203040506070c910004c000c0c09a92050692000191030291010091c401ff00c0c0"),
    (p.CODEC, p.ForwardTextReply([None, ERR], [[DIST, DIST], None]), 8,
     ("9406b2666f72776172645f746578745f7265706c79089492c092a86261645f70616765a26e6f929292c40401000000c404000080"
      "3f92c40401000000c4040000803fc09090")),
    (p.CODEC, p.NextDistReply([ERR, None], [None, DIST]), 9,
     "9406af6e6578745f646973745f7265706c7909929292a86261645f70616765a26e6fc092c092c40401000000c4040000803f"),
    (p.CODEC, p.AckReply([None, ERR]), 2**64 - 1,
     "9406a361636bcfffffffffffffffff9192c092a86261645f70616765a26e6f"),
    (p.CODEC, p.HealthReply(True, 2, 0, 1, 0), 0, "9406ac6865616c74685f7265706c790095c302000100"),
    (p.CODEC, INFO, 1,
     ("9406aa696e666f5f7265706c7901dc0014a16da56c6c616d610a080240a3637075a7666c6f61743332a4736470611004040008"
      "401491a7666f727761726495a27b7da0a33c733ea43c2f733e91020090")),
    # A dataclass where an int belongs: the walker always sent it as a nested array.
    (p.CODEC, p.IdleNotice(DIST), 0, "9406a469646c65009192c40401000000c4040000803f"),
    # Control protocol 2 (authenticated clients; instances carry their owner), 3 (adapters), 4 (max_context),
    # 5 (InstanceEntry.cpu_s), 6 (InstanceEntry.replica), 7 (Metrics), now 8 (InstanceEntry.parent, the
    # trailing field; the second byte).
    (c.CODEC, c.InstanceList(ENTRIES), 3,
     ("9408ad696e7374616e63655f6c6973740391929aa3692d31a470726f67a57265616479cb3ff4000000000000c0a0a5616c696365"
      "cb000000000000000000a09aa3692d32a470726f67a866696e6973686564cb400800000000000000a4626f6f6da86f70657261746f72"
      "cb000000000000000000a0")),
    (c.CODEC, c.Launch("prog", ["--x"], detach=True), 4, "9408a66c61756e63680493a470726f6791a32d2d78c3"),
    (c.CODEC, c.Ok(), 5, "9408a26f6b0590"),
]


@pytest.mark.parametrize("codec, message, request_id, wire", GOLDEN)
def test_encoding_is_unchanged(codec, message, request_id, wire):
    assert codec.encode(message, request_id).hex() == wire


BROAD = [
    (p.CODEC, p.EmbedTextRequest([p.EmbedTextItem([1, 2], [0, 1], [7, 8])])),
    (p.CODEC, p.ForwardRequest([p.ForwardItem([1, 2], 3, [4, 5], [1], [9]), p.ForwardItem([0], 1, [2], [], [], [b""])])),
    (p.CODEC, p.NextDistRequest([p.NextDistItem(3), p.NextDistItem(4, 50)])),
    (p.CODEC, p.ForwardTextRequest([p.ForwardTextItem([5], [100], list(range(7)), 7, [0], 20, [b"\xff"], 2)])),
    (p.CODEC, p.CopyKvPageRequest([p.CopyKvPageItem(1, 2, 0, 3, 4)])),
    (p.CODEC, p.MaskKvPageRequest([p.MaskKvPageItem(3, [True, False]), p.MaskKvPageItem(4, [])])),
    (p.CODEC, p.OffloadRequest([p.OffloadItem(1, 2)])),
    (p.CODEC, p.RestoreRequest([])),
    (p.CODEC, p.HealthRequest()),
    (p.CODEC, p.AckReply([None, ERR])),
    (p.CODEC, p.NextDistReply([None, ERR], [DIST, None])),
    (p.CODEC, p.ForwardTextReply([None, ERR, None], [[DIST, DIST], None, []])),
    (p.CODEC, INFO),
    (p.CODEC, p.InfoReply(*dataclasses.astuple(INFO)[:16], ["forward"], TOKENIZER, 4, [ADAPTER])),
    (p.CODEC, p.LoadAdapterRequest(1, "cml", "/adapters/cml")),
    (p.CODEC, p.UnloadAdapterRequest("cml")),
    (p.CODEC, p.AdapterReply(ADAPTER)),
    (p.CODEC, p.HealthReply(False, 0.25, 1, 2, 3)),
    (p.CODEC, p.ErrorReply("malformed", "bad")),
    (c.CODEC, c.UploadChunk("prog", "ab" * 32, 10, 0, b"\x00asm")),
    (c.CODEC, c.ListAdapters()),
    (c.CODEC, c.AddAdapter("cml", "/adapters/cml")),
    (c.CODEC, c.RemoveAdapter("cml")),
    (c.CODEC, c.AdapterList([c.AdapterEntry("cml", 1, "loaded", "", True, 8, ["q_proj"], 1024),
                             c.AdapterEntry("bad", 2, "failed", "too big", False, 0, [], 0)])),
    (c.CODEC, c.UploadReply("ab", 10, False)),
    (c.CODEC, c.ProgramList([c.ProgramEntry("cd", ["a", "b"], 123)])),
    (c.CODEC, c.Launch("prog", [])),
    (c.CODEC, c.InstanceList(ENTRIES)),
    (c.CODEC, c.ServerInfoReply(["m"], ["forward"], 16, 100, 50, "cpu", "fcfs", 2, 10.0, "0123abcd", "alice")),
    (c.CODEC, c.ServerInfoReply(["m"], ["forward"], 16, 100, 50, "cpu", "fcfs", 2, 10.0, "0123abcd", "alice", 8192,
                                64, 4096)),
    (c.CODEC, c.Metrics()),
    (c.CODEC, c.MetricsReply('# TYPE oven:batches counter\noven:batches_total 3.0\n')),
    (c.CODEC, c.StatsReply(1, 2, 3, 4, 1.5, 6, 7, 8, 9, 10, 11)),
    (c.CODEC, c.StatsReply(1, 2, 3, 4, 1.5, 6, 7, 8, 9, 10, 11, "infercept",
                           c.InterceptionProfile(1.2e-3, 2e-4, 64, True, False, True), 12.5, 0.5, 300.0, 120.0, 2)),
    (c.CODEC, c.InstanceEvent("i-1", "exit", "", 0)),
    (c.CODEC, c.InstanceEvent("i-1", "stdout", "hi")),
]


def test_valid_messages_decode_without_the_walker(monkeypatch):
    encoded = [(codec, message, codec.encode(message, 11)) for codec, message in BROAD]

    def walker(*_):
        raise AssertionError("a valid message took the slow path")

    monkeypatch.setattr(Codec, "_from_wire", walker)
    for codec, message, payload in encoded:
        assert codec.decode(payload) == Envelope(11, message)


_DROP = object()


def _mutations(body):
    """``body`` with each node in turn replaced by a value of another shape, or dropped from its list."""
    def paths(value, path=()):
        yield path
        if isinstance(value, list):
            for i, item in enumerate(value):
                yield from paths(item, path + (i,))

    def rebuilt(value, path, new):
        if not path:
            return new
        copy = list(value)
        if new is _DROP and len(path) == 1:
            del copy[path[0]]
        else:
            copy[path[0]] = rebuilt(value[path[0]], path[1:], new)
        return copy

    for path in paths(body):
        for new in (None, True, 1, 1.5, "s", b"b", [], [1], [None], {}, _DROP):
            if path or new is not _DROP:
                yield rebuilt(body, path, new)


def test_compiled_decoder_agrees_with_the_walker():
    """On every single-node corruption of every message, the compiled decoder accepts
    exactly when the hint walker does, and builds the same message (repr tells 2 from 2.0)."""
    checked = accepted = 0
    for codec, message in BROAD + [(codec, message) for codec, message, _, _ in GOLDEN]:
        cls = type(message)
        body = msgpack.unpackb(codec.encode(message, 1))[3]
        for corrupted in _mutations(body):
            try:
                fast = repr(codec._decoders[cls](corrupted))
            except _Reject:
                fast = None
            try:
                slow = repr(codec._from_wire(corrupted, cls, cls.__name__))
            except ProtocolError:
                slow = None
            assert fast == slow, corrupted
            checked += 1
            accepted += fast is not None
    assert checked > 3000 and accepted > 300, (checked, accepted)
