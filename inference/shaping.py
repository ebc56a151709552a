"""Shaping a sampling item's logits before its draw: bias, decoder penalties, allowed mask, grammar mask.

proto/inference.py ("Shaping") gives the order. Only the row a token is drawn from is shaped, on the
CPU (where the logits are, else a copy of the row); an unshaped batch never enters this module. The
grammar masks are computed beside the batch's forward (``grammar_masks``) and applied by a table
lookup (``_remove``), so what a grammar adds to a step's path is the lookup and the advance.
"""

from __future__ import annotations

import threading
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

    allowed: np.ndarray | None  # uint8 [ceil(vocab / 8)]: numpy.packbits of the row, 1 = may be drawn
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
        allowed = np.frombuffer(spec.allowed, np.uint8)
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


NOTHING_LEFT = "shaping allows no token (the mask, the grammar and the biases leave none)"


def grammar_masks(shapings: dict[int, Shaping], vocab_size: int) -> dict[int, np.ndarray | ItemFailure]:
    """Each item's grammar mask for its next token (``_grammar_mask``), or the ItemFailure computing it
    raised. A decoder's matcher moves only when its item's token is drawn, so the engine computes
    these on a worker thread while the batch's forward runs (llguidance releases the GIL)."""
    masks: dict[int, np.ndarray | ItemFailure] = {}
    for i, shaping in shapings.items():
        try:
            masks[i] = _grammar_mask(shaping.decoder, vocab_size)
        except ItemFailure as failure:
            masks[i] = failure
    return masks


def advance_matchers(draws: list[tuple[Decoder, int]]) -> None:
    """Each decoder's matcher past the token drawn under it (the engine's mask worker runs this after a
    batch's reply is made, before the next batch's masks)."""
    for decoder, token in draws:
        decoder.advance(token)


def shape_row(logits: torch.Tensor, shaping: Shaping, inputs: list[int],
              grammar: np.ndarray | ItemFailure | None = None) -> None:
    """Shape one row of float32 logits (contiguous, on the CPU) in place; ItemFailure when the grammar
    failed. ``inputs``: the item's tokens, which a repetition penalty counts as seen; ``grammar``: the
    decoder's mask from ``grammar_masks``, computed here if None. Whether any token is left is the
    caller's to check (the engine reads it off the top-K it computes anyway: NOTHING_LEFT)."""
    decoder = shaping.decoder
    if len(shaping.bias_ids):
        logits.index_add_(0, torch.from_numpy(shaping.bias_ids), torch.from_numpy(shaping.bias_values.copy()))
    if decoder is not None:
        decoder.see(inputs)
        if decoder.penalises:
            _penalise(logits, decoder)
    if shaping.allowed is not None:
        _remove(logits, shaping.allowed, _BIG_ENDIAN)
    if decoder is not None and decoder.matcher is not None:
        if grammar is None:
            grammar = _grammar_mask(decoder, logits.shape[0])
        if isinstance(grammar, ItemFailure):
            raise grammar
        _remove(logits, grammar, _LITTLE_ENDIAN)


# Byte value -> what its 8 bits add to 8 logits: 0 for a 1 bit (kept), -inf for a 0 bit (removed); one table
# per bit order (numpy.packbits' big-endian bytes, llguidance's little-endian 32-bit words). A mask is
# applied as one table lookup and one add: no bool row is unpacked and no masked_fill branches per token
# (on a CPU about 20 µs for SmolLM2's 49,152 tokens where those took 100-250 µs).
_BITS = np.arange(256, dtype=np.uint8)[:, None]
_BIG_ENDIAN = np.where(np.unpackbits(_BITS, axis=1), 0, -np.inf).astype(np.float32)
_LITTLE_ENDIAN = np.where(np.unpackbits(_BITS, axis=1, bitorder="little"), 0, -np.inf).astype(np.float32)


_scratch = threading.local()  # per thread: the table lookup's output, reused (a fresh 200 kB array costs page faults)


def _remove(logits: torch.Tensor, packed: np.ndarray, table: np.ndarray) -> None:
    """Set the logits whose bit in ``packed`` (uint8, ``table``'s bit order) is 0 to -inf, in place
    (``logits``: a float32 row on the CPU)."""
    row = logits.numpy()
    added = getattr(_scratch, "added", None)
    if added is None or added.shape[0] != len(packed):
        added = _scratch.added = np.empty((len(packed), 8), np.float32)
    np.take(table, packed, axis=0, out=added)
    row += added.reshape(-1)[:len(row)]


def _grammar_mask(decoder: Decoder, vocab_size: int) -> np.ndarray:
    """The matcher's mask for the next token: llguidance's 32-bit words, as bytes (little-endian bits)."""
    matcher = decoder.matcher
    words = np.zeros((vocab_size + 31) // 32, np.int32)
    if not matcher.is_error():
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    if matcher.is_error():
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"grammar: {matcher.get_error()}")
    return words.view(np.uint8)


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
