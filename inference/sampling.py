"""Drawing a token in this process with the SDK's own samplers, so it is the token the inferlet would draw.

The samplers and their generator are the Python SDK's module (``sdk/python/inferlet/sampling.py``,
specified in sdk/README.md "Seeded sampling"), loaded here by file: one implementation of the
spec on this side, not a copy that could drift. It is loaded without its package because the
package's ``__init__`` imports the host bindings that exist only inside wasm; the module itself
needs nothing but the standard library.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from oven.proto import inference as p

from .validate import ItemFailure

_MASK64 = (1 << 64) - 1


def _load_sdk_sampling():
    spec = importlib.util.find_spec("oven.sdk")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("package data oven.sdk is missing: reinstall oven")
    path = Path(next(iter(spec.submodule_search_locations))) / "python" / "inferlet" / "sampling.py"
    module_spec = importlib.util.spec_from_file_location("oven.inference._sdk_sampling", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return module


sdk = _load_sdk_sampling()


def make_sampler(spec: p.SampleSpec):
    """The SDK sampler ``spec`` names, its generator at ``spec.rng_state``; ItemFailure (bad_argument)
    for a kind or a parameter the SDK would refuse."""
    try:
        if spec.kind == p.SAMPLE_GREEDY:
            return sdk.Greedy()
        if not 0 <= spec.rng_state <= _MASK64:
            raise ValueError("rng_state must be an unsigned 64-bit integer")
        if spec.kind == p.SAMPLE_TEMPERATURE:
            sampler = sdk.Temperature(spec.temperature)
        elif spec.kind == p.SAMPLE_TOP_K:
            if spec.param != int(spec.param):
                raise ValueError("top_k's k must be a whole number")
            sampler = sdk.TopK(int(spec.param), spec.temperature)
        elif spec.kind == p.SAMPLE_TOP_P:
            sampler = sdk.TopP(spec.param, spec.temperature)
        elif spec.kind == p.SAMPLE_MIN_P:
            sampler = sdk.MinP(spec.param, spec.temperature)
        else:
            raise ValueError(f"unknown sampler {spec.kind!r} (one of {', '.join(p.SAMPLE_KINDS)})")
    except (ValueError, OverflowError) as exc:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"sample: {exc}") from None
    sampler.rng.state = spec.rng_state
    return sampler


def sample_dist(sampler, dist: p.TopKDist) -> int:
    """The token ``sampler`` draws from ``dist``: its float32 probabilities widened exactly to
    binary64, as the inferlet receives them."""
    token_ids = np.frombuffer(dist.token_ids, "<i4").tolist()
    probs = np.frombuffer(dist.probs, "<f4").tolist()
    return sampler.sample(token_ids, probs)
