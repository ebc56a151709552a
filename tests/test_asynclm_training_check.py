"""The in-process AsyncLM loops of the check (training/check.py): a model that writes exactly a
sample's text makes exactly the sample's calls, interrupts and answer, and passes, in each variant;
BFCL calls are judged by the possible answers; the few-shot prompt is the sample's with the worked
example."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from oven.client.asynclm.tools import demo_registry
from oven.client.asynclm.training import protocol
from oven.client.asynclm.training.check import bfcl_calls_right, run_task, same_calls, system_text
from oven.client.asynclm.training.data import DataConfig, build
from oven.client.asynclm.training.segments import Encoder
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model


class Replay:
    """A stand-in causal LM whose best next token is the sample's token at that position (a
    forward without a cache starts over: the sync loop prefills each turn's whole chat)."""

    def __init__(self, ids: list[int], vocab_size: int):
        self.ids, self.vocab_size, self.seen = ids, vocab_size, []

    def __call__(self, input_ids, past_key_values=None, use_cache=True):
        self.seen = (self.seen if past_key_values else []) + input_ids[0].tolist()
        logits = torch.zeros(1, input_ids.shape[1], self.vocab_size)
        if len(self.seen) < len(self.ids):
            logits[0, -1, self.ids[len(self.seen)]] = 1.0
        return SimpleNamespace(logits=logits, past_key_values="cache")


@pytest.mark.parametrize("variant", ["async", "sync-cml", "sync"])
def test_a_model_that_writes_the_sample_reproduces_it_and_passes(variant):
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    records, _ = build("eval", DataConfig(demo_eval=6, sources=("demo",)), encoder)
    demo = [r for r in records if r["source"] == "demo" and r["variant"] == variant]
    assert len(demo) == 6
    for record in demo:
        model = Replay(record["ids"], encoder.tokenizer.vocab_size)
        outcome = run_task(model, encoder, record, demo_registry())
        # everything but the end token, which stops the loop (and, in a sync sample, the chat
        # template's newline after it, the closing of the last turn)
        assert model.seen == record["ids"][:-2 if variant == "sync" else -1]
        assert outcome.calls == record["calls"] and outcome.passed


def test_calls_match_by_value_in_any_order_and_each_once():
    assert same_calls(['convert_currency(amount=250, to_currency="EUR")', 'get_time(timezone="UTC")'],
                      ['get_time(timezone="UTC")', "convert_currency(to_currency='EUR', amount=250.0)"])
    assert not same_calls(['get_time(timezone="UTC")'], ['get_time(timezone="UTC")'] * 2)
    assert not same_calls(['get_time(timezone="UTC"'], ['get_time(timezone="UTC")'])


def test_bfcl_calls_are_judged_by_the_possible_answers():
    truth = [{"spotify.play": {"artist": ["Taylor Swift"], "duration": [20, 20.0]}},
             {"spotify.play": {"artist": ["Maroon 5"], "duration": [15], "shuffle": ["", False]}}]
    assert bfcl_calls_right(["spotify.play(artist='maroon 5', duration=15, shuffle=False)",
                             'spotify.play(artist="Taylor Swift", duration=20)'], truth)
    assert not bfcl_calls_right(['spotify.play(artist="Taylor Swift", duration=20)'], truth)  # one missing
    assert not bfcl_calls_right(['spotify.play(artist="Taylor Swift", duration=20)',
                                 'spotify.play(artist="Maroon 5", duration=16)'], truth)  # a wrong value
    assert not bfcl_calls_right(['spotify.play(artist="Taylor Swift", duration=20)',
                                 'spotify.play(artist="Maroon 5", duration=15, volume=3)'], truth)  # an unknown one
    nested = [{"f": {"where": [{"city": ["Paris", "paris, france"], "zip": ["", "75001"]}]}}]
    assert bfcl_calls_right(['f(where={"city": "Paris, France"})'], nested)
    assert not bfcl_calls_right(['f(where={"city": "Lyon"})'], nested)


def test_the_few_shot_prompt_adds_the_worked_example_to_the_sample_prompt():
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    record = [r for r in build("eval", DataConfig(demo_eval=1, sources=("demo",)), encoder)[0]
              if r["variant"] == "async"][0]
    prompt = encoder.decode(encoder.prompt(system_text(record, example=True), record["question"]).token_ids)
    assert "Example.\nUser: What is the weather in Oslo" in prompt
    assert prompt.replace(protocol.prompt().EXAMPLE + "\n\n", "") == encoder.decode(
        record["ids"][:record["loss_spans"][0][0]])
    sync = [r for r in build("eval", DataConfig(demo_eval=1, sources=("demo",)), encoder)[0]
            if r["variant"] == "sync"][0]
    assert encoder.prompt(system_text(sync), sync["question"]).token_ids == sync["ids"][
        :sync["loss_spans"][0][0]]
    assert "Assistant: get_weather(city=\"Oslo\")\n" in system_text(sync, example=True)
