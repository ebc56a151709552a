"""The paged forward equals transformers' LlamaForCausalLM on the same weights.

Every test runs on the tiny random model and on the real SmolLM2-135M. Logits
come from the engine's output embeds (``model.logits`` of the stored hidden
states), after going through the same request handlers the server uses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oven.proto import inference as p

PAGE = 16


def tokens_for(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(100, 40000, size=n).tolist()


def hf_logits(hf, tokens: list[int], positions: list[int] | None = None) -> torch.Tensor:
    with torch.no_grad():
        pos = None if positions is None else torch.tensor([positions])
        return hf(torch.tensor([tokens]), position_ids=pos).logits[0].float()


def tol(engine) -> float:
    # float32 over 30 layers: GEMM kernels that differ from transformers' (oneDNN packed vs MKL)
    # reorder sums; logits are ~10 in magnitude, so 1e-3 is a relative error of ~1e-4.
    return 1e-5 if engine.model.config.num_layers <= 2 else 1e-3


def prob_tol(engine) -> float:
    # The same reordered sums seen through a softmax: a logit off by d moves a probability p by
    # about p*d, so SmolLM2's top probabilities (~0.5) land ~1e-5 apart (CI saw 1.1e-5).
    return 1e-5 if engine.model.config.num_layers <= 2 else 1e-4


def ok(reply) -> None:
    assert all(e is None for e in reply.errors), reply.errors


class Seq:
    """Test-side bookkeeping of one sequence: its pages and embed slots."""

    def __init__(self, page_ids: list[int], embed_base: int):
        self.page_ids, self.embed_base, self.length = page_ids, embed_base, 0

    def context(self, num_new: int) -> tuple[list[int], int]:
        total = self.length + num_new
        pages = self.page_ids[: (total + PAGE - 1) // PAGE]
        return pages, total - (len(pages) - 1) * PAGE

    def forward_item(self, engine, tokens: list[int], positions: list[int] | None = None,
                     mask: list[bytes] | None = None) -> tuple[p.ForwardItem, list[int]]:
        """Embed ``tokens`` (a request of its own) and describe their forward; returns (item, output embed ids)."""
        n = len(tokens)
        positions = positions if positions is not None else list(range(self.length, self.length + n))
        in_ids = [self.embed_base + self.length + i for i in range(n)]
        out_ids = [self.embed_base + 256 + self.length + i for i in range(n)]
        ok(engine.handle(p.EmbedTextRequest([p.EmbedTextItem(tokens, positions, in_ids)])))
        pages, last = self.context(n)
        self.length += n
        return p.ForwardItem(pages, last, in_ids, list(range(n)), out_ids, mask), out_ids


def logits_of(engine, embed_ids: list[int]) -> torch.Tensor:
    return engine.model.logits(engine.embed_pool.embeds[torch.tensor(embed_ids)])


def forward(engine, *items: p.ForwardItem) -> None:
    ok(engine.handle(p.ForwardRequest(list(items))))


def test_prefill_one_shot(engine_and_hf):
    engine, hf = engine_and_hf
    toks = tokens_for(37, 1)
    seq = Seq([5, 2, 9], 0)  # pages need not be contiguous or ordered
    item, out = seq.forward_item(engine, toks)
    forward(engine, item)
    torch.testing.assert_close(logits_of(engine, out), hf_logits(hf, toks), atol=tol(engine), rtol=0)


@pytest.mark.parametrize("one_batch", [False, True], ids=["separate-calls", "one-batch"])
def test_prefill_split_over_calls_and_pages(engine_and_hf, one_batch):
    """Chunks of one prompt as separate forwards, or as items of one batch (vertical batching)."""
    engine, hf = engine_and_hf
    toks = tokens_for(37, 2)
    seq = Seq([11, 3, 7], 0)
    items, outs = [], []
    for chunk in (toks[:10], toks[10:23], toks[23:]):
        item, out = seq.forward_item(engine, chunk)
        items.append(item)
        outs += out
        if not one_batch:
            forward(engine, item)
    if one_batch:
        forward(engine, *items)
    torch.testing.assert_close(logits_of(engine, outs), hf_logits(hf, toks), atol=tol(engine), rtol=0)


def test_batch_of_different_lengths(engine_and_hf):
    engine, hf = engine_and_hf
    lengths = [1, 7, 16, 40]
    seqs = [Seq([20 + 4 * i + j for j in range(4)], 64 * i) for i in range(len(lengths))]
    prompts = [tokens_for(n, 10 + n) for n in lengths]
    built = [s.forward_item(engine, t) for s, t in zip(seqs, prompts)]
    forward(engine, *(item for item, _ in built))
    for (_, out), toks in zip(built, prompts):
        torch.testing.assert_close(logits_of(engine, out), hf_logits(hf, toks), atol=tol(engine), rtol=0)


def test_decode_steps_batched(engine_and_hf):
    """Two sequences prefilled, then decoded one token per step in a batch of two."""
    engine, hf = engine_and_hf
    full = [tokens_for(31, 3), tokens_for(9, 4)]
    seqs = [Seq([40, 41, 42], 0), Seq([43, 44], 128)]
    prefill = [s.forward_item(engine, t[:20] if i == 0 else t[:2]) for i, (s, t) in enumerate(zip(seqs, full))]
    forward(engine, *(item for item, _ in prefill))
    got = [list(prefill[0][1]), list(prefill[1][1])]
    for _ in range(7):
        built = [s.forward_item(engine, [t[s.length]]) for s, t in zip(seqs, full)]
        forward(engine, *(item for item, _ in built))
        for i, (_, out) in enumerate(built):
            got[i] += out
    for i, toks in enumerate(full):
        n = seqs[i].length
        torch.testing.assert_close(logits_of(engine, got[i]), hf_logits(hf, toks[:n]), atol=tol(engine), rtol=0)


def test_page_mask_hides_tokens(engine_and_hf):
    """Tokens hidden with mask_kvpage before later tokens run: equal to never having them."""
    engine, hf = engine_and_hf
    toks = tokens_for(30, 5)
    hidden = {3, 4, 17}
    seq = Seq([50, 51], 0)
    item, _ = seq.forward_item(engine, toks[:18])
    forward(engine, item)
    bits = [i in hidden for i in range(PAGE)]
    bits2 = [PAGE + i in hidden for i in range(PAGE)]
    ok(engine.handle(p.MaskKvPageRequest([p.MaskKvPageItem(50, bits), p.MaskKvPageItem(51, bits2)])))
    # Rerun tokens 5..16 so that nothing computed after the mask saw the hidden tokens.
    seq.length = 5
    item, _ = seq.forward_item(engine, toks[5:17])
    forward(engine, item)
    seq.length = 18  # token 17 stays hidden (its page bit is still set)
    item, out = seq.forward_item(engine, toks[18:])
    forward(engine, item)
    keep = [i for i in range(30) if i not in hidden]
    expected = hf_logits(hf, [toks[i] for i in keep], keep)[-len(out):]
    torch.testing.assert_close(logits_of(engine, out), expected, atol=tol(engine), rtol=0)
    ok(engine.handle(p.MaskKvPageRequest([p.MaskKvPageItem(pg, [False] * PAGE) for pg in (50, 51)])))


def test_attention_mask_argument(engine_and_hf):
    """A per-call attention mask that drops columns equals computing without those tokens."""
    engine, hf = engine_and_hf
    toks = tokens_for(26, 6)
    hidden = {0, 9, 10}
    allow = np.ones((26, 26), dtype=bool)
    allow[:, sorted(hidden)] = False
    mask = [np.packbits(row).tobytes() for row in allow]
    seq = Seq([52, 53], 0)
    item, out = seq.forward_item(engine, toks, mask=mask)
    forward(engine, item)
    keep = [i for i in range(26) if i not in hidden]
    expected = hf_logits(hf, [toks[i] for i in keep], keep)
    torch.testing.assert_close(logits_of(engine, [out[i] for i in keep]), expected, atol=tol(engine), rtol=0)


def test_copy_kvpage_forks_a_context(engine_and_hf):
    """Fork: full pages shared, the partial last page copied token-level; both branches equal HF."""
    engine, hf = engine_and_hf
    toks = tokens_for(40, 7)
    a = Seq([30, 31, 32], 0)
    item, _ = a.forward_item(engine, toks)
    forward(engine, item)
    ok(engine.handle(p.CopyKvPageRequest([p.CopyKvPageItem(32, 33, 0, 0, 8)])))
    b = Seq([30, 31, 33], 256)
    b.length = 40
    next_a, next_b = tokens_for(1, 8), tokens_for(1, 9)
    item_a, out_a = a.forward_item(engine, next_a)
    item_b, out_b = b.forward_item(engine, next_b)
    forward(engine, item_a, item_b)
    torch.testing.assert_close(logits_of(engine, out_a), hf_logits(hf, toks + next_a)[-1:], atol=tol(engine), rtol=0)
    torch.testing.assert_close(logits_of(engine, out_b), hf_logits(hf, toks + next_b)[-1:], atol=tol(engine), rtol=0)


def test_copy_kvpage_shifts_token_ranges(engine_and_hf):
    engine, _ = engine_and_hf
    seq = Seq([34, 35], 0)
    item, _ = seq.forward_item(engine, tokens_for(20, 10))
    forward(engine, item)
    ok(engine.handle(p.CopyKvPageRequest([p.CopyKvPageItem(34, 36, 2, 5, 9), p.CopyKvPageItem(36, 36, 5, 0, 4)])))
    cache = engine.kv_pool.kv_cache
    assert torch.equal(cache[:, 36, :, 5:14], cache[:, 34, :, 2:11])
    assert torch.equal(cache[:, 36, :, 0:4], cache[:, 34, :, 2:6])


def test_offload_restore_is_bit_exact(engine_and_hf):
    engine, hf = engine_and_hf
    toks = tokens_for(33, 11)
    seq = Seq([60, 61, 62], 0)
    item, _ = seq.forward_item(engine, toks)
    forward(engine, item)
    ok(engine.handle(p.MaskKvPageRequest([p.MaskKvPageItem(61, [i == 3 for i in range(PAGE)])])))
    before = engine.kv_pool.kv_cache[:, [60, 61, 62]].clone()
    mask_before = engine.kv_pool.page_mask[[60, 61, 62]].clone()
    ok(engine.handle(p.OffloadRequest([p.OffloadItem(pg, slot) for pg, slot in ((60, 5), (61, 0), (62, 9))])))
    other = Seq([60, 61, 62], 256)  # clobber the pages with another sequence
    item, _ = other.forward_item(engine, tokens_for(48, 12))
    forward(engine, item)
    assert not torch.equal(engine.kv_pool.kv_cache[:, [60, 61, 62]], before)
    ok(engine.handle(p.RestoreRequest([p.RestoreItem(slot, pg) for pg, slot in ((60, 5), (61, 0), (62, 9))])))
    assert torch.equal(engine.kv_pool.kv_cache[:, [60, 61, 62]], before)
    assert torch.equal(engine.kv_pool.page_mask[[60, 61, 62]], mask_before)
    ok(engine.handle(p.MaskKvPageRequest([p.MaskKvPageItem(61, [False] * PAGE)])))


def test_next_dist_is_sorted_top_k_of_softmax(engine_and_hf):
    engine, hf = engine_and_hf
    toks = tokens_for(12, 13)
    seq = Seq([63], 0)
    item, out = seq.forward_item(engine, toks)
    forward(engine, item)
    reply = engine.handle(p.NextDistRequest([p.NextDistItem(out[-1]), p.NextDistItem(out[-1], top_k=5)]))
    ok(reply)
    probs = torch.softmax(hf_logits(hf, toks)[-1], -1)
    for dist, k in zip(reply.dists, (256, 5)):
        ids = np.frombuffer(dist.token_ids, "<i4")
        values = np.frombuffer(dist.probs, "<f4")
        assert len(ids) == len(values) == k
        assert np.all(np.diff(values) <= 0)
        ref_values, _ = torch.topk(probs, k)
        np.testing.assert_allclose(values, ref_values.numpy(), atol=prob_tol(engine))
        np.testing.assert_allclose(probs[torch.from_numpy(ids.astype(np.int64))].numpy(), values, atol=prob_tol(engine))


def test_forward_text_matches_separate_calls(engine_and_hf):
    """The fused fast path gives the distributions of embed + forward + next_dist."""
    engine, hf = engine_and_hf
    toks = tokens_for(21, 14)
    reply = engine.handle(p.ForwardTextRequest([
        p.ForwardTextItem(toks, list(range(21)), [45, 46], 5, [0, 20], top_k=8)]))
    ok(reply)
    probs = torch.softmax(hf_logits(hf, toks), -1)
    for dist, row in zip(reply.dists[0], (0, 20)):
        ids = np.frombuffer(dist.token_ids, "<i4").astype(np.int64)
        np.testing.assert_allclose(np.frombuffer(dist.probs, "<f4"), probs[row][ids].numpy(), atol=prob_tol(engine))
        assert ids[0] == int(probs[row].argmax())


def test_unpacked_cpu_weights_also_match():
    """The plain-GEMM path (cpu_packed_weights=False) computes the same logits."""
    from .conftest import hf_reference, make_engine

    engine = make_engine("tiny", cpu_packed_weights=False)
    assert not any(type(m).__name__ == "PackedLinear" for m in engine.model.modules())
    toks = tokens_for(20, 15)
    item, out = Seq([1, 2], 0).forward_item(engine, toks)
    forward(engine, item)
    torch.testing.assert_close(logits_of(engine, out), hf_logits(hf_reference(engine), toks), atol=1e-5, rtol=0)
