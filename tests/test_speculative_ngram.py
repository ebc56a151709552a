"""inferlets/speculative-ngram: prompt-lookup drafts verified in one forward equal greedy decoding."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from harness import assert_pools_full, direct_greedy, messages, refused, run

from oven.control.tokenizer import Tokenizer

_spec = importlib.util.spec_from_file_location(
    "speculative_ngram_lookup", Path(__file__).resolve().parents[1] / "inferlets" / "speculative-ngram" / "ngram.py")
ngram = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ngram)


def test_lookup_copies_what_followed_the_earliest_match_of_the_longest_suffix():
    assert ngram.lookup([1, 2, 3, 9, 1, 2, 3, 7, 2, 3], 3, 4) == [9, 1, 2, 3]  # "2 3" first at 1
    assert ngram.lookup([5, 1, 2, 8, 1, 2], 3, 4) == [8, 1, 2]  # the continuation runs into the suffix
    assert ngram.lookup([4, 4, 4], 2, 5) == [4]  # "4 4" at 0, followed by the last 4
    assert ngram.lookup([1, 2, 3], 3, 4) == []
    assert ngram.lookup([1, 2, 1], 3, 0) == []


def expected_run(prompt: list[int], greedy: list[int], end: frozenset[int], max_new: int, max_n: int, k: int) -> dict:
    """What the inferlet must report, replayed from the greedy tokens: a draft token is accepted
    iff it equals greedy decoding's token at its place, and each step is one forward."""
    out, forwards, drafted, accepted = greedy[:1], 1, 0, 0
    while len(out) < max_new and out[-1] not in end:
        draft = ngram.lookup(prompt + out, max_n, min(k, max_new - len(out) - 1))
        agree = 0
        while agree < len(draft) and len(out) + agree < len(greedy) and draft[agree] == greedy[len(out) + agree]:
            agree += 1
        new = greedy[len(out):len(out) + agree + 1]
        cut = next((i + 1 for i, t in enumerate(new) if t in end), len(new))
        forwards, drafted, accepted = forwards + 1, drafted + len(draft), accepted + min(agree, cut)
        out += new[:cut]
    assert out == greedy
    return {"tokens": greedy, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0, "forward_calls": forwards}


PROGRAMS = ["speculative-ngram"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


# (prompt, max new tokens, max n, draft length K). The tiny random model falls into loops
# ("fox duplication duplication ...", "c c c ..."), so drafts are accepted after a few tokens;
# "a b c" first drafts "a b c a" from the prompt's own period, which greedy rejects.
CASES = [("The quick brown fox", 30, 3, 4), ("a b c a b c a b c", 25, 3, 4),
         ("1 2 3 4 1 2 3 4 1 2 3 4", 20, 2, 6), ("Hello world. Hello world. Hello world.", 17, 3, 5),
         ("a b c a b c a b c", 25, 3, 0)]


def test_output_is_greedy_with_fewer_forwards(loop, inference):
    instances = run(loop, "speculative-ngram", [[p, str(m), "--ngram", str(n), "--draft", str(k)] for p, m, n, k in CASES])
    assert all(i.exit_code == 0 for i in instances), [i.error for i in instances]
    tok = Tokenizer(loop.info.tokenizer)
    for inst, (prompt, max_new, max_n, k) in zip(instances, CASES):
        (message,) = messages(loop, inst)
        report = json.loads(message)
        greedy = direct_greedy(inference, loop, prompt, max_new)
        assert report == expected_run(tok.encode(prompt), greedy, tok.stop_token_ids, max_new, max_n, k)
        if k:
            assert report["accepted"] > 0 and report["forward_calls"] < len(greedy)
        else:
            assert report["drafted"] == 0 and report["forward_calls"] == len(greedy)
    rates = [json.loads(messages(loop, i)[0])["acceptance_rate"] for i in instances]
    assert 0 < rates[1] < 1  # "a b c": both rejected and accepted drafts, so truncation ran
    assert_pools_full(loop)


def test_bad_arguments_are_refused(loop):
    cases = {(): "the following arguments are required: PROMPT",
             ("x", "ten"): "argument MAX_NEW_TOKENS: expected a whole number >= 1, not 'ten'",
             ("x", "5", "--draft"): "argument --draft: expected one argument",
             ("x", "--ngram", "0"): "argument --ngram: expected a whole number >= 1, not '0'"}
    for stderr, error in zip(refused(loop, "speculative-ngram", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: speculative-ngram [-h]")
        assert stderr.endswith(f"speculative-ngram: error: {error}\n")
    assert_pools_full(loop)
