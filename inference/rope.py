"""RoPE's inverse frequencies for a Llama config, computed as transformers computes them.

The three kinds Llama checkpoints use (``default``, ``linear`` and Llama 3.1's ``llama3``) are computed
here with transformers' arithmetic, so an inference process never imports it (hf_files.py says why);
the rarer kinds are transformers' own functions. tests/test_hf_files.py holds both bit-equal.
"""

from __future__ import annotations

import math

import torch

OWN_KINDS = ("default", "linear", "llama3")


def rope_frequencies(config: dict) -> tuple[torch.Tensor, float]:
    """float32 inverse frequencies [head_dim / 2] and the cos/sin scale, for a config as
    :func:`~oven.inference.hf_files.complete_llama_config` returns it."""
    rope = config["rope_parameters"]
    kind = rope.get("rope_type", "default")
    if kind not in OWN_KINDS or rope.get("partial_rotary_factor", 1.0) != 1.0:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if kind not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"unknown RoPE type {kind!r} in the model's config")
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](LlamaConfig.from_dict(config))
        return inv_freq.float(), float(scaling)
    dim = config["head_dim"]
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "linear":
        inv_freq /= rope["factor"]
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, rope)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, rope: dict) -> torch.Tensor:
    """Llama 3.1's scaling: long wavelengths divided by ``factor``, short ones kept, the middle blended."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    context = rope["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = context / low, context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)
