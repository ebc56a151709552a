"""LoRA fine-tuning for AsyncLM (client/asynclm/training): batches sharing a prefix compute the loss
of whole samples; a few steps on the tiny model lower the loss, write a PEFT folder that loads,
and a run resumed from its checkpoint ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from oven.client.asynclm.training.batches import Batch, Weighing, make_batches
from oven.client.asynclm.training.data import DataConfig, build, write
from oven.client.asynclm.training.model import LoraSettings, batch_loss, load_base, with_lora
from oven.client.asynclm.training.segments import Encoder, call_markers, call_spans
from oven.client.asynclm.training.train import CHECKPOINT, TrainConfig, train
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    config = DataConfig(demo_train=12, sources=("demo", "parallel"), group=4)
    records, _ = build("train", config, encoder)
    demo = [r for r in records if r["source"] == "demo"]
    out = tmp_path_factory.mktemp("data")
    write({"train": demo + [r for r in records if r["source"] == "parallel"][:4]}, out, {"args": {"demo_train": 12}})
    return out / "train.jsonl"


def config(data_file, out, **overrides) -> TrainConfig:
    return TrainConfig(**{**dict(data=data_file, out=out, model="tiny", lr=1e-2, warmup_steps=1, batch_samples=4,
                                 epochs=2, lora=LoraSettings(rank=4, alpha=8.0), threads=1, checkpoint_every=2),
                          **overrides})


def records_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_shared_prefix_gives_the_loss_of_whole_samples(data_file):
    torch.manual_seed(0)
    model = with_lora(load_base("tiny", 0)[0], LoraSettings(rank=4, alpha=8.0))
    batches = make_batches(records_of(data_file), 4, 100_000)
    shared = [b for b in batches if b.prefix_ids and len(b.suffix_ids) > 1]
    assert shared and len(shared[0].prefix_ids) > 300  # the demo group's system prompt
    for batch in shared[:2]:
        whole = Batch([], [batch.prefix_ids + s for s in batch.suffix_ids],
                      [[0.0] * len(batch.prefix_ids) + w for w in batch.suffix_weight])
        with torch.no_grad():
            (a, n), (b, m) = batch_loss(model, batch), batch_loss(model, whole)
        assert n == m == batch.num_loss_tokens
        torch.testing.assert_close(a / n, b / m, rtol=1e-5, atol=1e-5)


def test_call_tokens_weigh_call_weight_and_the_loss_is_their_weighted_mean(data_file):
    encoder = Encoder(Tokenizer(resolve_model("tiny").tokenizer))
    markers = call_markers(encoder)
    records = [r for r in records_of(data_file) if r["variant"] != "sync"]
    for record in records:  # one span per call written, each reading as the call it is
        spans = call_spans(record["ids"], record["loss_spans"], markers)
        assert [encoder.decode(record["ids"][a:b]).split(" [HEAD] ")[1].removesuffix(" [END]\n")
                for a, b in spans] == record["calls"]
    weigh = Weighing(3.0, markers)
    weights = weigh(records[0])
    assert set(weights) == {0.0, 1.0, 3.0}
    assert [w > 0 for w in weights] == [w > 0 for w in Weighing()(records[0])]
    torch.manual_seed(0)
    model = with_lora(load_base("tiny", 0)[0], LoraSettings(rank=4, alpha=8.0))
    batch = make_batches(records[:2], 2, 100_000, weigh)[0]
    with torch.no_grad():
        loss, total = batch_loss(model, batch)
        singles = [batch_loss(model, Batch(batch.prefix_ids, [ids], [w]))
                   for ids, w in zip(batch.suffix_ids, batch.suffix_weight)]
    assert total == pytest.approx(sum(sum(w) for w in batch.suffix_weight))
    torch.testing.assert_close(loss, sum(s for s, _ in singles), rtol=1e-4, atol=1e-4)


def test_a_rejected_token_weighs_reject_weight_and_adds_its_unlikelihood(data_file):
    record = next(r for r in records_of(data_file) if r["variant"] == "async")
    position = record["loss_spans"][0][0] + 3
    rejected = (record["ids"][position] + 1) % 100
    corrected = {**record, "corrections": [{"wrote": "x", "instead": "y", "rejected": [position, rejected]}]}
    weigh = Weighing(reject_weight=4.0)
    assert weigh(corrected)[position] == 4.0 and Weighing()(corrected) == weigh(record)
    torch.manual_seed(0)
    model = with_lora(load_base("tiny", 0)[0], LoraSettings(rank=4, alpha=8.0))
    with torch.no_grad():
        plain, plain_weight = batch_loss(model, make_batches([record], 1, 100_000)[0])
        loss, weight = batch_loss(model, make_batches([corrected], 1, 100_000, weigh)[0])
        probs = model(input_ids=torch.tensor([record["ids"]])).logits[0, position - 1].softmax(-1)
    choice = -probs[record["ids"][position]].log()
    assert weight == plain_weight + 3.0
    torch.testing.assert_close(loss, plain + 3.0 * choice - 4.0 * torch.log1p(-probs[rejected]), rtol=1e-4, atol=1e-4)


def test_training_lowers_the_loss_and_writes_a_peft_folder_that_loads(data_file, tmp_path):
    summary = train(config(data_file, tmp_path), progress=False)
    losses = summary["loss_curve"]
    half = len(losses) // 2
    assert summary["steps"] == len(losses) == 2 * len(make_batches(records_of(data_file), 4, 6144))
    assert sum(losses[half:]) / (len(losses) - half) < sum(losses[:half]) / half
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                         "training.json"]
    saved = load_file(tmp_path / "adapter_model.safetensors")
    assert saved and all(t.dtype == torch.bfloat16 for t in saved.values())
    assert json.loads((tmp_path / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    meta = json.loads((tmp_path / "training.json").read_text())
    assert meta["data_sha256"] == json.loads((data_file.parent / "data.json").read_text())["sha256"]
    assert meta["seed"] == 0 and meta["settings"]["lora"]["rank"] == 4 and meta["loss_curve"] == losses

    from peft import PeftModel
    loaded = PeftModel.from_pretrained(load_base("tiny", 0)[0], tmp_path)
    lora = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert len(lora) == len(saved) and all(p.abs().sum() > 0 for n, p in lora.items() if "lora_B" in n)


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(data_file, tmp_path):
    whole = train(config(data_file, tmp_path / "whole"), progress=False)
    stopped = train(config(data_file, tmp_path / "resumed", max_steps=3), progress=False)
    assert (stopped["steps_done"], stopped["complete"], whole["complete"]) == (3, False, True)
    assert stopped["loss_curve"] == whole["loss_curve"][:3]
    assert (tmp_path / "resumed" / CHECKPOINT).is_file()
    assert (tmp_path / "resumed" / "adapter_model.safetensors").is_file()  # the adapter so far
    resumed = train(config(data_file, tmp_path / "resumed"), resume=True, progress=False)
    assert resumed["loss_curve"] == whole["loss_curve"]
    assert not (tmp_path / "resumed" / CHECKPOINT).exists()
    a, b = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("whole", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_other_settings_and_a_missing_checkpoint(data_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        train(config(data_file, tmp_path), resume=True, progress=False)
    train(config(data_file, tmp_path, max_steps=2), progress=False)
    with pytest.raises(ValueError, match="made with other settings"):
        train(config(data_file, tmp_path, lr=5e-3), resume=True, progress=False)


def test_a_second_stage_starts_from_the_first_adapter_and_keeps_its_recipe(data_file, tmp_path):
    first = train(config(data_file, tmp_path / "first", epochs=1), progress=False)
    stage = config(data_file, tmp_path / "second", epochs=1, max_steps=1, lr=1e-9, init=tmp_path / "first")
    second = train(stage, progress=False)
    # At lr 1e-9 one step leaves the weights where the first stage put them (bf16 both times).
    a, b = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("first", "second"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert second["init"]["name"] == "first" and second["init"]["training"]["loss_curve"] == first["loss_curve"]
    assert len(second["init"]["weights_sha256"]) == 64
    assert json.loads((tmp_path / "second" / "training.json").read_text())["init"] == second["init"]
    # The first step of the second stage starts where the first stage's adapter is, not from scratch.
    fresh = train(config(data_file, tmp_path / "fresh", epochs=1, max_steps=1, lr=1e-9), progress=False)
    assert second["loss_curve"][0] < fresh["loss_curve"][0]
    with pytest.raises(ValueError, match="made on other data or from another --init"):
        train(config(data_file, tmp_path / "fresh", epochs=1, lr=1e-9, init=tmp_path / "first"), resume=True,
              progress=False)


def test_a_second_stage_refuses_another_shape_or_a_folder_without_an_adapter(data_file, tmp_path):
    train(config(data_file, tmp_path / "first", epochs=1, max_steps=1), progress=False)
    with pytest.raises(ValueError, match="pass the same --rank"):
        train(config(data_file, tmp_path / "x", lora=LoraSettings(rank=8, alpha=8.0), init=tmp_path / "first"),
              progress=False)
    with pytest.raises(FileNotFoundError, match="not an adapter folder"):
        train(config(data_file, tmp_path / "x", init=tmp_path), progress=False)


def test_the_committed_adapter_is_a_small_bf16_peft_folder_with_its_recipe():
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "client" / "asynclm" / "adapter"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "smollm2-135m-instruct" and config["peft_type"] == "LORA"
    weights = folder / "adapter_model.safetensors"
    assert weights.stat().st_size <= 4 * 2**20
    assert all(t.dtype == torch.bfloat16 for t in load_file(weights).values())
    recipe = json.loads((folder / "training.json").read_text())
    if recipe["command"].startswith("oven asynclm-soup"):  # an average of trained adapters: each keeps its recipe
        assert recipe["rank"] == config["r"] and len(recipe["parts"]) >= 2
        recipes = [part["training"] for part in recipe["parts"]]
    else:
        recipes = [recipe]
    for recipe in recipes:
        assert recipe["command"].startswith("oven asynclm-train") and len(recipe["data_sha256"]) == 64
        assert len(recipe["loss_curve"]) == recipe["steps_done"]
    text = (folder / "training.json").read_text()
    assert not re.findall(r'[\s"=](/[\w.-]+){2,}', text)  # no absolute paths of the machine that trained it


def test_auto_precision_is_bf16_only_where_the_cpu_has_bf16_instructions(data_file, tmp_path):
    from oven.client.asynclm.training.train import native_bf16

    resolved = config(data_file, tmp_path).precision
    assert resolved == ("bf16" if native_bf16() else "fp32")
    assert config(data_file, tmp_path, precision="fp32").settings()["precision"] == "fp32"
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp32"):
        config(data_file, tmp_path, precision="fp16")


def refused(capsys, *argv: str) -> str:
    """Run ``oven *argv``; assert it fails with one ``oven VERB: error:`` line and return that line."""
    from oven.client.cli import main

    assert main(list(argv)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"oven {argv[0]}: error: ") and err.count("\n") == 1, err
    return err.strip()


def test_train_refuses_bad_arguments_and_other_files_before_any_work(data_file, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["asynclm-train", str(data_file), "--out", str(out), "--model", "tiny"]
    (tmp_path / "file").write_text("")
    assert refused(capsys, *args[:2], "--out", str(tmp_path / "file" / "sub"), "--model", "tiny").endswith(
        f"{tmp_path / 'file'} is a file, not a folder")
    assert refused(capsys, *args, "--max-steps", "0").endswith("max_steps must be >= 1, got 0")
    assert refused(capsys, *args, "--threads", "0").endswith("threads must be >= 1, got 0")
    assert refused(capsys, *args, "--resume", "--overwrite").endswith("--overwrite starts again: give one")
    assert refused(capsys, "asynclm-train", str(tmp_path), "--out", str(out)).endswith(
        f"{tmp_path}: a folder, not a JSONL file of samples")
    for text, why in (("garbage\n", "1: not JSON (Expecting value)"),
                      ("[1, 2]\n", "1: not an AsyncLM sample ([1, 2] is not a JSON object)"),
                      ('\n{"a": 1}\n', "2: not an AsyncLM sample (missing 'id')")):
        (tmp_path / "other.jsonl").write_text(text)
        assert refused(capsys, "asynclm-train", str(tmp_path / "other.jsonl"), "--out", str(out)).endswith(
            f"other.jsonl:{why}")
    (tmp_path / "other.jsonl").write_text(json.dumps({**records_of(data_file)[0], "loss_spans": []}) + "\n")
    assert refused(capsys, *args[:1], str(tmp_path / "other.jsonl"), *args[2:]).endswith(
        "no sample has tokens to learn (every loss_spans is empty)")
    assert not out.exists()


def test_a_second_run_into_an_earlier_runs_folder_needs_resume_or_overwrite(data_file, tmp_path, capsys):
    from oven.client.cli import main

    out = tmp_path / "out"
    args = ["asynclm-train", str(data_file), "--out", str(out), "--model", "tiny", "--rank", "4", "--alpha", "8",
            "--threads", "1", "--batch-samples", "4", "--max-steps", "1", "--checkpoint-every", "100"]
    assert main(args) == 0
    capsys.readouterr()  # the progress bar
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert CHECKPOINT in before
    assert refused(capsys, *args).endswith(f"--resume goes on from its {CHECKPOINT}, --overwrite starts again, "
                                           "or give another --out")
    assert refused(capsys, *args, "--init", str(out), "--overwrite").endswith(
        "the run would overwrite the adapter it starts from (--init); give another --out")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*args, "--overwrite", "--seed", "1"]) == 0
    assert json.loads((out / "training.json").read_text())["seed"] == 1
