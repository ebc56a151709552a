"""On-policy samples (training/onpolicy.py): the ideal model corrects each unit the writing model
gets wrong, and only those; a model that writes the ideal sample is never corrected; the
transcript stays one the ideal model would finish."""

from __future__ import annotations

import json
import random

from oven.client.asynclm.training.data import DataConfig, random_timing, tasks_for
from oven.client.asynclm.training.decoder import TransformersDecoder
from oven.client.asynclm.training.model import load_base
from oven.client.asynclm.training.onpolicy import OnPolicySimulation
from oven.client.asynclm.training.segments import Encoder, flatten
from oven.client.asynclm.training.simulate import CmlSimulation
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model


class Replay:
    """A stand-in decoder session whose best next token after a context is ``ids`` at that position."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def ranked(self, context: list[int]) -> list[int]:
        return [self.ids[len(context)]] if len(context) < len(self.ids) else []


def _runs(n: int = 4):
    """``n`` held-out demo tasks, each with a clock and its ideal transcript's ids."""
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    for task in tasks_for("eval", DataConfig(demo_eval=n, sources=("demo",))):
        timing = random_timing(task, "async", encoder, random.Random(task.task_id))
        ideal = CmlSimulation(task, encoder, timing, "async").run()
        yield encoder, task, timing, ideal, flatten(ideal.segments)[0]


def test_a_model_that_writes_the_ideal_sample_is_never_corrected():
    for encoder, task, timing, ideal, ids in _runs():
        run = OnPolicySimulation(task, encoder, timing, Replay(ids))
        transcript = run.run()
        assert run.corrections == []
        assert flatten(transcript.segments) == flatten(ideal.segments) and transcript.calls == ideal.calls


def test_one_wrong_token_is_one_correction_and_the_ideal_unit_replaces_it():
    for encoder, task, timing, ideal, ids in _runs():
        if not ideal.calls:
            continue
        spans = flatten(ideal.segments)[1]
        wrong = list(ids)
        at = spans[0][0] + 4  # inside the first call: its id or function's name
        wrong[at] = encoder.encode(" zzz")[0]
        run = OnPolicySimulation(task, encoder, timing, Replay(wrong))
        transcript = run.run()
        assert len(run.corrections) == 1
        assert run.corrections[0]["instead"] == encoder.decode(ids[spans[0][0]:]).split("\n")[0] + "\n"
        assert run.corrections[0]["wrote"] != run.corrections[0]["instead"]
        assert run.corrections[0]["rejected"] == [at, wrong[at]]  # where the sample has the right token
        assert flatten(transcript.segments) == flatten(ideal.segments)


def test_a_correction_keeps_the_models_tokens_up_to_its_error_when_another_unit_allows_them():
    """The model starts a ready call that is not the ideal's first choice, then errs in it: the
    correction is that call (the model's own choice), and the rejection is the wrong token."""
    for encoder, task, timing, ideal, ids in _runs(12):
        first = CmlSimulation(task, encoder, timing, "async")
        first.segments = [encoder.prompt(first.prompt.system_prompt(first.registry.describe()), task.question)]
        ready = [i for i, chain in enumerate(first.chains) if chain.ready]
        if len(ready) < 2:
            continue
        ready.sort(key=lambda i: -first._estimate_ms(first._next_call(i)))
        other = first.prompt.call_text("t1", first._next_call(ready[1]))
        start = flatten(ideal.segments)[1][0][0]
        other_ids = encoder.encode(other)
        wrong = ids[:start] + other_ids[:-3] + [encoder.encode(" zzz")[0]] + other_ids[-2:] + ids[start + len(other_ids):]
        run = OnPolicySimulation(task, encoder, timing, Replay(wrong))
        run.run()
        assert run.corrections[0]["instead"] == other
        assert run.corrections[0]["rejected"] == [start + len(other_ids) - 3, encoder.encode(" zzz")[0]]
        assert run.calls[0] == first._next_call(ready[1])
        return
    raise AssertionError("no held-out task with two calls ready at the start")


def test_a_random_model_leaves_a_transcript_with_the_ideal_calls_and_facts():
    session = TransformersDecoder(load_base("tiny", 0)[0]).session()
    for encoder, task, timing, ideal, _ in list(_runs(2)):
        run = OnPolicySimulation(task, encoder, timing, session)
        transcript = run.run()
        assert run.corrections
        assert sorted(transcript.calls) == sorted(ideal.calls) and transcript.facts == ideal.facts


def test_the_verb_writes_corrected_samples_repeated_and_replayed_ones(tmp_path):
    from harness import oven

    from oven.client.asynclm.training.data import build, read_records, write
    from oven.client.asynclm.training.model import LoraSettings, with_lora

    model, _ = load_base("tiny", 0)
    with_lora(model, LoraSettings(rank=4)).save_pretrained(tmp_path / "adapter")
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    ideal, _ = build("train", DataConfig(demo_train=4, sources=("demo",)), encoder)
    write({"train": ideal}, tmp_path / "ideal", {})
    common = ["asynclm-onpolicy", "--adapter", str(tmp_path / "adapter"), "--seed", "3", "--tasks", "2",
              "--parallel", "2", "--model", "tiny"]
    done = oven(*common, "--out", str(tmp_path / "out"), "--repeat", "2", "--replay",
                str(tmp_path / "ideal" / "train.jsonl"), "--replay-samples", "3", "--contrast", "1")
    assert done.returncode == 0, done.stderr
    samples = read_records(tmp_path / "out" / "train.jsonl")
    corrected = [s for s in samples if "corrections" in s]
    assert len(corrected) == 4 and corrected[0] == corrected[1] and corrected[2] == corrected[3]  # random weights
    assert all(s["corrections"] and s["loss_spans"] for s in corrected)
    assert len(samples) == 7 and all(s in ideal for s in samples[4:])
    assert "2 of 2 tasks corrected" in done.stdout
    assert json.loads((tmp_path / "out" / "data.json").read_text())["args"]["contrast"] == 1.0

    refused = oven(*common, "--out", str(tmp_path / "bad"), "--replay-samples", "3")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().startswith("oven asynclm-onpolicy: error: --repeat must be")

    # --rollouts mixes the corrected samples of that run again (each once, then --repeat) with a new replay,
    # and records the run they came from instead of rollout options it did not use.
    again = oven("asynclm-onpolicy", "--rollouts", str(tmp_path / "out"), "--out", str(tmp_path / "again"),
                 "--seed", "4", "--repeat", "3", "--model", "tiny")
    assert again.returncode == 0, again.stderr
    assert read_records(tmp_path / "again" / "train.jsonl") == [corrected[0]] * 3 + [corrected[2]] * 3
    args = json.loads((tmp_path / "again" / "data.json").read_text())["args"]
    assert args["rollouts_of"]["seed"] == 3 and args["rollouts_of"]["contrast"] == 1.0 and "contrast" not in args
    both = oven(*common, "--rollouts", str(tmp_path / "out"), "--out", str(tmp_path / "both"))
    assert both.returncode == 1 and both.stderr.strip() == ("oven asynclm-onpolicy: error: give either --adapter "
                                                            "(run it) or --rollouts (an earlier run's samples)")


def test_the_verb_rolls_out_bfcl_compositions_with_source(tmp_path):
    """--source multi_step_parallel draws compositions of BFCL training first turns; a random model is
    corrected into a sample that makes the composition's calls."""
    from harness import oven

    from oven.client.asynclm.training.data import read_records
    from oven.client.asynclm.training.model import LoraSettings, with_lora

    model, _ = load_base("tiny", 0)
    with_lora(model, LoraSettings(rank=4)).save_pretrained(tmp_path / "adapter")
    done = oven("asynclm-onpolicy", "--adapter", str(tmp_path / "adapter"), "--seed", "3", "--tasks", "1",
                "--parallel", "1", "--model", "tiny", "--source", "multi_step_parallel", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    (sample,) = read_records(tmp_path / "out" / "train.jsonl")
    (task,) = tasks_for("train", DataConfig(seed=3, multi_step_train=1, sources=("multi_step_parallel",)))
    assert sample["source"] == "multi_step_parallel" and sample["corrections"] and sample["loss_spans"]
    assert sorted(sample["calls"]) == sorted(s.call(k, []) for s in task.subtasks for k in range(len(s.steps)))
    assert json.loads((tmp_path / "out" / "data.json").read_text())["args"]["source"] == "multi_step_parallel"


def test_the_verb_refuses_bad_inputs_in_one_line_naming_them_before_the_engine_starts(tmp_path, capsys):
    from oven.client.asynclm.training.model import LoraSettings, with_lora
    from oven.client.cli import main

    def refused(*argv: str) -> str:
        assert main(["asynclm-onpolicy", "--seed", "3", "--model", "tiny", *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("oven asynclm-onpolicy: error: ") and err.count("\n") == 1, err
        return err.strip().removeprefix("oven asynclm-onpolicy: error: ")

    adapter, out = tmp_path / "adapter", str(tmp_path / "out")
    with_lora(load_base("tiny", 0)[0], LoraSettings(rank=4)).save_pretrained(adapter)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text("{")
    assert refused("--adapter", str(tmp_path / "bad"), "--out", out).startswith(
        f"{tmp_path / 'bad'}: adapter_config.json is not valid JSON")
    assert refused("--adapter", str(adapter), "--out", out, "--exclude", "/nonexist") == \
        "--exclude: /nonexist: no such file"
    assert refused("--adapter", str(adapter), "--out", out, "--replay", "/nonexist", "--replay-samples", "1") == \
        "--replay: /nonexist: no such file"
    assert refused("--adapter", str(adapter), "--out", out, "--threads", "0") == \
        "tasks, parallel and threads must be >= 1, got 200, 32 and 0"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "train.jsonl").write_text("mine\n")
    assert refused("--adapter", str(adapter), "--out", str(earlier)) == (
        f"--out {earlier} holds an earlier run's train.jsonl: --overwrite writes over it, or give another --out")
    assert refused("--adapter", str(adapter), "--out", str(earlier), "--overwrite", "--replay",
                   str(earlier / "train.jsonl")) == f"--out {earlier}: this run reads its train.jsonl; give another --out"
    assert (earlier / "train.jsonl").read_text() == "mine\n" and not (tmp_path / "out").exists()
