"""The two SDKs behave alike: the same scenarios through ``inferlets/conformance`` (Python SDK) and
``inferlets/conformance-rust`` (Rust SDK) on the tiny model give the same messages — the same
tokens (greedy and seeded), the same stops, the same page handles after forks, copy-on-write,
export/import, named snapshots, truncation and prefetching, the same shaped generations (grammars, allowed sets,
biases, penalties, log-probabilities) — and each also gives the answer the case knows.

Both instances run once, one after the other, in a module-scoped fixture; the tests read its reports.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from conftest import write_adapter
from harness import assert_pools_full, direct_greedy, messages, run
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model

SDKS = ["conformance", "conformance-rust"]  # the two SDKs' scenarios, compared
CHILD = "launch-callee"  # what the launch scenario launches
PROGRAMS = [*SDKS, CHILD]  # stored in the module's ControlLoop (conftest.py)
PARTIAL = "Once upon a time, in a land far away, there lived a"  # 14 tokens: 13 forwarded by a flush
FULL = ("One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen")  # 17 tokens: a flush fills one page
LONG = FULL + " eighteen nineteen twenty twenty-one twenty-two"  # 22 tokens: two pages
FOX = "The quick brown fox"
MORE = " and then"  # the snapshot scenario's prompt: PARTIAL's tokens, then these
ADAPTER = "tiny-lora"  # in the module loop's adapter store
SAMPLERS = ["temperature:1.0:3", "temperature:1.0:4", "temperature:0.7:3", "top_k:20:0.8:5", "top_p:0.9:1.3:6",
            "min_p:0.05:1.0:7"]

# Shaped generation (the tiny model's vocabulary is SmolLM2's tokenizer's, so grammars work on it).
CHOICES = ["yes", "no", "maybe later"]
REGEX = "[a-z]{3}-[0-9]{2}"
# No free whitespace: the random model would fill a flexible JSON layout with it.
SCHEMA = {"x-guidance": {"whitespace_flexible": False}, "type": "object",
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
          "additionalProperties": False}
LARK = 'start: "(" NUMBER "," NUMBER ")"\nNUMBER: /[0-9]{1,3}/'
ALLOWED = list(range(1000, 1016))
BANNED = 1000  # allowed, but biased by -inf
BIAS = f"{BANNED}:-inf,1003:0.5,2000:2.0"  # 2000 is outside the allowed set: removed all the same
GAMMA = 0x9E3779B97F4A7C15  # SplitMix64: each draw adds it to the generator's state

# README "Seeded sampling" test vectors.
VECTORS = {
    "u64": [6457827717110365317, 3203168211198807973, 9817491932198370423],
    "f64": [0.7415648787718233, 0.1599103928769201, 0.27860113025513866],
    "draws": {"temperature-1": "00311010010433313012", "temperature-0.7": "00210000000332212011",
              "top-k": "00211010000222212011", "top-p": "00210000000222112011", "min-p": "00210000000222212011",
              "temperature-0": "00000000000000000000"},
}


@pytest.fixture(scope="module")
def loop_config(tmp_path_factory) -> dict:
    """The module's loop offers one LoRA adapter (random weights), stored as `oven adapters add` stores it."""
    store = tmp_path_factory.mktemp("adapters")
    write_adapter(store / ADAPTER, resolve_model("tiny").config)
    return {"adapter_dir": str(store)}


@pytest.fixture(scope="module")
def tokenizer(loop):
    return Tokenizer(loop.info.tokenizer)


@pytest.fixture(scope="module")
def greedy(loop, inference):
    """Greedy continuations straight from the inference process: {(prompt, max_new): tokens}."""
    runs = {(prompt, n): direct_greedy(inference, loop, prompt, n) for prompt, n in [(FOX, 12), (PARTIAL, 24)]}
    (adapter,) = loop.adapters.entries()
    runs[PARTIAL, 12, ADAPTER] = direct_greedy(inference, loop, PARTIAL, 12, adapter_id=adapter.adapter_id)
    tok = Tokenizer(loop.info.tokenizer)
    runs["snapshot"] = direct_greedy(inference, loop, tok.encode(PARTIAL) + tok.encode(MORE), 8)
    return runs


def scenarios(greedy) -> dict[str, str]:
    return {
        "greedy": f"generate|greedy|{FOX}|12",
        **{f"sample {spec}": f"generate|{spec}|{PARTIAL}|24" for spec in SAMPLERS},
        "steps": f"steps|greedy|{PARTIAL}|24",
        "fork partial": f"fork|{PARTIAL}|2|10",
        "fork full": f"fork|{FULL}|2|10",
        "drop": f"drop|{LONG}|2|18",
        "share": f"share|{PARTIAL}|8",
        "snapshot": f"snapshot|{PARTIAL}|{MORE}|8",
        "truncate": f"truncate|{PARTIAL}|12|10",
        **{mode: f"kv|{PARTIAL}|3|8|{mode}" for mode in ("offload", "evict", "ahead", "pause")},
        "ahead of a stop": f"ahead|{PARTIAL}|40|{greedy[PARTIAL, 24][0]}",
        "dists": f"dists|{PARTIAL}|3",
        "adapter": f"adapter|{ADAPTER}|{PARTIAL}|12",
        "vectors": "vectors",
        "errors": "errors",
        "launch": f"launch|{CHILD}|{FOX}|6",
        **shaped_scenarios(),
    }


def shaped_scenarios() -> dict[str, str]:
    allowed = ",".join(map(str, ALLOWED))
    return {
        "choice greedy": f"shaped|greedy|{PARTIAL}|8|choice:{','.join(CHOICES)}|logprobs=3",
        "choice seeded": f"shaped|temperature:1.0:3|{PARTIAL}|8|choice:{','.join(CHOICES)}",
        "regex greedy": f"shaped|greedy|{FOX}|16|regex:{REGEX}",
        "regex seeded": f"shaped|top_p:0.9:1.3:6|{FOX}|16|regex:{REGEX}|logprobs=2",
        "json-schema greedy": f"shaped|greedy|{PARTIAL}|24|json-schema:{json.dumps(SCHEMA)}|logprobs=0",
        "json-schema seeded": f"shaped|temperature:0.8:11|{PARTIAL}|24|json-schema:{json.dumps(SCHEMA)}",
        "lark": f"shaped|min_p:0.05:1.0:7|{FOX}|24|lark:{LARK}",
        "penalties": f"shaped|greedy|{PARTIAL}|12|none|penalties=0.5:0.5:1.3",
        "allowed and bias": f"shaped|temperature:0.7:3|{PARTIAL}|6|none|allowed={allowed}|bias={BIAS}|noeos",
        "shaped steps": f"masked|top_k:20:0.8:5|{PARTIAL}|6|{allowed}|{BIAS}|3",
        "shape errors": "shape_errors",
    }


def stop_scenarios(tokenizer, sampled: list[int]) -> dict[str, tuple[str, list[int], str]]:
    """Stops inside the 24 tokens that SAMPLERS[0] samples after PARTIAL (the tiny model's greedy
    output repeats one token): {scenario: (its argument, the tokens, the text)}."""
    generate = f"generate|{SAMPLERS[0]}|{PARTIAL}|24"
    upto = sampled.index(sampled[6]) + 1
    string = tokenizer.decode(sampled[8:10])[-5:]
    return {
        "stop token": (f"{generate}|token={sampled[6]}", sampled[:upto], tokenizer.decode(sampled[:upto - 1])),
        "stop string": (f"{generate}|string={string}|noeos", *stopped_at_string(tokenizer, sampled, string)),
    }


def stopped_at_string(tokenizer, tokens: list[int], string: str) -> tuple[list[int], str]:
    """The SDK rule (sdk/README.md): after each token, look for the string in the newest
    len(string) + 1 tokens; the text is cut before its first occurrence."""
    for n in range(1, len(tokens) + 1):
        if string in tokenizer.decode(tokens[max(0, n - len(string) - 1):n]):
            text = tokenizer.decode(tokens[:n])
            return tokens[:n], text[:text.index(string)]
    raise AssertionError(f"{string!r} never appears")


def run_both(loop, named: dict[str, str], out: dict[str, dict[str, dict]]) -> None:
    """Run the scenarios through each program in turn; their reports into ``out[program]``, the
    instance id taken out of error messages."""
    for program in SDKS:
        (inst,) = run(loop, program, [list(named.values())], timeout_s=60)
        assert (inst.exit_code, inst.error) == (0, None)
        got = [json.loads(m.replace(inst.instance_id, "<id>")) for m in messages(loop, inst)]
        out[program].update(zip(named, got, strict=True))


@pytest.fixture(scope="module")
def reports(loop, tokenizer, greedy) -> dict[str, dict[str, dict]]:
    """{program: {scenario: its report}}: the scenarios, then stops placed in a sampled generation."""
    out = {program: {} for program in SDKS}
    run_both(loop, scenarios(greedy), out)
    sampled = out[SDKS[0]][f"sample {SAMPLERS[0]}"]["tokens"]
    run_both(loop, {name: arg for name, (arg, _, _) in stop_scenarios(tokenizer, sampled).items()}, out)
    assert_pools_full(loop)
    return out


def both(reports, scenario: str) -> dict:
    """The scenario's report, the same from both SDKs."""
    python, rust = (reports[program][scenario] for program in SDKS)
    assert python == rust
    return python


def test_snapshots_are_reused_by_prefix_and_a_fork_leaves_them_unchanged(reports, greedy, tokenizer):
    # The snapshot holds what a flush forwarded (PARTIAL but its last token, in one partial page);
    # from_prefix reuses all of it, and the context and its fork write past it (copying the page);
    # a context opened afterwards continues like a fresh prefill.
    report = both(reports, "snapshot")
    held = len(tokenizer.encode(PARTIAL)) - 1
    assert (report["count"], report["reused"], len(report["pages"])) == (held, held, 1)
    assert report["tokens"] == [greedy["snapshot"], greedy["snapshot"], greedy[PARTIAL, 24][:8]]
    assert report["taken"] == "export name 'conformance/snapshot/<id>' is taken"
    assert report["missing"] == "no snapshot named 'conformance/snapshot/<id>'"


def test_greedy_generation_stops_at_its_budget(reports, tokenizer, greedy):
    tokens = greedy[FOX, 12]
    report = both(reports, "greedy")
    assert (report["tokens"], report["text"], len(report["pages"])) == (tokens, tokenizer.decode(tokens), 1)


@pytest.mark.parametrize("case", ["stop token", "stop string"])
def test_generation_stops_at_a_token_and_at_a_string(reports, tokenizer, case):
    sampled = both(reports, f"sample {SAMPLERS[0]}")["tokens"]
    _, tokens, text = stop_scenarios(tokenizer, sampled)[case]
    report = both(reports, case)
    assert (report["tokens"], report["text"]) == (tokens, text)
    assert len(tokens) < 24


@pytest.mark.parametrize("spec", SAMPLERS)
def test_seeded_sampling_gives_the_same_tokens(reports, greedy, spec):
    report = both(reports, f"sample {spec}")
    assert len(report["tokens"]) == 24 and report["tokens"] != greedy[PARTIAL, 24]


def test_seeds_and_samplers_differ(reports):
    sampled = [tuple(both(reports, f"sample {spec}")["tokens"]) for spec in SAMPLERS]
    assert len(set(sampled)) == len(SAMPLERS)


def test_decode_steps_equal_greedy_and_pages_are_prefetched_alike(reports, greedy):
    report = both(reports, "steps")
    assert report["tokens"] == greedy[PARTIAL, 24]
    assert len(report["pages"]) == 3  # 13 + 24 tokens forwarded, a page at a time (each prefetched)


def test_generate_allocates_ahead_alike(reports):
    # 14 + 24 tokens: the planned length's 3 pages, allocated ahead in one call.
    assert len(both(reports, "sample temperature:1.0:3")["pages"]) == 3


def test_forks_share_full_pages_and_copy_the_partial_one(reports):
    partial, full = both(reports, "fork partial"), both(reports, "fork full")
    # 13 forwarded tokens: no full page; each fork gets a copy of the partial one.
    assert len({pages[0] for pages in partial["after_fork"]}) == 3
    # 16 forwarded tokens: one full page, shared by all three; each writes its own next pages.
    assert [pages for pages in full["after_fork"]] == [full["after_fork"][0]] * 3
    shared = full["after_fork"][0][0]
    assert all(pages[0] == shared for pages in full["after_generate"])
    own = [handle for pages in full["after_generate"] for handle in pages[1:]]
    assert len(own) == len(set(own)) == 3
    assert len({tuple(tokens) for tokens in full["tokens"]}) == 3  # seeds 0, 1, 2


def test_masking_a_shared_page_copies_it_first(reports):
    report = both(reports, "drop")
    assert report["before"][0] == report["root"][0]  # the full page, shared
    assert report["after"][0] not in report["root"] and report["after"][1] == report["before"][1]
    assert report["hidden"] != report["shown"]
    assert report["shown"] == report["root_dist"]  # shown again, and the root's page never written


def test_export_and_import(reports, tokenizer, greedy):
    report = both(reports, "share")
    assert report["count"] == len(tokenizer.encode(PARTIAL)) - 1
    assert report["tokens"] == [greedy[PARTIAL, 24][:8]] * 2
    exporter_pages, importer_pages = report["after"]
    assert importer_pages[0] != report["imported"][0]  # the shared partial page copied before writing
    assert report["missing"] == "no kvpage export named 'conformance/<id>'"


def test_truncate_then_generate(reports, loop, inference, tokenizer, greedy):
    report = both(reports, "truncate")
    assert report["tokens"][0] == greedy[PARTIAL, 24][:12]
    assert report["tokens"][1] == direct_greedy(inference, loop, tokenizer.encode(PARTIAL)[:10], 12)
    assert len(report["truncated_pages"]) == 1


@pytest.mark.parametrize("mode, pages_after", [("offload", 1), ("evict", 0), ("ahead", 1), ("pause", 1)])
def test_offload_evict_and_freeing_pages_ahead_change_no_token(reports, greedy, mode, pages_after):
    """After the prefill and 3 decode steps (16 tokens forwarded, a page prefetched), each frees
    the prefetched page (a pause hint too); the generation goes on as if nothing happened."""
    report = both(reports, mode)
    assert len(report["after"]) == pages_after
    assert report["tokens"] == greedy[PARTIAL, 24][3:11]


def test_pages_allocated_ahead_of_an_early_stop_are_freed(reports, greedy):
    report = both(reports, "ahead of a stop")
    assert report["tokens"] == greedy[PARTIAL, 24][:1]
    assert (len(report["before"]), report["after"]) == (4, report["before"][:1])  # 14 + 40 planned; 14 held


def test_dists_give_one_distribution_per_pending_token(reports, tokenizer, greedy):
    report = both(reports, "dists")
    assert len(report["token_ids"]) == len(tokenizer.encode(PARTIAL))
    assert all(len(ids) == 3 for ids in report["token_ids"])
    assert report["token_ids"][-1][0] == greedy[PARTIAL, 24][0]


def test_an_adapter_opened_by_name_decodes_as_the_inference_layer_does(reports, greedy):
    """The adapter's tokens (on its context and on a fork, which inherits it) equal the inference
    process's own greedy decode on that adapter; the base context, decoded in the same batches,
    equals the base model alone."""
    report = both(reports, "adapter")
    assert report["adapted"] == report["forked"] == greedy[PARTIAL, 12, ADAPTER]
    assert report["base"] == greedy[PARTIAL, 24][:12] != report["adapted"]
    assert report["id"] == 1
    assert report["missing"] == f"no adapter named 'no-such-adapter' on this server (it has: {ADAPTER})"


def test_the_seeded_sampling_vectors_hold_in_wasm(reports):
    assert both(reports, "vectors") == VECTORS


def test_errors_read_alike(reports):
    assert both(reports, "errors") == {
        "empty": "the context is empty: fill it before decoding",
        "range": "[0, 3) is not a range of tokens before the last of 3",
        "import": "no kvpage export named 'conformance/none'",
    }


def test_children_are_launched_awaited_and_cancelled_alike(reports, tokenizer, greedy):
    """A child's messages reach its parent (the Rust callee's greedy text), a cancelled one ends killed."""
    tokens = greedy[FOX, 12][:6]
    assert not set(tokens) & set(tokenizer.stop_token_ids)
    assert both(reports, "launch") == {
        "finished": {"state": "finished", "code": 0, "error": "", "messages": [tokenizer.decode(tokens)]},
        "cancelled": {"state": "killed", "code": 143, "error": "cancelled by its parent", "messages": []},
        "refused": "launch 'no-such-program': no program named or hashed 'no-such-program'",
    }


def ended_by_the_grammar(report, tokenizer) -> str:
    """The generation ended with an end token (the grammar's language complete); its text."""
    assert report["tokens"][-1] in tokenizer.stop_token_ids
    assert report["text"] == tokenizer.decode(report["tokens"][:-1])
    return report["text"]


def assert_logprobs(report, top: int, first_best: int) -> None:
    """One record per token: the token, its log-probability, the ``top`` most probable under the model
    (before shaping: the first step's best is the unshaped greedy token)."""
    assert [token for token, _, _ in report["logprobs"]] == report["tokens"]
    for token, logprob, best in report["logprobs"]:
        assert logprob <= 0 and len(best) == top
        assert [lp for _, lp in best] == sorted((lp for _, lp in best), reverse=True)
        assert all(lp >= logprob for _, lp in best[:1])
    if top:
        assert report["logprobs"][0][2][0][0] == first_best


@pytest.mark.parametrize("case", ["choice greedy", "choice seeded"])
def test_a_choice_grammar_gives_one_of_its_strings(reports, tokenizer, greedy, case):
    report = both(reports, case)
    assert ended_by_the_grammar(report, tokenizer) in CHOICES
    if case == "choice greedy":
        assert_logprobs(report, 3, greedy[PARTIAL, 24][0])
    else:
        assert report["logprobs"] == [] and report["rng"] == (3 + len(report["tokens"]) * GAMMA) % 2**64


@pytest.mark.parametrize("case", ["regex greedy", "regex seeded"])
def test_a_regex_grammar_gives_a_match(reports, tokenizer, greedy, case):
    report = both(reports, case)
    assert re.fullmatch(REGEX, ended_by_the_grammar(report, tokenizer))
    if case == "regex seeded":
        assert_logprobs(report, 2, greedy[FOX, 12][0])


@pytest.mark.parametrize("case", ["json-schema greedy", "json-schema seeded"])
def test_a_json_schema_gives_valid_json(reports, tokenizer, case):
    report = both(reports, case)
    jsonschema.validate(json.loads(ended_by_the_grammar(report, tokenizer)), SCHEMA)
    if case == "json-schema greedy":
        assert_logprobs(report, 0, 0)


def test_a_lark_grammar_gives_its_language(reports, tokenizer):
    assert re.fullmatch(r"\(\d{1,3},\d{1,3}\)", ended_by_the_grammar(both(reports, "lark"), tokenizer))


def test_penalties_change_a_greedy_generation(reports, greedy):
    """The tiny model's greedy output repeats one token; presence, frequency and repetition penalties
    (a decoder without a grammar) push the generation off it."""
    report = both(reports, "penalties")
    assert len(report["tokens"]) == 12
    assert len(set(report["tokens"])) > len(set(greedy[PARTIAL, 24][:12]))


def test_an_allowed_set_and_biases_hold_in_a_pipelined_generation(reports):
    report = both(reports, "allowed and bias")
    assert len(report["tokens"]) == 6 and set(report["tokens"]) <= set(ALLOWED) - {BANNED}
    assert report["rng"] == (3 + 6 * GAMMA) % 2**64
    assert report["more"] and report["logprobs"] == []


def test_shaped_steps_change_the_allowed_set_step_by_step(reports, greedy):
    """Each step allows the tokens not drawn yet: six distinct allowed tokens, never the banned one."""
    report = both(reports, "shaped steps")
    tokens = report["tokens"]
    assert len(set(tokens)) == 6 and set(tokens) <= set(ALLOWED) - {BANNED}
    assert_logprobs(report, 3, greedy[PARTIAL, 24][0])
    assert report["rng"] == (5 + 6 * GAMMA) % 2**64


def test_shape_errors_read_alike(reports):
    report = both(reports, "shape errors")
    assert report.pop("regex").startswith("regex: ")
    assert report == {
        "kind": "unknown grammar kind 'xml' (one of json-schema, regex, lark, choice)",
        "choice": "choice: choice must be a non-empty JSON array of non-empty strings",
        "custom": "a Shape needs one of the built-in samplers (Greedy, Temperature, TopK, TopP, MinP): the server "
                  "applies it where it draws the token",
        "allowed": "allowed token 49152 is outside the vocabulary of 49152",
        "presence": "create-decoder: presence penalty 5.0 is outside [-2, 2]",
        "step": "shaped_step takes a built-in sampler and a Shape without grammar or penalties",
        "pages": [],
    }
