"""Shared fixtures. Every test runs on the CPU with one torch thread (two are erratic on CI machines)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["OVEN_TORCH_THREADS"] = "1"  # inherited by spawned inference processes

import pytest
import torch

torch.set_num_threads(1)

from oven.inference.config import InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402

MODELS = ["tiny", "smollm2-135m-instruct"]


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


@pytest.fixture(scope="session", params=MODELS)
def engine_and_hf(request):
    engine = make_engine(request.param)
    return engine, hf_reference(engine)


@pytest.fixture(scope="session")
def tiny_engine():
    return make_engine("tiny")


@pytest.fixture(scope="module")
def inference():
    """A real inference process on the tiny model, one per test module."""
    from harness import tiny_inference

    with tiny_inference() as process:
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

    with control_loop(inference, None, getattr(request.module, "PROGRAMS", []), **loop_config) as control:
        yield control
