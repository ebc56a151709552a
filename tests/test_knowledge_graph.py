"""inferlets/knowledge-graph on SmolLM2: its extraction is what `constrained` writes with the same regex
and user turn (the same grammar machinery), its triples, seeds and facts are this file's parse and
breadth-first walk of that text, and its answer is greedy decoding from scratch of the user turn
built here from those facts."""

from __future__ import annotations

import json

import pytest
from harness import assert_pools_full, direct_greedy, messages, refused, run

from oven.control.tokenizer import Tokenizer

INFERENCE_MODEL = "smollm2-135m-instruct"  # a real model: under the grammar its lines are facts
PROGRAMS = ["knowledge-graph", "constrained"]
PASSAGE = ("Paris is the capital of France. The Eiffel Tower is a landmark in Paris. Berlin is the capital of "
           "Germany. The Brandenburg Gate is a landmark in Berlin. France borders Germany.")
QUESTION = "Which landmark is in the capital of France?"
MAX_FACTS = 4


def host_walk(triples: list[list[str]], seeds: list[str], depth: int) -> list[str]:
    """Each triple with an end at most depth - 1 hops from a seed (names compared casefolded)."""
    hops = {seed.casefold(): 0 for seed in seeds}
    for hop in range(1, depth):
        for subject, _, obj in triples:
            for a, b in ((subject.casefold(), obj.casefold()), (obj.casefold(), subject.casefold())):
                if hops.get(a) == hop - 1 and b not in hops:
                    hops[b] = hop
    near = [t for t in triples if t[0].casefold() in hops or t[2].casefold() in hops]
    return sorted({" ".join(t) for t in near})


@pytest.fixture(scope="module")
def reports(loop):
    args = [PASSAGE, QUESTION, "--max-facts", str(MAX_FACTS)]
    instances = run(loop, "knowledge-graph", [args, args + ["--entity", "paris", "--depth", "1"]], timeout_s=600)
    for inst in instances:
        assert inst.exit_code == 0, inst.error
    return [json.loads(messages(loop, inst)[0]) for inst in instances]


def test_the_extraction_is_constrained_decoding_of_the_same_turn(loop, reports):
    found, by_paris = reports
    assert by_paris["extraction"] == found["extraction"]  # greedy: the same text again
    extraction = found["extraction"]
    assert PASSAGE in extraction["prompt"]
    (inst,) = run(loop, "constrained", [["regex", extraction["pattern"], extraction["prompt"], str(MAX_FACTS * 32),
                                         "--chat"]], timeout_s=600)
    assert inst.exit_code == 0, inst.error
    assert messages(loop, inst)[0] == extraction["text"]


def test_triples_seeds_facts_and_the_answer(loop, inference, reports):
    tok = Tokenizer(loop.info.tokenizer)
    found, by_paris = reports
    lines = found["extraction"]["text"].splitlines()
    triples = [[part.strip() for part in line.split("|")] for line in lines]
    assert found["triples"] == triples and 2 <= len(triples) <= MAX_FACTS
    names = {name.casefold(): name for t in triples for name in (t[0], t[2])}
    assert found["seeds"] == [name for key, name in names.items() if key in QUESTION.casefold()] == ["France"]
    assert found["facts"] == host_walk(triples, ["France"], 2) and found["facts"]
    assert by_paris["seeds"] == ["paris"] and by_paris["facts"] == host_walk(triples, ["paris"], 1)
    for report in reports:
        answer = report["answer"]
        facts = "\n".join(f"- {fact}" for fact in report["facts"]) or "(none)"
        assert answer["prompt"] == f"Facts:\n{facts}\n\nAnswer from these facts only. {QUESTION}"
        prompt = tok.encode_chat([{"role": "user", "content": answer["prompt"]}])
        assert answer["tokens"] == direct_greedy(inference, loop, prompt, len(answer["tokens"]))
        assert answer["text"] == tok.decode([t for t in answer["tokens"] if t not in tok.stop_token_ids])
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    ([PASSAGE], "the following arguments are required: QUESTION"),
    ([PASSAGE, " "], "argument QUESTION: must not be empty"),
    ([PASSAGE, QUESTION, "--depth", "0"], "argument --depth: expected a whole number from 1 to 8, not '0'"),
    ([PASSAGE, QUESTION, "--max-facts", "65"], "argument --max-facts: expected a whole number from 1 to 64, not '65'"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "knowledge-graph", [args])
    assert stderr.startswith("usage: knowledge-graph [-h]") and stderr.endswith(f"knowledge-graph: error: {error}\n")
