"""The in-process AsyncLM loops of the check (training/check.py): a model that writes exactly a
sample's text makes exactly the sample's calls, interrupts and answer, and passes, in each variant;
BFCL calls are judged by the possible answers; the few-shot prompt is the sample's with the worked
example."""

from __future__ import annotations

import pytest

import torch

from oven.client.asynclm.tools import demo_registry
from oven.client.asynclm.training import protocol
from oven.client.asynclm.training.check import bfcl_calls_right, judged, run_task, same_calls, system_text
from oven.client.asynclm.training.data import DataConfig, build
from oven.client.asynclm.training.segments import Encoder
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model


class Replay:
    """A stand-in decoder whose best next token after a context is the sample's token at that
    position (the sync loop asks with each turn's whole chat)."""

    def __init__(self, ids: list[int]):
        self.ids, self.seen = ids, []

    def session(self):
        return self

    def ranked(self, ids: list[int]) -> list[int]:
        self.seen = list(ids)
        return [self.ids[len(ids)]] if len(ids) < len(self.ids) else []

    def close(self) -> None:
        pass


@pytest.mark.parametrize("variant", ["async", "sync-cml", "sync"])
def test_a_model_that_writes_the_sample_reproduces_it_and_passes(variant):
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    records, _ = build("eval", DataConfig(demo_eval=6, sources=("demo",)), encoder)
    demo = [r for r in records if r["source"] == "demo" and r["variant"] == variant]
    assert len(demo) == 6
    for record in demo:
        model = Replay(record["ids"])
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
    # BFCL's multi-turn ground truth passes some arguments by position: with the tools, a call is
    # the same whichever way its arguments are written
    assert not same_calls(['get_time(timezone="UTC")'], ['get_time("UTC")'])
    assert same_calls(['get_time(timezone="UTC")'], ['get_time("UTC")'], demo_registry())
    assert not same_calls(['get_time(timezone="UTC")'], ['get_time("CET")'], demo_registry())


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


def test_a_task_that_needs_no_call_passes_only_without_one_in_calls_or_prose():
    registry, record = demo_registry(), {"source": "demo", "calls": [], "facts": []}
    assert judged(record, [], "None of my functions can help with this request.", registry) == (True, True)
    assert judged(record, ['get_weather(city=" the sea")'], "", registry)[0] is False
    for prose in ('get_weather(city=" the sea")', "I would call get_time (timezone='UTC') [END"):
        assert judged(record, [], prose, registry)[0] is False
    assert registry.calls_written_in("my_get_time(x) and the time get_time( and get_weather") == ["get_time"]


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


def test_the_engine_decoder_batching_many_tasks_decides_as_transformers_one_at_a_time(tmp_path):
    """The same greedy sessions on oven's paged engine, four tasks batched, and on transformers +
    PEFT one at a time, on the same weights: the tiny model with a random adapter (its B matrices
    made non-zero)."""
    from conftest import hf_reference
    from peft import PeftModel

    from oven.client.asynclm.training.check import check
    from oven.client.asynclm.training.decoder import EngineDecoder, TransformersDecoder
    from oven.client.asynclm.training.model import LoraSettings, load_base, with_lora

    torch.manual_seed(1)
    lora = with_lora(load_base("tiny", 0)[0], LoraSettings(rank=4, alpha=8.0, targets=("q_proj", "v_proj")))
    with torch.no_grad():
        for name, weight in lora.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.5)
    lora.save_pretrained(tmp_path)
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    records = [r for r in build("eval", DataConfig(demo_eval=4, sources=("demo",)), encoder)[0]
               if r["variant"] in ("async", "sync")]
    engine = EngineDecoder("tiny", tmp_path, max_sessions=4, threads=1)
    try:
        batched = check(engine, encoder, records, lambda r: demo_registry(), log=lambda line: None)
        model = PeftModel.from_pretrained(hf_reference(engine.engine), str(tmp_path))
    finally:
        engine.close()
    alone = check(TransformersDecoder(model), encoder, records, lambda r: demo_registry(), log=lambda line: None)
    assert [(o.calls, o.text) for o in batched] == [(o.calls, o.text) for o in alone]
    assert len({o.text for o in alone}) == len(records)  # each wrote its own text: not empty against empty
