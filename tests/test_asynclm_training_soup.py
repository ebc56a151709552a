"""``oven asynclm-soup``: the weighted average of LoRA adapters' weight deltas as one PEFT adapter.
At the parts' summed rank it is exact; at a lower rank it is the SVD truncation of that average;
bad parts are refused with one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from oven.client.asynclm.training.model import LoraSettings, load_base, with_lora
from oven.client.asynclm.training.soup import SoupConfig, make_soup
from oven.client.asynclm.training.train import save_adapter
from oven.client.cli import main

TARGETS = ("q_proj", "v_proj", "down_proj")


def random_adapter(folder, seed: int, rank: int = 4, alpha: float = 8.0) -> None:
    """A tiny-model LoRA adapter with random A and B (PEFT starts B at zero), saved as training saves."""
    model = with_lora(load_base("tiny", 0)[0], LoraSettings(rank=rank, alpha=alpha, targets=TARGETS))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    save_adapter(model, folder, "tiny")
    (folder / "training.json").write_text(json.dumps({"command": f"made with seed {seed}"}))


def deltas(folder) -> dict[str, torch.Tensor]:
    """Per projection: B·A·scale, the weight delta the adapter adds."""
    config = json.loads((folder / "adapter_config.json").read_text())
    weights = {k: v.float() for k, v in load_file(folder / "adapter_model.safetensors").items()}
    scale = config["lora_alpha"] / config["r"]
    return {k.replace(".lora_A.weight", ""): weights[k.replace(".lora_A.", ".lora_B.")] @ weights[k] * scale
            for k in weights if ".lora_A." in k}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    for i, (seed, alpha) in enumerate(((1, 8.0), (2, 16.0), (3, 8.0))):
        random_adapter(root / f"a{i}", seed, alpha=alpha)
    return root / "a0", root / "a1", root / "a2"


def test_at_the_summed_rank_the_soup_is_the_weighted_average_of_the_deltas(parts, tmp_path):
    parts = parts[:2]  # alphas 8 and 16: PEFT's own scale (lora_alpha = rank)
    record = make_soup(SoupConfig(parts=parts, out=tmp_path, model="tiny", weights=(0.25, 0.75), rank=8))
    want = {k: 0.25 * d0 + 0.75 * d1 for (k, d0), d1 in zip(deltas(parts[0]).items(), deltas(parts[1]).values())}
    got = deltas(tmp_path)
    assert got.keys() == want.keys() and len(got) == 2 * 3  # two tiny layers, three targets
    for k in want:  # bf16 storage
        assert torch.allclose(got[k], want[k], atol=2e-3, rtol=2e-2), k
    assert [p["name"] for p in record["parts"]] == ["a0", "a1"] and record["rank"] == 8
    assert record["parts"][1]["training"] == {"command": "made with seed 2"}
    assert len(record["parts"][0]["weights_sha256"]) == 64
    assert json.loads((tmp_path / "training.json").read_text()) == record
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                         "training.json"]
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny" and sorted(config["target_modules"]) == sorted(TARGETS)


def test_at_a_lower_rank_the_soup_is_the_svd_truncation_of_the_average(parts, tmp_path):
    parts = parts[0], parts[2]  # both alpha 8, which the soup keeps (a next stage's --alpha)
    make_soup(SoupConfig(parts=parts, out=tmp_path, model="tiny"))  # default: equal weights, the parts' rank
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    got = deltas(tmp_path)
    for (k, d0), d1 in zip(deltas(parts[0]).items(), deltas(parts[1]).values()):
        u, s, vh = torch.linalg.svd((d0 + d1) / 2, full_matrices=False)
        best = u[:, :4] * s[:4] @ vh[:4]
        assert torch.allclose(got[k], best, atol=2e-3, rtol=2e-2), k


def test_bad_soups_are_refused_with_one_line(parts, tmp_path, capsys):
    with pytest.raises(ValueError, match="at least two adapters"):
        SoupConfig(parts=parts[:1], out=tmp_path, model="tiny")
    with pytest.raises(ValueError, match="1 weights for 3 adapters"):
        SoupConfig(parts=parts, out=tmp_path, model="tiny", weights=(1.0,))
    with pytest.raises(ValueError, match="would overwrite one of its parts"):
        SoupConfig(parts=parts, out=parts[1], model="tiny")
    with pytest.raises(ValueError, match="an adapter of 'tiny', not of 'smollm2-135m-instruct'"):
        make_soup(SoupConfig(parts=parts, out=tmp_path / "s", model="smollm2-135m-instruct"))
    assert main(["asynclm-soup", str(parts[0]), str(tmp_path), "--out", str(tmp_path / "s"), "--model", "tiny"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("oven asynclm-soup: error: ") and "not a PEFT adapter folder" in err
    assert err.count("\n") == 1 and not (tmp_path / "s").exists()


def refused(capsys, *argv: str) -> str:
    assert main(["asynclm-soup", *argv, "--model", "tiny"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("oven asynclm-soup: error: ") and err.count("\n") == 1, err
    return err.strip()


def test_a_soup_that_cannot_be_made_or_adds_nothing_is_refused_before_any_work(parts, tmp_path, capsys):
    a, b = str(parts[0]), str(parts[1])
    out = str(tmp_path / "s")
    (tmp_path / "file").write_text("")
    assert refused(capsys, a, b, "--out", str(tmp_path / "file")).endswith("is a file, not a folder")
    assert refused(capsys, a, b, "--out", out, "--weights", "0,0").endswith(
        "weights 0, 0: an average needs finite weights with a sum other than 0")
    assert refused(capsys, a, b, "--out", out, "--weights", "1,x").endswith(
        "--weights 1,x: expected numbers separated by commas")
    # tiny: k_proj and v_proj map 64 features to 32; the parts' ranks (4 each) sum to 8
    assert refused(capsys, a, b, "--out", out, "--rank", "100000").endswith(
        "rank 100000: at most 8 here (the parts' ranks sum to 8, the smallest target matrix has 32 rows or columns); "
        "more adds nothing")
    other = tmp_path / "other"  # an adapter of a model with other shapes
    random_adapter(other, 4)
    weights = load_file(other / "adapter_model.safetensors")
    key = next(k for k in weights if "q_proj.lora_A" in k)
    weights[key] = weights[key][:, :32].contiguous()
    save_file(weights, other / "adapter_model.safetensors")
    assert refused(capsys, a, str(other), "--out", out).endswith(
        f"{other}: its LoRA of model.layers.0.self_attn.q_proj is 32x64 (in x out), that of --model tiny 64x64: "
        "an adapter of another model")
    assert not (tmp_path / "s").exists()


def test_a_soup_writes_over_an_earlier_one_only_with_overwrite(parts, tmp_path, capsys):
    a, b = str(parts[0]), str(parts[1])
    assert main(["asynclm-soup", a, b, "--out", str(tmp_path), "--model", "tiny", "--weights", "1,0"]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert refused(capsys, a, b, "--out", str(tmp_path)).endswith(
        "holds an earlier run's adapter_config.json, adapter_model.safetensors, training.json: --overwrite writes "
        "over it, or give another --out")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert main(["asynclm-soup", a, b, "--out", str(tmp_path), "--model", "tiny", "--overwrite"]) == 0
    assert [p["weight"] for p in json.loads((tmp_path / "training.json").read_text())["parts"]] == [0.5, 0.5]
