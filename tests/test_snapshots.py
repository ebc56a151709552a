"""Named KV snapshots (resources/exports.py, the kvpages host calls): a client's pages with the tokens
they hold, opened read-only, matched by prefix, capped, invisible to other clients.

The host calls are made directly on live ``echo`` instances (as tests/test_host_calls.py does), so
each case checks exactly one rule; ``prefix-cache --snapshot`` then drives them through the Python
SDK (``Context.from_prefix`` and ``snapshot``) against the inference process's own greedy decoding.
The SDKs' agreement is tests/test_sdk_conformance.py's ``snapshot`` scenario.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import assert_pools_full, built, direct_greedy, messages, run
from test_host_calls import call, idle_echo, take
from oven.control.runtime.programs import LIBRARY
from oven.control.tokenizer import Tokenizer

PROGRAMS = []  # stored below, in the library: every client runs them
LOOP_CONFIG = {"max_snapshots_per_client": 3, "max_snapshot_pages_per_client": 6}
PREFIX = ("You are a careful assistant. Answer briefly, cite nothing, and never repeat the question; "
          "this system prompt spans two pages and part of a third.")
SUFFIXES = ["User: what is a page?", "User: name a colour."]
MAX_NEW = 5
TOKENS = list(range(1000, 1040))  # 40 tokens: two full pages of 16 and 8 in a third


@pytest.fixture(scope="module", autouse=True)
def library(loop):
    for name in ("echo", "prefix-cache"):
        loop.programs.add(built(name), name, namespace=LIBRARY)


def echo(loop, owner: str = "alice"):
    """A live echo instance of ``owner`` (another client than the operator) to make host calls on."""
    return idle_echo(loop, owner)


def alloc(loop, inst, n: int) -> list[int]:
    pages = take(loop, inst, call(inst, "kvpages", "alloc-kvpages", 0, n), "take-handles")
    assert isinstance(pages, list), (pages, inst.state, inst.error)
    return pages


def forward(loop, inst, tokens: list[int], start: int, pages: list[int], top_k: int = 0):
    """Forward ``tokens`` at positions ``start``.. into ``pages``; the distribution after the last
    (or the error)."""
    ps = loop.info.page_size
    end = start + len(tokens)
    fut = call(inst, "forward", "forward-text", 0, tokens, list(range(start, end)), pages, end - (len(pages) - 1) * ps,
               [len(tokens) - 1] if top_k else [], top_k, 0)
    return take(loop, inst, fut, "take-dists")


def saved(loop, inst, tokens: list[int], name: str) -> list[int]:
    """Pages of ``inst`` holding ``tokens``, saved as snapshot ``name``."""
    pages = alloc(loop, inst, -(-len(tokens) // loop.info.page_size))
    forward(loop, inst, tokens, 0, pages)
    assert call(inst, "kvpages", "save-snapshot", pages, tokens, name) is None
    return pages


def end(loop, *instances) -> None:
    for inst in instances:
        loop.kill(inst, "test over")


def test_a_reused_snapshot_gives_the_logits_of_a_fresh_prefill(loop):
    ps = loop.info.page_size
    maker, reader, fresh = (echo(loop) for _ in range(3))
    saved(loop, maker, TOKENS, "forty")
    end(loop, maker)  # the snapshot outlives its maker
    prompt = TOKENS + [7, 8, 9]
    assert call(reader, "kvpages", "match-snapshot", prompt) == "forty"
    assert call(reader, "kvpages", "snapshot-tokens", "forty") == TOKENS
    opened = call(reader, "kvpages", "open-snapshot", "forty")
    # The partial last page is copied into a page of the reader's own before the reader writes past it.
    (own,) = alloc(loop, reader, 1)
    take(loop, reader, call(reader, "kvpages", "copy-kvpage", 0, opened[2], own, 0, 0, len(TOKENS) - 2 * ps),
         "take-unit")
    (reused,) = forward(loop, reader, prompt[len(TOKENS):], len(TOKENS), opened[:2] + [own], top_k=50)
    (direct,) = forward(loop, fresh, prompt, 0, alloc(loop, fresh, 3), top_k=50)
    assert list(getattr(reused, "token-ids")) == list(getattr(direct, "token-ids"))
    np.testing.assert_allclose(reused.probs, direct.probs, rtol=1e-5, atol=0)
    # ... and not what a context that differs in one snapshot token gives (the comparison can fail).
    other = echo(loop)
    (changed,) = forward(loop, other, [TOKENS[0] + 1] + prompt[1:], 0, alloc(loop, other, 3), top_k=50)
    assert not np.allclose(changed.probs, direct.probs, rtol=1e-5, atol=0)
    assert call(reader, "kvpages", "drop-snapshot", "forty") is None
    end(loop, reader, fresh, other)
    assert_pools_full(loop)


def test_snapshot_pages_are_read_only_for_everyone(loop):
    ps = loop.info.page_size
    maker, reader = (echo(loop) for _ in range(2))
    pages = saved(loop, maker, TOKENS, "ro")
    opened = call(reader, "kvpages", "open-snapshot", "ro")
    refused = "a kvpage of a snapshot is read-only: copy it into a page of your own before writing"
    for inst, held in ((maker, pages), (reader, opened)):  # writing the next slot of the partial last page
        assert forward(loop, inst, [5], len(TOKENS), held).startswith(refused)
        fut = call(inst, "kvpages", "mask-kvpage", 0, held[0], [True] * ps)
        assert take(loop, inst, fut, "take-unit").startswith(refused)
        (own,) = alloc(loop, inst, 1)
        fut = call(inst, "kvpages", "copy-kvpage", 0, own, held[1], 0, 0, 1)
        assert take(loop, inst, fut, "take-unit").startswith(refused)
        assert take(loop, inst, call(inst, "kvpages", "copy-kvpage", 0, held[1], own, 0, 0, ps), "take-unit") is None
    # A forward that only reads the snapshot's pages (its input goes to a page of its own) is fine.
    (own,) = alloc(loop, reader, 1)
    assert forward(loop, reader, [5], 3 * ps, opened + [own]) == []
    assert "is a snapshot: drop it with drop-snapshot" in call(maker, "kvpages", "release-export", "ro")
    assert call(reader, "kvpages", "drop-snapshot", "ro") is None
    end(loop, maker, reader)
    assert_pools_full(loop)


def test_another_client_can_neither_see_nor_open_nor_drop_a_snapshot(loop):
    alice, bob = echo(loop), echo(loop, "bob")
    saved(loop, alice, TOKENS, "mine")
    assert call(bob, "kvpages", "match-snapshot", TOKENS) == ""
    for name in ("open-snapshot", "snapshot-tokens", "drop-snapshot"):
        assert call(bob, "kvpages", name, "mine") == "no snapshot named 'mine'"
    assert call(bob, "kvpages", "import-kvpages", "mine") == "no kvpage export named 'mine'"
    saved(loop, bob, TOKENS, "mine")  # bob's own, under the same name
    assert call(alice, "kvpages", "drop-snapshot", "mine") is None
    assert call(bob, "kvpages", "match-snapshot", TOKENS) == "mine"
    assert call(bob, "kvpages", "drop-snapshot", "mine") is None
    end(loop, alice, bob)
    assert_pools_full(loop)


def test_the_prefix_index_finds_the_longest_match(loop):
    inst = echo(loop)
    saved(loop, inst, TOKENS[:20], "short")
    saved(loop, inst, TOKENS[:16] + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "fork")
    assert call(inst, "kvpages", "match-snapshot", TOKENS) == "short"  # 20 tokens against 16
    assert call(inst, "kvpages", "match-snapshot", TOKENS[:16] + [1, 2]) == "fork"  # 18 against 16
    assert call(inst, "kvpages", "match-snapshot", TOKENS[:10]) == "short"  # tied at 10: the older
    assert call(inst, "kvpages", "match-snapshot", [5] + TOKENS) == ""
    for name in ("short", "fork"):
        assert call(inst, "kvpages", "drop-snapshot", name) is None
    end(loop, inst)
    assert_pools_full(loop)


def test_caps_and_bad_snapshots_give_clear_errors(loop):
    inst = echo(loop)
    pages = alloc(loop, inst, 3)
    assert call(inst, "kvpages", "save-snapshot", pages, TOKENS[:20], "x") == \
        "snapshot 'x': 20 tokens fill 2 kvpages, not 3"
    assert call(inst, "kvpages", "save-snapshot", [], [], "x") == "snapshot 'x' holds no token"
    saved(loop, inst, TOKENS, "a")  # 3 pages
    saved(loop, inst, TOKENS[:16], "b")  # 1 page
    assert call(inst, "kvpages", "save-snapshot", alloc(loop, inst, 3), TOKENS, "c") == (
        "this client's snapshots hold 4 kvpages; 3 more would pass 6 (max_snapshot_pages_per_client): drop some first")
    saved(loop, inst, TOKENS[:16], "c")
    assert call(inst, "kvpages", "save-snapshot", alloc(loop, inst, 1), TOKENS[:16], "d") == (
        "this client has 3 snapshots, the most it may keep (max_snapshots_per_client): drop some first")
    other = echo(loop, "bob")  # the caps are per client
    saved(loop, other, TOKENS[:16], "d")
    for owner_inst, names in ((inst, "abc"), (other, "d")):
        for name in names:
            assert call(owner_inst, "kvpages", "drop-snapshot", name) is None
    end(loop, inst, other)
    assert_pools_full(loop)


def test_a_dropped_snapshot_frees_its_pages_once_no_reader_holds_them(loop):
    pool = loop.replicas[0].kv_pool
    maker, reader = (echo(loop) for _ in range(2))
    saved(loop, maker, TOKENS, "kept")
    end(loop, maker)
    free = pool.num_free
    opened = call(reader, "kvpages", "open-snapshot", "kept")
    assert call(reader, "kvpages", "drop-snapshot", "kept") is None
    assert pool.num_free == free  # the reader still holds all three
    assert call(reader, "kvpages", "match-snapshot", TOKENS) == ""
    assert call(reader, "kvpages", "open-snapshot", "kept") == "no snapshot named 'kept'"
    take(loop, reader, call(reader, "kvpages", "dealloc-kvpages", 0, opened[:2]), "take-unit")
    assert pool.num_free == free + 2
    end(loop, reader)
    assert_pools_full(loop)


@pytest.fixture(scope="module")
def expected(loop, inference) -> list[list[int]]:
    tok = Tokenizer(loop.info.tokenizer)
    return [direct_greedy(inference, loop, tok.encode(PREFIX) + tok.encode(s), MAX_NEW) for s in SUFFIXES]


def result(loop, inst) -> dict:
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def test_prefix_cache_snapshot_mode_reuses_the_prefix_per_client(loop, expected):
    tok = Tokenizer(loop.info.tokenizer)
    prefix, suffixes = tok.encode(PREFIX), [tok.encode(s) for s in SUFFIXES]
    held = len(prefix) - 1  # what a flush forwards and the snapshot holds
    (first,) = run(loop, "prefix-cache", [[PREFIX, SUFFIXES[0], str(MAX_NEW), "--snapshot"]])
    assert result(loop, first) == {"tokens": expected[0], "imported": False, "reused": 0,
                                   "forwarded": len(prefix) + len(suffixes[0]) + MAX_NEW - 1}
    later = run(loop, "prefix-cache", [[PREFIX, s, str(MAX_NEW), "--snapshot"] for s in SUFFIXES])
    for inst, s, want in zip(later, suffixes, expected):
        assert result(loop, inst) == {"tokens": want, "imported": True, "reused": held,
                                      "forwarded": len(prefix) - held + len(s) + MAX_NEW - 1}
    # Another client's instance finds nothing of the operator's and saves a snapshot of its own.
    bob = loop.launch("prefix-cache", [PREFIX, SUFFIXES[1], str(MAX_NEW), "--snapshot"], owner="bob")
    assert loop.run_until(lambda: not bob.alive, 120)
    assert result(loop, bob) == {"tokens": expected[1], "imported": False, "reused": 0,
                                 "forwarded": len(prefix) + len(suffixes[1]) + MAX_NEW - 1}
    exports = loop.replicas[0].exports
    ((name, _), (other_name, _)) = exports.list_exports()
    assert name == other_name and name.startswith("prefix-cache/snapshot/")
    for owner in (first.owner, "bob"):
        assert exports.snapshot(name, owner).tokens == tuple(prefix[:held])
        loop.drop_export(name, owner)
    assert_pools_full(loop)
