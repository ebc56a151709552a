"""Shared fixtures. Every test runs on the CPU with one torch thread (two are erratic on CI machines)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["OVEN_TORCH_THREADS"] = "1"  # inherited by spawned inference processes

import pytest
import torch

torch.set_num_threads(1)

from oven.inference.config import InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402

MODELS = ["tiny", "smollm2-135m-instruct"]


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or -n 0), before any worker starts
        from harness import prune_program_dir

        prune_program_dir()


def make_engine(model: str, **overrides) -> Engine:
    cfg = dict(model=model, device="cpu", num_kv_pages=64, num_host_pages=16, num_embeds=1024, torch_threads=1)
    cfg.update(overrides)
    return Engine(InferenceConfig(**cfg), progress=False)


def hf_reference(engine: Engine):
    """transformers' LlamaForCausalLM holding exactly the engine's weights."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(engine.source.hf_config).to(engine.dtype).eval()
    result = hf.load_state_dict(engine.model.state_dict(), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    head = engine.model.lm_head or engine.model.model.embed_tokens
    assert torch.equal(hf.lm_head.weight, head.weight)
    return hf


def write_adapter(folder, cfg, targets=("q_proj", "v_proj"), r: int = 4, num_layers: int | None = None,
                  config: dict | None = None, extra: dict | None = None) -> None:
    """A PEFT-format folder written by hand, shaped for ``cfg`` (a ModelConfig), so each test can break one
    thing. Random weights: its logits differ from the base model's."""
    import torch
    from safetensors.torch import save_file

    from oven.inference.adapters import projection_shapes

    folder.mkdir(parents=True, exist_ok=True)
    shapes = projection_shapes(cfg)
    tensors = {}
    for layer in range(num_layers if num_layers is not None else cfg.num_layers):
        for proj in targets:
            block = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{proj}"
            fan_in, fan_out = shapes[proj]
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, fan_in)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, r)
    tensors.update(extra or {})
    save_file(tensors, folder / "adapter_model.safetensors")
    base = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": list(targets), "bias": "none",
            "use_dora": False, "modules_to_save": None, "use_rslora": False}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **(config or {})}))


@pytest.fixture(scope="session", params=MODELS)
def engine_and_hf(request):
    engine = make_engine(request.param)
    return engine, hf_reference(engine)


@pytest.fixture(scope="session")
def tiny_engine():
    return make_engine("tiny")


@pytest.fixture(scope="session")
def tokenizer_donor(tmp_path_factory) -> str:
    """A folder for ``$OVEN_TOKENIZER_DONOR`` (the embedded model's tokenizer, no weights): a test that
    points ``OVEN_CACHE_DIR`` at a fresh folder sets it, so the tiny model there converts no 517 MB model."""
    from oven.inference.models import export_tokenizer_donor

    return str(export_tokenizer_donor(tmp_path_factory.mktemp("donor")))


@pytest.fixture(scope="module")
def inference(request):
    """A real inference process, one per test module: on the module's ``INFERENCE_MODEL`` (default
    the tiny model)."""
    from harness import tiny_inference

    with tiny_inference(model=getattr(request.module, "INFERENCE_MODEL", "tiny")) as process:
        yield process


@pytest.fixture(scope="module")
def loop_config(request) -> dict:
    """Setting overrides for the module's ``loop``: its ``LOOP_CONFIG``, or a module's own ``loop_config``
    fixture where they depend on other fixtures (a tool server's port, say)."""
    return getattr(request.module, "LOOP_CONFIG", {})


@pytest.fixture(scope="module")
def loop(inference, loop_config, request):
    """A ControlLoop over ``inference`` holding the module's ``PROGRAMS``."""
    from harness import control_loop

    config = dict(loop_config)
    with control_loop(inference, config.pop("program_dir", None), getattr(request.module, "PROGRAMS", []),
                      **config) as control:
        yield control
