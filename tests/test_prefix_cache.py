"""inferlets/prefix-cache: importing a prefix's pages gives the same tokens for fewer forwarded.

The export holds what a flush forwards: the prefix but its last token, which importers forward.

Exports outlive their exporter: the runtime keeps an export's pages until it is released,
and only the exporter may release it (``release-export``) while it runs; after it exits,
only the runtime's own ``ExportRegistry.drop`` frees them (an operator's ``oven exports --drop``,
or a KvPage pool that runs out), as this test does at the end.
"""

from __future__ import annotations

import json

import numpy as np
from harness import (
    assert_pools_full,
    direct_greedy,
    messages,
    refused,
    run,
)
from oven.control.tokenizer import Tokenizer
from oven.proto import inference as p

PREFIX = ("You are a careful assistant. Answer briefly, cite nothing, and never repeat the question; "
          "this system prompt spans two pages and part of a third.")
SUFFIXES = ["User: what is a page?", "User: name a colour.", "User: count to three, please."]
MAX_NEW = 5


PROGRAMS = ["prefix-cache"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


def result(loop, inst) -> dict:
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def probe(inference, page_size: int, pages: list[int], scratch: int) -> tuple[list[int], np.ndarray]:
    """The top-50 after one token placed right behind ``pages``, attending to every slot they hold."""
    item = p.ForwardTextItem([42], [len(pages) * page_size], pages + [scratch], 1, [0], top_k=50)
    with inference.client() as client:
        (dist,) = client.call(p.ForwardTextRequest([item])).dists[0]
    return np.frombuffer(dist.token_ids, "<i4").tolist(), np.frombuffer(dist.probs, "<f4")


def clean_prefix_pages(inference, page_size: int, prefix: list[int], pages: list[int]) -> None:
    """Forward ``prefix`` alone into ``pages`` and hide the slots behind it, as a fresh export holds it."""
    with inference.client() as client:
        client.call(p.MaskKvPageRequest([p.MaskKvPageItem(page, [True] * page_size) for page in pages]))
        item = p.ForwardTextItem(prefix, list(range(len(prefix))), pages, len(prefix) - (len(pages) - 1) * page_size,
                                 [], 1)
        assert client.call(p.ForwardTextRequest([item])).errors == [None]


def test_imports_give_the_same_tokens_and_skip_the_prefix(loop, inference):
    tok = Tokenizer(loop.info.tokenizer)
    prefix, page_size = tok.encode(PREFIX), loop.info.page_size
    held = prefix[:-1]  # what the flush forwards and the export holds
    assert len(held) % page_size  # a partial last page, written by importers only after a copy
    suffixes = [tok.encode(s) for s in SUFFIXES]
    # Before any export exists: direct generation writes physical pages from 0 up.
    expected = [direct_greedy(inference, loop, prefix + s, MAX_NEW) for s in suffixes]

    (first,) = run(loop, "prefix-cache", [[PREFIX, SUFFIXES[0], str(MAX_NEW)]])
    assert result(loop, first) == {"tokens": expected[0], "imported": False,
                                   "forwarded": len(prefix) + len(suffixes[0]) + MAX_NEW - 1}
    # The exporter has exited; its export lives on with the pages of the prefix but its last token.
    ((name, num_pages),) = loop.replicas[0].exports.list_exports()
    assert name.startswith("prefix-cache/") and num_pages == -(-len(held) // page_size)
    assert [e.name for e in loop.replicas[0].exports.exported_by(first.instance_id)] == [name]

    later = run(loop, "prefix-cache", [[PREFIX, s, str(MAX_NEW)] for s in SUFFIXES] +
                [[PREFIX, SUFFIXES[1], str(MAX_NEW), "--no-cache"]])
    for inst, s, want in zip(later, suffixes, expected):
        assert result(loop, inst) == {"tokens": want, "imported": True, "forwarded": 1 + len(s) + MAX_NEW - 1}
    assert result(loop, later[-1]) == {"tokens": expected[1], "imported": False,
                                       "forwarded": len(prefix) + len(suffixes[1]) + MAX_NEW - 1}
    assert loop.replicas[0].exports.list_exports() == [(name, num_pages)]  # --no-cache neither imports nor exports

    # The export holds the prefix but its last token and nothing else: no instance wrote into its
    # pages after exporting (the importers' last prefix token included).
    exported = list(loop.replicas[0].exports.get(name, first.owner).page_ids)
    free = [i for i in range(loop.replicas[0].kv_pool.size) if loop.replicas[0].kv_pool.refcount(i) == 0][:num_pages + 2]
    clean_prefix_pages(inference, page_size, held, free[:num_pages])
    (got_ids, got), (want_ids, want) = (probe(inference, page_size, exported, free[-1]),
                                        probe(inference, page_size, free[:num_pages], free[-2]))
    assert got_ids == want_ids
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)

    loop.drop_export(name)
    assert_pools_full(loop)


def test_bad_arguments_fail_with_usage(loop):
    cases = {("only a prefix",): "the following arguments are required: SUFFIX",
             ("p", "s", "--no-cache", "--snapshot"): "argument --snapshot: not allowed with argument --no-cache"}
    for stderr, error in zip(refused(loop, "prefix-cache", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: prefix-cache [-h] [--no-cache | --snapshot]")
        assert stderr.endswith(f"prefix-cache: error: {error}\n")
    assert_pools_full(loop)
