"""inferlets/output-validation on SmolLM2 against Hugging Face's logits on the same weights: each
candidate's summed log-probability and its softmax-normalised probability over the candidates."""

from __future__ import annotations

import json
import math

import pytest
import torch
from harness import control_loop, messages, refused, run, tiny_inference

from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model

MODEL = "smollm2-135m-instruct"
PROGRAMS = ["output-validation"]
PROMPT = "The capital of France is"
CANDIDATES = [" Paris", " London", " a city in Europe.", " Berlin, of course", "Paris"]


@pytest.fixture(scope="module")
def loop():
    with tiny_inference(model=MODEL, num_kv_pages=64) as process:
        with control_loop(process, None, PROGRAMS) as control:
            yield control


@pytest.fixture(scope="module")
def hf():
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(resolve_model(MODEL).weights_dir, torch_dtype=torch.float32).eval()


def hf_logprob(hf, prompt: list[int], candidate: list[int]) -> float:
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + candidate])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return math.fsum(float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(candidate))


def validate(loop, args: list[str]) -> dict:
    (inst,) = run(loop, "output-validation", [args])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


@pytest.mark.parametrize("chat", [False, True])
def test_probabilities_are_hugging_faces(loop, hf, chat):
    out = validate(loop, [PROMPT, *CANDIDATES] + (["--chat"] if chat else []))
    tok = Tokenizer(loop.info.tokenizer)
    prompt = tok.encode_chat([{"role": "user", "content": PROMPT}]) if chat else tok.encode(PROMPT)
    want = [hf_logprob(hf, prompt, tok.encode(c)) for c in CANDIDATES]
    top = max(want)
    weights = [math.exp(w - top) for w in want]
    want_probs = [w / sum(weights) for w in weights]
    got = out["candidates"]
    assert [c["text"] for c in got] == CANDIDATES
    assert [c["tokens"] for c in got] == [tok.encode(c) for c in CANDIDATES]
    for c, lp, pr in zip(got, want, want_probs):
        assert abs(c["logprob"] - lp) < 1e-4 * len(c["tokens"]), (c, lp)
        assert abs(c["probability"] - pr) < 1e-4, (c, pr)
    assert abs(math.fsum(c["probability"] for c in got) - 1) < 1e-9
    assert out["best"] == max(range(len(want)), key=want.__getitem__)
    if not chat:
        assert CANDIDATES[out["best"]] == " Paris"


def test_bad_arguments_are_one_clear_error(loop):
    stderrs = refused(loop, "output-validation", [[PROMPT], [PROMPT, ""]])
    assert all(s.startswith("usage: output-validation [-h] [--chat] PROMPT CANDIDATE [CANDIDATE ...]\n")
               for s in stderrs)
    assert [s.splitlines()[-1] for s in stderrs] == [
        "output-validation: error: the following arguments are required: CANDIDATE",
        "output-validation: error: every CANDIDATE must hold at least one token",
    ]
