"""Shaping a sampling item's logits before its draw: bias, decoder penalties, allowed mask, grammar mask.

proto/inference.py ("Shaping") gives the order. Only the row a token is drawn from is shaped, on
this process's CPU copy of the logits; an unshaped batch never enters this module.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from oven.proto import inference as p

from .decoders import Decoder, Decoders
from .validate import ItemFailure

MAX_LOGPROBS = 64  # top log-probabilities per step (OpenAI allows 20)
MAX_BIASES = 1 << 16


class Shaping(NamedTuple):
    """A checked ShapeSpec."""

    allowed: np.ndarray | None  # bool [vocab]
    bias_ids: np.ndarray  # int64
    bias_values: np.ndarray  # float32
    decoder: Decoder | None
    logprobs: int


def check_shape(spec: p.ShapeSpec | None, vocab_size: int, decoders: Decoders, named: set[int]) -> Shaping | None:
    """``spec`` checked against the vocabulary, its decoder found or made; ``named``: the decoders
    other items of this request name (a decoder advances once per request). ItemFailure for a bad one."""
    if spec is None:
        return None
    allowed = None
    if spec.allowed is not None:
        if len(spec.allowed) != (vocab_size + 7) // 8:
            raise ItemFailure(p.ERR_BAD_ARGUMENT, f"allowed has {len(spec.allowed)} bytes; the vocabulary of "
                                                  f"{vocab_size} needs {(vocab_size + 7) // 8}")
        allowed = np.unpackbits(np.frombuffer(spec.allowed, np.uint8))[:vocab_size].astype(bool)
    if len(spec.bias_ids) != len(spec.bias_values) or len(spec.bias_ids) % 4:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, "bias_ids and bias_values must be int32 and float32 of one length")
    bias_ids = np.frombuffer(spec.bias_ids, "<i4").astype(np.int64)
    bias_values = np.frombuffer(spec.bias_values, "<f4")
    if len(bias_ids) > MAX_BIASES:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"{len(bias_ids)} biases, past the limit of {MAX_BIASES}")
    if len(bias_ids) and not (0 <= bias_ids.min() and bias_ids.max() < vocab_size):
        raise ItemFailure(p.ERR_BAD_TOKEN, f"a biased token is out of range [0, {vocab_size})")
    if np.isnan(bias_values).any() or (bias_values == np.inf).any():  # -infinity bans a token
        raise ItemFailure(p.ERR_BAD_ARGUMENT, "a bias is NaN or +infinity")
    if not -1 <= spec.logprobs <= MAX_LOGPROBS:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"logprobs {spec.logprobs} is outside [-1, {MAX_LOGPROBS}]")
    decoder = None
    if spec.decoder_id != -1:
        if spec.decoder_id in named:
            raise ItemFailure(p.ERR_BAD_ARGUMENT, f"decoder {spec.decoder_id} is named by two items of one "
                                                  "request: send the second in a later one")
        decoder = decoders.get(spec.decoder_id, spec.decoder)
        named.add(spec.decoder_id)
    return Shaping(allowed, bias_ids, bias_values, decoder, spec.logprobs)


def shape_row(logits: torch.Tensor, shaping: Shaping, inputs: list[int]) -> None:
    """Shape one row of float32 logits in place; ItemFailure when the grammar failed or nothing is
    left to draw. ``inputs``: the item's tokens, which a repetition penalty counts as seen."""
    decoder = shaping.decoder
    if len(shaping.bias_ids):
        logits.index_add_(0, torch.from_numpy(shaping.bias_ids), torch.from_numpy(shaping.bias_values.copy()))
    if decoder is not None:
        decoder.see(inputs)
        if decoder.penalises:
            _penalise(logits, decoder)
    if shaping.allowed is not None:
        logits.masked_fill_(torch.from_numpy(~shaping.allowed), float("-inf"))
    if decoder is not None and decoder.matcher is not None:
        logits.masked_fill_(torch.from_numpy(~_grammar_mask(decoder, logits.shape[0])), float("-inf"))
    if not torch.isfinite(logits).any():
        raise ItemFailure(p.ERR_BAD_ARGUMENT, "shaping allows no token (the mask, the grammar and the biases "
                                              "leave none)")


def _grammar_mask(decoder: Decoder, vocab_size: int) -> np.ndarray:
    matcher = decoder.matcher
    words = np.zeros((vocab_size + 31) // 32, np.int32)
    if not matcher.is_error():
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    if matcher.is_error():
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"grammar: {matcher.get_error()}")
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def _penalise(logits: torch.Tensor, decoder: Decoder) -> None:
    spec = decoder.spec
    if spec.repetition != 1 and decoder.seen:
        ids = torch.tensor(sorted(decoder.seen), dtype=torch.long)
        values = logits[ids]
        logits[ids] = torch.where(values > 0, values / spec.repetition, values * spec.repetition)
    if decoder.drawn and (spec.presence or spec.frequency):
        ids = torch.tensor(list(decoder.drawn), dtype=torch.long)
        counts = torch.tensor(list(decoder.drawn.values()), dtype=logits.dtype)
        logits[ids] -= spec.presence + spec.frequency * counts


def sampled_logprobs(raw: torch.Tensor, token: int, top: int) -> p.SampledLogprobs:
    """The model's own log-probability of ``token`` and its ``top`` most probable tokens', from the
    unshaped float32 logits row ``raw``."""
    logprobs = torch.log_softmax(raw, dim=-1)
    values, ids = torch.topk(logprobs, top) if top else (logprobs[:0], logprobs[:0].long())
    return p.SampledLogprobs(float(logprobs[token]), ids.numpy().astype("<i4").tobytes(),
                             values.numpy().astype("<f4").tobytes())
