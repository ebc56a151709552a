"""A Hugging Face folder read without transformers (inference/hf_files.py, inference/rope.py) equals
transformers' own reading of it: the shape, RoPE's frequencies bit for bit, and the tokenizer; where
transformers would read a tokenizer otherwise, it is the one that reads it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from oven.inference.hf_files import LLAMA_DEFAULTS, _spec_from_files, generation_eos_ids, llama_config, \
    stop_token_ids, tokenizer_spec
from oven.inference.models import model_config, resolve_model
from oven.inference.rope import rope_frequencies
from oven.proto.inference import TokenizerSpec

SHAPE = dict(model_type="llama", vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=8, max_position_embeddings=4096)
CONFIGS = {
    "transformers 5": dict(num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    "defaults": dict(),
    "head_dim null": dict(head_dim=None, num_key_value_heads=None),
    "theta alone": dict(rope_theta=500000.0),
    "linear": dict(rope_theta=20000.0, rope_scaling={"type": "linear", "factor": 4.0}),
    "llama 3.1": dict(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192}),
    "llama 3.2, no context": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    "dynamic (by transformers)": dict(rope_scaling={"type": "dynamic", "factor": 2.0}),
    "yarn (by transformers)": dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
}


def test_the_defaults_are_llama_configs():
    from transformers import LlamaConfig

    defaults = LlamaConfig()
    assert {key: getattr(defaults, key) for key in LLAMA_DEFAULTS} == LLAMA_DEFAULTS
    assert defaults.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize("name", CONFIGS)
def test_shape_and_rope_equal_transformers(name, tmp_path):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    (tmp_path / "config.json").write_text(json.dumps({**SHAPE, **CONFIGS[name]}))
    theirs = LlamaConfig.from_pretrained(tmp_path)
    ours = llama_config(tmp_path)
    assert model_config("m", ours) == model_config("m", theirs.to_dict())
    inv_freq, scaling = rope_frequencies(ours)
    rope = LlamaRotaryEmbedding(theirs)
    assert inv_freq.dtype == torch.float32 and torch.equal(inv_freq, rope.inv_freq.float())
    assert scaling == rope.attention_scaling


def test_a_bad_setting_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**SHAPE, "hidden_size": "256"}))
    with pytest.raises(ValueError, match="config.json: hidden_size must be a positive integer, not '256'"):
        llama_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**SHAPE, "num_attention_heads": 0}))
    with pytest.raises(ValueError, match="config.json: num_attention_heads must be a positive integer, not 0"):
        llama_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**SHAPE, "rms_norm_eps": [1e-5]}))
    with pytest.raises(ValueError, match=r"config.json: rms_norm_eps must be a number between 0 and 1, not \[1e-05\]"):
        llama_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        llama_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**SHAPE, "model_type": "mistral"}))
    with pytest.raises(ValueError, match="model_type 'mistral' is not supported"):
        llama_config(tmp_path)


def transformers_spec(folder) -> TokenizerSpec:
    """The tokenizer as transformers reads it: the reference."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return TokenizerSpec(tokenizer.backend_tokenizer.to_str(), tokenizer.chat_template or "", tokenizer.bos_token or "",
                         tokenizer.eos_token or "",
                         stop_token_ids(tokenizer.get_vocab(), tokenizer.eos_token_id, generation_eos_ids(folder)))


@pytest.fixture(scope="module")
def donor():
    return resolve_model("smollm2-135m-instruct").weights_dir


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
# tokenizer_config.json's variants: (settings, or None for no file; whether tokenizer.json is taken as it is)
TOKENIZER_CONFIGS = {
    "transformers 5": ("as converted", True),
    "no tokenizer_config.json": (None, True),
    "PreTrainedTokenizerFast, template inside": (
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
         "chat_template": TEMPLATE, "added_tokens_decoder": {"2": {"content": "<|im_end|>", "special": True}}}, True),
    "no bos": ({"eos_token": "<|endoftext|>"}, True),
    "a class that rebuilds it": ({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>"}, False),
    "a token it lacks": ({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|new|>"]}, False),
    "two templates": ({"eos_token": "<|im_end|>", "chat_template": [{"name": "default", "template": TEMPLATE}]}, False),
}


@pytest.mark.parametrize("name", TOKENIZER_CONFIGS)
def test_the_tokenizer_equals_transformers(name, donor, tmp_path):
    settings, as_is = TOKENIZER_CONFIGS[name]
    for file in ("tokenizer.json", "generation_config.json"):
        shutil.copy(donor / file, tmp_path / file)
    if settings == "as converted":
        for file in ("tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(donor / file, tmp_path / file)
    elif settings is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    assert (_spec_from_files(tmp_path, generation_eos_ids(tmp_path)) is not None) == as_is
    assert tokenizer_spec(tmp_path) == transformers_spec(tmp_path)


def test_an_inference_process_never_imports_transformers():
    """A fresh process resolves the embedded and the tiny model and builds the tiny engine without it."""
    code = ("import sys\nfrom oven.inference.config import InferenceConfig\nfrom oven.inference.engine import Engine\n"
            "from oven.inference.models import resolve_model\nresolve_model('smollm2-135m-instruct')\n"
            "Engine(InferenceConfig(model='tiny', device='cpu', num_kv_pages=8, num_embeds=8, torch_threads=1), "
            "progress=False)\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'sympy')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
