"""Greedy decoding of SmolLM2-135M-Instruct through the real server equals transformers' generate."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from oven.client.generate import greedy_generate
from oven.control.inference_process import start_inference_process
from oven.proto.endpoints import private_endpoint
from oven.control.tokenizer import Tokenizer
from oven.inference.config import InferenceConfig
from oven.inference.models import resolve_model

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "List three colours of the rainbow, one per line."}]
MAX_NEW = 40


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = resolve_model(MODEL).weights_dir
    return AutoTokenizer.from_pretrained(folder), LlamaForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def server():
    config = InferenceConfig(model=MODEL, endpoint=private_endpoint(), num_kv_pages=16, torch_threads=1)
    with start_inference_process(config, timeout_s=300) as process:
        yield process


def test_chat_template_and_tokens_match_transformers(server, hf):
    hf_tok, _ = hf
    tok = Tokenizer(server.info.tokenizer)
    text = hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tok.render_chat(MESSAGES) == text
    for sample in (text, "", "héllo wörld — ✓ 日本語 🙂", "\n\n\t  def f(x):\n    return x**2\n"):
        assert tok.encode(sample) == hf_tok(sample, add_special_tokens=False)["input_ids"]
    assert tok.stop_token_ids >= {hf_tok.eos_token_id}


def test_greedy_decode_equals_hf_generate(server, hf):
    hf_tok, hf_model = hf
    tok = Tokenizer(server.info.tokenizer)
    prompt = tok.encode_chat(MESSAGES)
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                                eos_token_id=sorted(tok.stop_token_ids), pad_token_id=hf_tok.eos_token_id)
    expected = ref[0, len(prompt):].tolist()
    with server.client() as client:
        result = greedy_generate(client, prompt, MAX_NEW, tok.stop_token_ids, server.info.page_size,
                                 server.info.num_kv_pages)
    assert result.token_ids == expected
    assert len(expected) > 5


def test_main_job_cli_streams_the_same_text(hf):
    """`oven generate` (the README's main job) prints the greedy completion."""
    hf_tok, hf_model = hf
    prompt = hf_tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                pad_token_id=hf_tok.eos_token_id)
    expected = hf_tok.decode(ref[0, len(prompt):], skip_special_tokens=True)
    cmd = [sys.executable, "-m", "oven.client.cli", "generate", MESSAGES[0]["content"],
           "--max-new-tokens", "12", "--threads", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected.strip()
    assert ref.shape[1] - len(prompt) == 12  # this prompt runs past 12 tokens: the limit stops it
    assert "12 generated" in done.stderr and "stopped by max_new_tokens" in done.stderr
