"""inferlets/watermark on SmolLM2: 120 tokens drawn at temperature 1 with a fixed seed under the green-list
watermark score z >= 4 in its detector, 120 plain tokens of the same model and seed |z| < 2; the
same seed gives the same tokens; the detector's green counts are the split the docstring defines,
recomputed here with the SDK's generator."""

from __future__ import annotations

import json
import math

import pytest
from harness import control_loop, messages, refused, run, tiny_inference

from oven.inference.sampling import sdk

PROGRAMS = ["watermark"]
PROMPT = "Write a short story about a lighthouse keeper and a storm."
KEY, GAMMA = 15485863, 0.25


@pytest.fixture(scope="module")
def loop():
    with tiny_inference(model="smollm2-135m-instruct", num_kv_pages=64) as process:
        with control_loop(process, None, PROGRAMS) as control:
            yield control


def outputs(loop, args_list: list[list[str]]) -> list[dict]:
    instances = run(loop, "watermark", args_list, timeout_s=600)
    for inst in instances:
        assert inst.exit_code == 0, inst.error
    return [json.loads(messages(loop, inst)[0]) for inst in instances]


def host_green(vocab_size: int, prev: int, token: int) -> bool:
    prime = next(n for n in range(vocab_size, 2 * vocab_size) if all(n % d for d in range(2, math.isqrt(n) + 1)))
    rng = sdk.Rng(KEY * 2**32 + prev)
    a, b = 1 + rng.next_u64() % (prime - 1), rng.next_u64() % prime
    return (a * token + b) % prime < round(GAMMA * prime)


def test_watermarked_text_is_detected_and_plain_text_is_not(loop):
    generate = ["generate", PROMPT, "120", "--chat", "--ignore-eos", "--seed", "11"]
    marked, plain, again = outputs(loop, [generate, generate + ["--delta", "0"], generate])
    assert len(marked["tokens"]) == len(plain["tokens"]) == 120
    assert again["tokens"] == marked["tokens"]  # the seed fixes the draws
    assert marked["tokens"] != plain["tokens"]
    found_marked, found_plain = outputs(loop, [["detect", marked["text"]], ["detect", plain["text"]]])
    assert found_marked["scored"] >= 110 and found_plain["scored"] >= 110
    assert found_marked["z"] >= 4, (found_marked, marked["z"])
    assert abs(found_plain["z"]) < 2, (found_plain, plain["z"])
    assert marked["z"] >= 4 and abs(plain["z"]) < 2  # also on the drawn tokens, before detokenizing
    vocab = loop.info.vocab_size
    tokens = marked["tokens"]
    assert marked["green"] - 1 <= sum(host_green(vocab, p, t) for p, t in zip(tokens, tokens[1:])) <= marked["green"]


def test_bad_arguments_are_one_clear_error(loop):
    cases = {("embed", "text"): "argument mode: invalid choice: 'embed' (choose from generate, detect)",
             ("detect", "some text", "--gamma", "1.5"): "argument --gamma: expected a number > 0 and < 1, not '1.5'"}
    for stderr, error in zip(refused(loop, "watermark", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: watermark [-h]") and stderr.endswith(f"watermark: error: {error}\n")
