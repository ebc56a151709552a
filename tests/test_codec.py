from __future__ import annotations

import msgpack
import pytest

from oven.proto import inference as p
from oven.proto.codec import ProtocolError


def roundtrip(message, request_id=7):
    envelope = p.CODEC.decode(p.CODEC.encode(message, request_id))
    assert envelope.request_id == request_id
    return envelope.message


@pytest.mark.parametrize("message", [
    p.ForwardRequest([p.ForwardItem([1, 2], 3, [4, 5], [1], [9]), p.ForwardItem([0], 1, [2], [], [], [b"\x80"])]),
    p.ForwardTextRequest([p.ForwardTextItem([5, 6], [0, 1], [3], 2, [1], top_k=4)]),
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


def raw(*parts) -> bytes:
    return msgpack.packb(list(parts), use_bin_type=True)


@pytest.mark.parametrize("payload, fragment", [
    (b"\xc1garbage", "not a msgpack message"),
    (raw(1, "forward"), "envelope must be"),
    (raw(99, "forward", 1, [[]]), "protocol version 99"),
    (raw(1, "launch_missiles", 1, []), "unknown message tag"),
    (raw(1, "forward", -1, [[]]), "request_id"),
    (raw(1, "forward", 1, [[["x"], 1, [], [], []]]), "ForwardRequest.items[0]: expected ForwardItem"),
    (raw(1, "forward", 1, [[[["x"], 1, [], [], [], None]]]), "ForwardRequest.items[0].kv_page_ids"),
    (raw(1, "forward", 1, [[[[1], True, [], [], [], None]]]), "kv_last_page_len: expected int, got bool"),
    (raw(1, "mask_kvpage", 1, [[[1, [1, 0]]]]), "masked[0]: expected bool"),
    (raw(1, "next_dist", 1, [[[1, "5"]]]), "top_k: expected int, got str"),
    (raw(1, "forward", 1, {"items": []}), "expected ForwardRequest"),
    (raw(1, "forward", 1, [{"items": []}]), "ForwardRequest.items: expected a list, got dict"),
])
def test_malformed_messages_name_the_problem(payload, fragment):
    with pytest.raises(ProtocolError) as info:
        p.CODEC.decode(payload)
    assert fragment in str(info.value)


def test_peek_request_id_of_a_bad_message():
    assert p.CODEC.peek_request_id(raw(1, "nope", 42, [])) == 42
    assert p.CODEC.peek_request_id(b"\xc1") == 0


def test_unregistered_message_cannot_be_encoded():
    with pytest.raises(TypeError):
        p.CODEC.encode(p.ForwardItem([1], 1, [1], [], []))
