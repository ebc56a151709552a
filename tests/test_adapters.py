"""LoRA adapters in the engine: logits equal PEFT's merged model, mixed batches equal their items run
alone, and bad adapters or unknown adapter ids are refused with clear errors.

Adapters are made by PEFT itself (``get_peft_model`` + ``save_pretrained``) over transformers'
LlamaForCausalLM holding the engine's weights, with random non-zero A and B, so an adapter that
were ignored or applied wrongly would change the logits far beyond the tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from oven.inference.adapters import PROJECTIONS
from oven.proto import inference as p

from conftest import hf_reference, make_engine, write_adapter

PAGE = 16
ALL = list(PROJECTIONS)


def tol(engine) -> float:
    # As in test_paged_forward: float32 GEMMs in another order than transformers' over 30 layers.
    return 1e-5 if engine.model.config.num_layers <= 2 else 1e-3


def tokens_for(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 40000, size=n).tolist()


def peft_adapter(engine, folder, seed: int, targets=ALL, r: int = 8, alpha: float = 16, **options):
    """Save a PEFT LoRA adapter with random A and B into ``folder``; return PEFT's merged model."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_reference(engine), LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                                            lora_dropout=0.0, **options))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:  # PEFT's own scale for A; B gets enough weight to move the logits
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5)
            elif "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    model.save_pretrained(folder)
    return model.merge_and_unload().eval()


def load(engine, name: str, folder) -> int:
    """Load as the next free id, as the control process would choose it."""
    reply = engine.handle(p.LoadAdapterRequest(max(engine.adapters.by_id, default=0) + 1, name, str(folder)))
    assert isinstance(reply, p.AdapterReply), reply
    return reply.adapter.adapter_id


@pytest.fixture
def unload_all():
    """Engines are shared by the session: every adapter a test loads goes when it ends."""
    engines = []
    yield engines.append
    for engine in engines:
        for adapter in list(engine.adapters.by_id.values()):
            engine.handle(p.UnloadAdapterRequest(adapter.name))


class Run:
    """Embed + forward one sequence's chunk on fresh pages; logits of every input come back."""

    def __init__(self, engine, page_ids: list[int], embed_base: int, out_offset: int = 128):
        self.engine, self.page_ids, self.embed_base, self.length = engine, page_ids, embed_base, 0
        self.out_offset = out_offset  # output embeds sit this far above the inputs

    def item(self, tokens: list[int], adapter_id: int = 0) -> tuple[p.ForwardItem, list[int]]:
        n = len(tokens)
        in_ids = [self.embed_base + self.length + i for i in range(n)]
        out_ids = [self.embed_base + self.out_offset + self.length + i for i in range(n)]
        reply = self.engine.handle(p.EmbedTextRequest([p.EmbedTextItem(tokens, list(range(self.length, self.length + n)),
                                                                       in_ids)]))
        assert reply.errors == [None]
        total = self.length + n
        pages = self.page_ids[: (total + PAGE - 1) // PAGE]
        self.length = total
        return p.ForwardItem(pages, total - (len(pages) - 1) * PAGE, in_ids, list(range(n)), out_ids,
                             adapter_id=adapter_id), out_ids


def logits_of(engine, embed_ids: list[int]) -> torch.Tensor:
    return engine.model.logits(engine.embed_pool.embeds[torch.tensor(embed_ids)])


def forward(engine, *items) -> list:
    reply = engine.handle(p.ForwardRequest(list(items)))
    return reply.errors


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


# -- logits against PEFT ---------------------------------------------------------------------


@pytest.mark.parametrize("targets, r, alpha, options", [
    (ALL, 8, 16, {}),
    (["q_proj", "v_proj", "down_proj"], 4, 8, {"use_rslora": True}),
], ids=["all-projections", "qv-down-rslora"])
def test_logits_equal_peft_merged_model(engine_and_hf, tmp_path, unload_all, targets, r, alpha, options):
    engine, hf = engine_and_hf
    unload_all(engine)
    merged = peft_adapter(engine, tmp_path, 1, targets, r, alpha, **options)
    adapter_id = load(engine, "a", tmp_path)
    toks = tokens_for(37, 2)
    item, out = Run(engine, [5, 2, 9], 0).item(toks, adapter_id)
    assert forward(engine, item) == [None]
    got, want = logits_of(engine, out), hf_logits(merged, toks)
    assert (want - hf_logits(hf, toks)).abs().max() > 100 * tol(engine)  # the adapter matters
    torch.testing.assert_close(got, want, atol=tol(engine), rtol=0)


def test_decode_with_an_adapter_equals_peft(engine_and_hf, tmp_path, unload_all):
    """Prefill then one-token steps through the adapter: every step's logits equal the merged model's."""
    engine, _ = engine_and_hf
    unload_all(engine)
    merged = peft_adapter(engine, tmp_path, 3, ["q_proj", "k_proj", "o_proj", "up_proj"])
    adapter_id = load(engine, "a", tmp_path)
    toks = tokens_for(24, 4)
    run = Run(engine, [11, 12], 0)
    item, outs = run.item(toks[:20], adapter_id)
    assert forward(engine, item) == [None]
    for t in toks[20:]:
        item, out = run.item([t], adapter_id)
        assert forward(engine, item) == [None]
        outs += out
    torch.testing.assert_close(logits_of(engine, outs), hf_logits(merged, toks), atol=tol(engine), rtol=0)


# -- mixed batches ---------------------------------------------------------------------------


def test_mixed_batch_equals_items_alone(tiny_engine, tmp_path, unload_all):
    """Two adapters and the base model in one batch, prefill then decode, items of several lengths
    interleaved: each item's logits equal that item run alone (and the merged model's)."""
    engine = tiny_engine
    unload_all(engine)
    merged = {1: peft_adapter(engine, tmp_path / "a", 5, ALL, 8, 16),
              2: peft_adapter(engine, tmp_path / "b", 6, ["q_proj", "v_proj", "gate_proj"], 16, 8)}
    ids = {1: load(engine, "a", tmp_path / "a"), 2: load(engine, "b", tmp_path / "b")}
    assert ids == {1: 1, 2: 2}
    plan = [(2, 9), (0, 1), (1, 17), (2, 3), (0, 12), (1, 5)]  # (adapter id, prompt length), interleaved
    prompts = [tokens_for(n + 4, 20 + k) for k, (_, n) in enumerate(plan)]

    def run_all(batched: bool, page_base: int, embed_base: int) -> list[torch.Tensor]:
        runs = [Run(engine, [page_base + 2 * k + j for j in range(2)], embed_base + 64 * k, out_offset=32)
                for k in range(len(plan))]
        outs = [[] for _ in plan]
        steps = [[toks[:n] for toks, (_, n) in zip(prompts, plan)]] + \
                [[[toks[n + s]] for toks, (_, n) in zip(prompts, plan)] for s in range(4)]
        for chunks in steps:  # the prefill, then four decode steps
            built = [run.item(chunk, aid) for run, chunk, (aid, _) in zip(runs, chunks, plan)]
            if batched:
                assert forward(engine, *(item for item, _ in built)) == [None] * len(plan)
            else:
                for item, _ in built:
                    assert forward(engine, item) == [None]
            for k, (_, out) in enumerate(built):
                outs[k] += out
        return [logits_of(engine, out) for out in outs]

    alone = run_all(False, 0, 0)
    mixed = run_all(True, 20, 512)
    for k, (aid, _) in enumerate(plan):
        torch.testing.assert_close(mixed[k], alone[k], atol=tol(engine), rtol=0)
        want = hf_logits(merged[aid] if aid else hf_reference(engine), prompts[k])
        torch.testing.assert_close(alone[k], want, atol=tol(engine), rtol=0)


def test_unknown_adapter_fails_its_item_only(tiny_engine, tmp_path, unload_all):
    engine = tiny_engine
    unload_all(engine)
    peft_adapter(engine, tmp_path, 7, ["v_proj"])
    adapter_id = load(engine, "a", tmp_path)
    toks = tokens_for(6, 8)
    alone = engine.handle(p.ForwardTextRequest([p.ForwardTextItem(toks, list(range(6)), [30], 6, [5], 4, None,
                                                                  adapter_id)]))
    items = [p.ForwardTextItem(toks, list(range(6)), [31], 6, [5], 4, None, adapter_id + 100),
             p.ForwardTextItem(toks, list(range(6)), [32], 6, [5], 4, None, adapter_id)]
    reply = engine.handle(p.ForwardTextRequest(items))
    assert reply.errors[0] == p.ItemError(p.ERR_BAD_ADAPTER, f"adapter {adapter_id + 100} is not loaded")
    assert reply.errors[1] is None and reply.dists[1] == alone.dists[0] and reply.dists[0] is None
    # Unloaded, its id fails too. Ids are the control process's to choose (it never reuses one): an id in
    # use is refused.
    assert engine.handle(p.UnloadAdapterRequest("a")).adapter.adapter_id == adapter_id
    reply = engine.handle(p.ForwardTextRequest(items[1:]))
    assert reply.errors[0].code == p.ERR_BAD_ADAPTER
    again = engine.handle(p.LoadAdapterRequest(adapter_id + 1, "a", str(tmp_path)))
    assert again.adapter.adapter_id == adapter_id + 1
    taken = engine.handle(p.LoadAdapterRequest(adapter_id + 1, "b", str(tmp_path)))
    assert taken == p.ErrorReply(p.ERR_BAD_ADAPTER, f"adapter id {adapter_id + 1} is taken by 'a'")
    assert engine.handle(p.LoadAdapterRequest(0, "c", str(tmp_path))) == p.ErrorReply(
        p.ERR_BAD_ADAPTER, "adapter id 0 must be an integer in [1, 2**31)")


def test_info_lists_adapters_and_names_are_unique(tiny_engine, tmp_path, unload_all):
    engine = tiny_engine
    unload_all(engine)
    peft_adapter(engine, tmp_path, 9, ["q_proj", "up_proj"], r=4, alpha=12)
    adapter_id = load(engine, "cml", tmp_path)
    info = engine.handle(p.InfoRequest())
    assert p.TRAIT_LORA_ADAPTERS in info.traits and info.max_adapters == engine.cfg.max_adapters
    mc = engine.model.config
    num_params = mc.num_layers * 4 * (mc.hidden_size + mc.num_q_heads * mc.head_dim
                                      + mc.hidden_size + mc.intermediate_size)
    assert info.adapters == [p.AdapterInfo(adapter_id, "cml", 4, 12.0, 3.0, ["q_proj", "up_proj"], num_params)]
    # the same load again is the same adapter; the name under another id is refused
    assert engine.handle(p.LoadAdapterRequest(adapter_id, "cml", str(tmp_path))) == p.AdapterReply(info.adapters[0])
    again = engine.handle(p.LoadAdapterRequest(adapter_id + 1, "cml", str(tmp_path)))
    assert again == p.ErrorReply(p.ERR_BAD_ADAPTER,
                                 f"an adapter named 'cml' is already loaded (id {adapter_id}); unload it first")
    assert engine.handle(p.UnloadAdapterRequest("nope")) == p.ErrorReply(p.ERR_BAD_ADAPTER,
                                                                         "no adapter named 'nope' is loaded")


# -- bad adapters ----------------------------------------------------------------------------


def _bad_cases():
    def wrong_hidden(folder, cfg):
        write_adapter(folder, dataclasses.replace(cfg, hidden_size=32))

    def unknown_target(folder, cfg):
        write_adapter(folder, cfg, config={"target_modules": ["q_proj", "qkv_proj"]})

    def dora(folder, cfg):
        write_adapter(folder, cfg, config={"use_dora": True})

    def pickle_only(folder, cfg):
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                                "target_modules": ["q_proj"]}))
        (folder / "adapter_model.bin").write_bytes(b"\x80\x04 not to be unpickled")

    def oversize(folder, cfg):
        write_adapter(folder, cfg)
        with open(folder / "adapter_model.safetensors", "r+b") as f:
            f.truncate((64 << 20) + 1)  # sparse: refused by its size before a byte is read

    def embedding_target(folder, cfg):
        write_adapter(folder, cfg, config={"target_modules": ["q_proj", "lm_head"]})

    def too_many_layers(folder, cfg):
        write_adapter(folder, cfg, num_layers=cfg.num_layers + 1)

    def rank_over_cap(folder, cfg):
        write_adapter(folder, cfg, r=1, config={"r": 512})

    def bias(folder, cfg):
        write_adapter(folder, cfg, config={"bias": "lora_only"})

    def modules_to_save(folder, cfg):
        write_adapter(folder, cfg, config={"modules_to_save": ["lm_head"]})

    def truncated(folder, cfg):
        write_adapter(folder, cfg, num_layers=cfg.num_layers - 1)

    def dora_tensor(folder, cfg):
        write_adapter(folder, cfg, extra={
            "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector": torch.ones(cfg.hidden_size)})

    def not_safetensors(folder, cfg):
        write_adapter(folder, cfg)
        (folder / "adapter_model.safetensors").write_bytes(b"\xff" * 64)

    def ia3(folder, cfg):
        write_adapter(folder, cfg, config={"peft_type": "IA3"})

    def nan(folder, cfg):
        write_adapter(folder, cfg, extra={
            "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight": torch.full((32, 4), float("nan"))})

    return [
        (wrong_hidden, r"lora_A of layers\.0\.self_attn\.q_proj is \[4, 32\], expected \[4, 64\] for rank 4 on tiny "
                       r"\(hidden size 64\): trained for another model\?"),
        (unknown_target, r"unknown target module 'qkv_proj' \(the model has q_proj, k_proj, v_proj, o_proj"),
        (dora, r"DoRA \(use_dora\) is not supported"),
        (pickle_only, r"only adapter_model\.bin \(a pickle, never loaded here\); save the adapter as "
                      r"adapter_model\.safetensors"),
        (oversize, r"adapter_model\.safetensors is 64\.0 MiB, over the 64 MiB limit \(max_adapter_bytes\)"),
        (embedding_target, r"embedding target 'lm_head' is not supported"),
        (too_many_layers, r"is for layer 2, but tiny has 2 layers: trained for another model\?"),
        (rank_over_cap, r"rank r=512 is outside \[1, 256\] \(max_adapter_rank\)"),
        (bias, r"trained biases \(bias='lora_only'\) is not supported"),
        (modules_to_save, r"fully trained modules \(modules_to_save=\['lm_head'\]\) is not supported"),
        (truncated, r"no weights for layers\.1\.self_attn\.q_proj, which target_modules names \(tiny has 2 layers\)"),
        (dora_tensor, r"DoRA weights \(base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_magnitude_vector\)"),
        (not_safetensors, r"adapter_model\.safetensors is not a valid safetensors file"),
        (ia3, r"peft_type 'IA3' is not supported \(LoRA only\)"),
        (nan, r"layers\.1\.self_attn\.v_proj holds NaN or infinite weights"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("make, message", BAD, ids=[make.__name__ for make, _ in BAD])
def test_bad_adapters_are_refused(tiny_engine, tmp_path, make, message):
    folder = tmp_path / "adapter"
    make(folder, tiny_engine.model.config)
    reply = tiny_engine.handle(p.LoadAdapterRequest(1, "bad", str(folder)))
    assert isinstance(reply, p.ErrorReply) and reply.code == p.ERR_BAD_ADAPTER, reply
    assert reply.message.startswith(f"{folder}: ") and "\n" not in reply.message
    assert re.search(message, reply.message), reply.message
    assert not tiny_engine.adapters.by_id


def test_adapter_slots_are_capped(tmp_path):
    engine = make_engine("tiny", max_adapters=1, num_kv_pages=4, num_embeds=16)
    write_adapter(tmp_path / "a", engine.model.config)
    load(engine, "a", tmp_path / "a")
    reply = engine.handle(p.LoadAdapterRequest(2, "b", str(tmp_path / "a")))
    assert reply == p.ErrorReply(p.ERR_BAD_ADAPTER, "1 adapters are loaded, the most allowed (max_adapters); unload one")


def test_base_batches_never_touch_the_lora_executor(tiny_engine, tmp_path, unload_all, monkeypatch):
    """With adapters loaded, a batch of base items runs the plain model path: nothing planned or applied."""
    engine = tiny_engine
    unload_all(engine)
    write_adapter(tmp_path, engine.model.config)
    load(engine, "a", tmp_path)

    def refuse(*_):
        raise AssertionError("the LoRA executor ran for a base-only batch")

    monkeypatch.setattr(engine.lora, "plan", refuse)
    monkeypatch.setattr(engine.lora, "apply", refuse)
    reply = engine.handle(p.ForwardTextRequest([p.ForwardTextItem([10, 11], [0, 1], [40], 2, [1], 3)]))
    assert reply.errors == [None]



# -- over a real inference process -----------------------------------------------------------


def test_server_refuses_bad_adapters_and_keeps_serving(tmp_path):
    """ZeroMQ requests to a real process: refusals are typed error replies, the server goes on, and a
    batch mixing base, adapter and unknown-adapter items answers each alone."""
    from oven.control.inference_client import InferenceError
    from oven.control.inference_process import start_inference_process
    from oven.proto.endpoints import private_endpoint
    from oven.inference.config import InferenceConfig
    from oven.inference.models import resolve_model

    engine_cfg = resolve_model("tiny").config
    write_adapter(tmp_path / "foreign", dataclasses.replace(engine_cfg, hidden_size=32))
    write_adapter(tmp_path / "good", engine_cfg, targets=ALL)
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=8, num_embeds=32, torch_threads=1)
    with start_inference_process(config, timeout_s=120) as server, server.client() as client:
        client.timeout_s = 60
        with pytest.raises(InferenceError, match=r"bad_adapter: .*foreign: lora_A of layers\.0\.self_attn\.q_proj "
                                                 r"is \[4, 32\], expected \[4, 64\]"):
            client.call(p.LoadAdapterRequest(1, "foreign", str(tmp_path / "foreign")))
        with pytest.raises(InferenceError, match=r"bad_adapter: .*missing: not a folder"):
            client.call(p.LoadAdapterRequest(1, "missing", str(tmp_path / "missing")))
        adapter = client.call(p.LoadAdapterRequest(1, "good", str(tmp_path / "good"))).adapter
        assert (adapter.adapter_id, adapter.name, adapter.rank, adapter.target_modules) == (1, "good", 4, ALL)
        assert client.call(p.InfoRequest()).adapters == [adapter]

        def item(page: int, adapter_id: int) -> p.ForwardTextItem:
            return p.ForwardTextItem([10, 11, 12], [0, 1, 2], [page], 3, [2], 5, None, adapter_id)

        reply = client.call(p.ForwardTextRequest([item(0, 0), item(1, 7), item(2, 1)]))
        assert reply.errors[1] == p.ItemError(p.ERR_BAD_ADAPTER, "adapter 7 is not loaded")
        assert reply.errors[0] is None and reply.errors[2] is None and reply.dists[0] != reply.dists[2]
        assert client.call(p.ForwardTextRequest([item(3, 1)])).dists == [reply.dists[2]]
        assert client.call(p.UnloadAdapterRequest("good")).adapter == adapter
        assert client.call(p.ForwardTextRequest([item(3, 1)])).errors[0].code == p.ERR_BAD_ADAPTER
        assert client.call(p.HealthRequest()).ok
