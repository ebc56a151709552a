"""Decode through CUDA graphs: buckets and padding (any machine), and on a GPU the whole FlashInfer engine
against the PyTorch engine over every call pattern, graphs against eager, adapters eager, and no host sync."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from oven.inference.attention import BatchLayout
from oven.inference.config import InferenceConfig
from oven.inference.cuda_graphs import bucket_sizes, padded_layout
from oven.proto import inference as p

PAGE = 16


def test_bucket_sizes():
    assert bucket_sizes(128) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert bucket_sizes(1) == [1]


def test_padding_rows_live_on_the_scratch_page():
    layout = BatchLayout.build(PAGE, [([3, 4], 5, 1, None), ([7], 2, 1, None)])
    padded = padded_layout(layout, 4, scratch_page=99)
    assert padded.kv_indptr.tolist() == [0, 2, 3, 4, 5]
    assert padded.kv_page_ids.tolist() == [3, 4, 7, 99, 99]
    assert padded.kv_last_page_len.tolist() == [5, 2, 1, 1]
    assert padded.qo_indptr.tolist() == [0, 1, 2, 3, 4]
    assert padded.write_slots.tolist() == [4 * PAGE + 4, 7 * PAGE + 1, 99 * PAGE, 99 * PAGE]
    assert padded_layout(layout, 2, scratch_page=99) is layout


def test_cuda_graph_setting_is_checked():
    assert InferenceConfig(cuda_graph_max_batch=0).cuda_graph_max_batch == 0
    with pytest.raises(ValueError, match="cuda_graph_max_batch must be 0"):
        InferenceConfig(cuda_graph_max_batch=-1)


# -- GPU ----------------------------------------------------------------------------------------------

def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


@pytest.fixture(scope="module")
def hd64_model(tmp_path_factory):
    """A two-layer Llama with FlashInfer's head size (64) and 8 query heads on 2 KV heads (tensor-core
    decode, as dummy:llama-3.2-1b), random weights with a scaled (tied) embedding so distributions are
    peaked, saved as a Hugging Face folder with the donor model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from oven.inference.models import _tokenizer_donor

    donor = _tokenizer_donor()
    folder = tmp_path_factory.mktemp("hd64")
    config = LlamaConfig(vocab_size=donor.hf_config.vocab_size, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                         max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=donor.hf_config.bos_token_id, eos_token_id=donor.hf_config.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(10)  # logits of std ~4.5: top tokens of p 0.1-0.8, not a flat 2e-5
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (donor.weights_dir / name).is_file():
            shutil.copy(donor.weights_dir / name, folder / name)
    assert json.loads((folder / "config.json").read_text())["head_dim"] == 64
    return str(folder)


def gpu_engine(model: str, **overrides):
    from oven.inference.engine import Engine

    cfg = dict(model=model, device="cuda", dtype="bfloat16", num_kv_pages=64, num_host_pages=8, num_embeds=1024)
    cfg.update(overrides)
    return Engine(InferenceConfig(**cfg), progress=False)


def dense(reply: p.ForwardTextReply, vocab: int) -> torch.Tensor:
    """Every output's full distribution [outputs, vocab] from top-vocab replies."""
    rows = []
    for dists in reply.dists:
        for d in dists:
            row = torch.zeros(vocab)
            row[torch.from_numpy(np.frombuffer(d.token_ids, "<i4").astype(np.int64))] = \
                torch.from_numpy(np.frombuffer(d.probs, "<f4").copy())
            rows.append(row)
    return torch.stack(rows)


def call_patterns(vocab: int) -> list:
    """Causal prefill, masked prefill (attention mask), decode, a page mask, masked decode: the order
    that broke FlashInfer on Hopper, as requests; every output's full distribution is asked for."""
    rng = np.random.default_rng(0)
    toks = rng.integers(100, 30000, size=(3, 40)).tolist()

    def item(tokens, start, pages, outputs, mask=None):
        n = start + len(tokens)
        used = pages[: -(-n // PAGE)]
        return p.ForwardTextItem(tokens, list(range(start, n)), used, n - (len(used) - 1) * PAGE, outputs,
                                 top_k=vocab, attention_mask=mask)

    pages = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    allow = np.ones((10, 40), dtype=bool)
    allow[:, [3, 17]] = False
    mask = [np.packbits(row).tobytes() for row in allow]
    return [
        p.ForwardTextRequest([item(toks[i][:30], 0, pages[i], [29]) for i in range(3)]),
        p.ForwardTextRequest([item(toks[0][30:40], 30, pages[0], [9], mask), item(toks[1][30:33], 30, pages[1], [2])]),
        p.ForwardTextRequest([item([5], 40, pages[0], [0]), item([6], 33, pages[1], [0]), item([7], 30, pages[2], [0])]),
        p.MaskKvPageRequest([p.MaskKvPageItem(1, [i in (2, 9) for i in range(PAGE)])]),
        p.ForwardTextRequest([item([8], 41, pages[0], [0]), item([9], 34, pages[1], [0])]),
    ]


def run_patterns(engine) -> list[torch.Tensor]:
    vocab = engine.model.config.vocab_size
    outs = []
    for req in call_patterns(vocab):
        reply = engine.handle(req)
        assert all(e is None for e in reply.errors), reply.errors
        if isinstance(req, p.ForwardTextRequest):
            outs.append(dense(reply, vocab))
    return outs


@gpu
def test_flashinfer_engine_matches_torch_engine_on_every_call_pattern(hd64_model):
    pytest.importorskip("flashinfer")
    fi, pt = gpu_engine(hd64_model), gpu_engine(hd64_model, attention_backend="torch")
    assert (fi.backend.name, pt.backend.name) == ("flashinfer", "torch")
    for step, (a, b) in enumerate(zip(run_patterns(fi), run_patterns(pt))):
        assert (a - b).abs().max().item() <= 2e-2, f"step {step}"
        assert a.max().item() > 0.05  # peaked: the comparison means something
    assert sorted(fi.decode_graphs.graphs) == [4]  # the unmasked decode step (3 items) replayed a graph


@gpu
def test_graph_replays_equal_eager_decode(hd64_model):
    pytest.importorskip("flashinfer")
    graphs, eager = gpu_engine(hd64_model), gpu_engine(hd64_model, cuda_graph_max_batch=0)
    assert eager.decode_graphs is None
    for a, b in zip(run_patterns(graphs), run_patterns(eager)):
        assert (a - b).abs().max().item() <= 2e-2


@gpu
def test_adapter_batches_run_eagerly(hd64_model, tmp_path):
    pytest.importorskip("flashinfer")
    from conftest import write_adapter

    engine = gpu_engine(hd64_model)
    torch.manual_seed(3)
    write_adapter(tmp_path / "a", engine.model.config, targets=("q_proj", "v_proj"), r=8)
    assert isinstance(engine.handle(p.LoadAdapterRequest(1, "a", str(tmp_path / "a"))), p.AdapterReply)
    prefill, _, decode = call_patterns(engine.model.config.vocab_size)[:3]
    engine.handle(prefill)
    items = [dataclasses.replace(it, adapter_id=1) if i == 0 else it for i, it in enumerate(decode.items)]
    reply = engine.handle(p.ForwardTextRequest(items))
    assert all(e is None for e in reply.errors)
    assert engine.decode_graphs.graphs == {}  # no graph was captured or replayed for it


@gpu
def test_a_decode_step_never_waits_for_the_device(hd64_model):
    """forward() of a decode batch (graph replay), then of a masked one (eager), under torch's sync debug
    mode: a device->host synchronisation inside raises. Each runs once first (a graph's capture syncs)."""
    pytest.importorskip("flashinfer")
    engine = gpu_engine(hd64_model)
    reqs = call_patterns(engine.model.config.vocab_size)
    for req in reqs[:2]:
        engine.handle(req)
    for decode, before in ((reqs[2], None), (reqs[4], reqs[3])):
        if before is not None:
            engine.handle(before)
        embed_ids = [600 + i for i in range(len(decode.items))]
        engine.handle(p.EmbedTextRequest([p.EmbedTextItem(it.token_ids, it.positions, [e])
                                          for it, e in zip(decode.items, embed_ids)]))
        forward = p.ForwardRequest([p.ForwardItem(it.kv_page_ids, it.kv_last_page_len, [e], [0], [e + 100])
                                    for it, e in zip(decode.items, embed_ids)])
        engine.handle(forward)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            reply = engine.handle(forward)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(e is None for e in reply.errors)
    assert sorted(engine.decode_graphs.graphs) == [4]


@gpu
def test_float32_and_head_size_16_fall_back_to_torch_on_cuda(caplog):
    pytest.importorskip("flashinfer")
    with caplog.at_level(logging.WARNING, logger="oven.inference.attention"):
        assert gpu_engine("tiny", dtype="float32").backend.name == "torch"
        assert gpu_engine("tiny").backend.name == "torch"
    assert "FlashInfer has no float32 attention kernels" in caplog.text
    assert "FlashInfer's attention kernels take head sizes 64, 128, 256, not 16" in caplog.text
