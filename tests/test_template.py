"""inferlets/template on SmolLM2 against greedy decoding from scratch.

Each hole's context is rebuilt here from the template's pieces, each tokenized on its own (the chat turn,
the fixed text without the spaces that end it, then the spaces and the value, ...); a plain hole's
tokens must be greedy decoding of that context straight from the inference process, stopped at the
first newline, end token or first word or mark of the text after the hole, and its value that text cut
there; a pattern's hole must end with an end token and match its pattern.
"""

from __future__ import annotations

import json
import re

import pytest
from harness import direct_greedy, messages, refused, run

from oven.control.tokenizer import Tokenizer

INFERENCE_MODEL = "smollm2-135m-instruct"  # a real model: its lines end, and its values read as values
PROGRAMS = ["template"]
TEMPLATE = "Name: {name}\nHome: {city}, {country}\nAge: {age:[0-9]{1,2}}\n"
PIECES = [("Name:", " "), ("\nHome:", " "), (",", " "), ("\nAge:", " ")]  # fixed text, then its spaces
AFTER = [None, ",", None, None]  # where a plain hole ends besides a newline: the next word or mark
PROMPT = "Describe a fictional person."


def filled(loop, *args: str) -> dict:
    (inst,) = run(loop, "template", [list(args)])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def first_end(text: str, ends: list[str]) -> int | None:
    found = [at for at in map(text.find, ends) if at >= 0]
    return min(found) if found else None


def test_each_hole_is_greedy_from_scratch_after_the_template_so_far(loop, inference):
    report = filled(loop, TEMPLATE, PROMPT, "--chat", "--max-tokens", "12")
    tok = Tokenizer(loop.info.tokenizer)
    stops = tok.stop_token_ids
    context = tok.encode_chat([{"role": "user", "content": PROMPT}])
    assert [h["name"] for h in report["holes"]] == ["name", "city", "country", "age"]
    for hole, (text, space), after in zip(report["holes"], PIECES, AFTER):
        context = context + tok.encode(text)
        assert hole["context"] == context, hole["name"]
        drawn = hole["tokens"]
        if hole["name"] == "age":  # the grammar: the space, one or two digits, then the end
            assert drawn[-1] in stops and re.fullmatch("[0-9]{1,2}", hole["value"])
            assert tok.decode(drawn[:-1]) == space + hole["value"]
        else:
            assert drawn == direct_greedy(inference, loop, context, len(drawn)), hole["name"]
            ends = ["\n", after] if after else ["\n"]
            assert first_end(tok.decode(drawn[:-1]), ends) is None  # it stopped at its first end
            if drawn[-1] in stops:
                written = tok.decode(drawn[:-1])
            else:
                written = tok.decode(drawn)
                assert first_end(written, ends) is not None
                written = written[:first_end(written, ends)]
            assert hole["value"] == written.removeprefix(space) and hole["value"].strip()
            assert "," not in hole["value"] or hole["name"] != "city"
        context = context + tok.encode(space + hole["value"])
    fields = report["fields"]
    assert fields == {h["name"]: h["value"] for h in report["holes"]}
    assert report["text"] == TEMPLATE.replace("{age:[0-9]{1,2}}", "{age}").format(**fields)
    assert report["unfinished"] == []
    assert report["fixed_tokens"] == sum(len(tok.encode(text)) for text, _ in PIECES)
    assert report["drawn_tokens"] == sum(len(h["tokens"]) for h in report["holes"])


def test_a_hole_that_runs_out_of_tokens_is_unfinished_and_a_seed_repeats(loop, inference):
    report = filled(loop, "Once upon a time {story}", "--max-tokens", "3")
    (hole,) = report["holes"]
    tok = Tokenizer(loop.info.tokenizer)
    assert hole["context"] == tok.encode("Once upon a time")
    assert hole["tokens"] == direct_greedy(inference, loop, hole["context"], 3)
    assert "\n" not in tok.decode(hole["tokens"])  # the line went on: no end within 3 tokens
    assert report["unfinished"] == ["story"] and report["text"] == "Once upon a time " + hole["value"]
    seeded = ["Once upon a time {story}", "--max-tokens", "3", "--temperature", "1.5", "--seed", "7"]
    first, again = [json.loads(messages(loop, inst)[0]) for inst in run(loop, "template", [seeded, seeded])]
    assert first["holes"][0]["tokens"] == again["holes"][0]["tokens"] != hole["tokens"]  # seeded, not greedy


@pytest.mark.parametrize("args, error", [
    (["Plain text."], "TEMPLATE has no hole: {name} or {name:REGEX}"),
    (["{a} and {a}", "p"], "TEMPLATE: the hole 'a' appears twice"),
    (["A {0}"], "TEMPLATE: a hole is {name} or {name:REGEX}, name a Python identifier; not {0}"),
    (["A {a!r}"], "TEMPLATE: a hole is {name} or {name:REGEX}, name a Python identifier; not {a!r}"),
    (["A {a"], "TEMPLATE: expected '}' before end of string (write {{ and }} for literal braces)"),
    (["{a} b"], "the first hole needs text before it: a PROMPT or fixed text at the template's start"),
    (["A {a:(}"], """the hole 'a': regex: at 1(8): invalid regex "(" (in regex)"""),  # the pattern as given
    (["A {a}", "--max-tokens", "0"], "argument --max-tokens: expected a whole number >= 1, not '0'"),
])
def test_bad_templates_are_refused(loop, args, error):
    (stderr,) = refused(loop, "template", [args])
    assert stderr.startswith("usage: template [-h] [--chat]")
    assert f"template: error: {error}" in stderr and stderr.endswith("\n")
