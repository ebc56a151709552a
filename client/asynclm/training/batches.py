"""Training batches that share a prompt prefix: the shared tokens are forwarded once per batch.

Samples with equal system turns (the rules and the tools with their estimated times; training
demo tasks come in groups with one table of times) are batched together, shortest first so
little padding is needed; the samples left over from small groups are batched by length. A
batch holds the prefix its samples share (cut before the first token that carries loss, so
every prediction with loss is made in the suffixes) and each sample's suffix. Forwarding the
prefix once and the suffixes on its KV cache gives the logits of forwarding each sample whole.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .segments import loss_mask


@dataclass(frozen=True)
class Batch:
    prefix_ids: list[int]
    suffix_ids: list[list[int]]
    suffix_loss: list[list[bool]]  # suffix_loss[b][j]: suffix_ids[b][j] carries loss

    @property
    def num_loss_tokens(self) -> int:
        return sum(sum(mask) for mask in self.suffix_loss)

    @property
    def num_tokens(self) -> int:
        """Tokens forwarded: the prefix once, the suffixes padded to the longest."""
        return len(self.prefix_ids) + len(self.suffix_ids) * max(len(s) for s in self.suffix_ids)


def _common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _batch(records: list[dict]) -> Batch:
    ids = [r["ids"] for r in records]
    first_loss = min(r["loss_spans"][0][0] for r in records)
    cut = max(0, min(min(_common_prefix_length(ids[0], other) for other in ids), first_loss - 1))
    loss = [loss_mask(len(r["ids"]), r["loss_spans"])[cut:] for r in records]
    return Batch(ids[0][:cut], [i[cut:] for i in ids], loss)


def _chunks(records: list[dict], max_samples: int, max_tokens: int) -> tuple[list[Batch], list[dict]]:
    """Full batches of ``records`` in order, and the records of a last, partly filled one."""
    batches, run = [], []
    for record in records:
        if run and (len(run) == max_samples or _batch(run + [record]).num_tokens > max_tokens):
            batches.append(_batch(run))
            run = []
        run.append(record)
    if len(run) == max_samples:
        return batches + [_batch(run)], []
    return batches, run


def make_batches(records: list[dict], max_samples: int, max_tokens: int) -> list[Batch]:
    """Batches of up to ``max_samples`` samples and ``max_tokens`` forwarded tokens."""
    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    groups: dict[tuple[int, ...], list[dict]] = {}
    for r in records:
        if r["loss_spans"]:
            groups.setdefault(tuple(r["ids"][:r["system_tokens"]]), []).append(r)
    batches, rest = [], []
    for key in sorted(groups):
        full, left = _chunks(sorted(groups[key], key=lambda r: (len(r["ids"]), r["ids"])), max_samples, max_tokens)
        batches += full
        rest += left
    full, left = _chunks(sorted(rest, key=lambda r: (len(r["ids"]), r["ids"])), max_samples, max_tokens)
    return batches + full + ([_batch(left)] if left else [])


def epoch_order(num_batches: int, seed: int, epoch: int) -> list[int]:
    """The batches' order in ``epoch``: a shuffle fixed by the seed, different each epoch."""
    order = list(range(num_batches))
    random.Random(f"{seed}:epoch:{epoch}").shuffle(order)
    return order
