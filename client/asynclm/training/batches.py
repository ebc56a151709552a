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

from .segments import call_spans, common_prefix_length, loss_weights


@dataclass(frozen=True)
class Batch:
    prefix_ids: list[int]
    suffix_ids: list[list[int]]
    suffix_weight: list[list[float]]  # suffix_weight[b][j]: the weight of suffix_ids[b][j] in the loss (0: none)
    # suffix_rejections[b]: (j, token): at suffix_ids[b][j] the model once wrote ``token`` instead (onpolicy.py)
    suffix_rejections: list[list[tuple[int, int]]] | None = None
    reject_weight: float = 0.0        # the weight of each rejection's unlikelihood term

    @property
    def num_loss_tokens(self) -> int:
        return sum(w > 0 for weights in self.suffix_weight for w in weights)

    @property
    def num_tokens(self) -> int:
        return _forwarded(len(self.prefix_ids), len(self.suffix_ids), max(len(s) for s in self.suffix_ids))


def _forwarded(prefix_length: int, num_rows: int, longest_suffix: int) -> int:
    """Tokens a batch forwards: the prefix once, the suffixes padded to the longest."""
    return prefix_length + num_rows * longest_suffix


@dataclass(frozen=True)
class Weighing:
    """How a record's loss tokens weigh: 1, or ``call_weight`` inside the calls the model wrote
    (found by the ``call_markers`` tokens; see segments.py). Without markers every one weighs 1.
    With ``reject_weight``, the tokens where an on-policy sample corrected the model (its
    corrections' ``rejected`` positions) weigh at least that, and so does pushing down the token
    the model wrote there."""
    call_weight: float = 1.0
    call_markers: tuple[list[int], list[int]] | None = None
    reject_weight: float = 0.0

    def __call__(self, record: dict) -> list[float]:
        ids, spans = record["ids"], record["loss_spans"]
        marked = call_spans(ids, spans, self.call_markers) if self.call_markers else []
        weights = loss_weights(len(ids), spans, marked, self.call_weight)
        for position, _ in self.rejections(record):
            weights[position] = max(weights[position], self.reject_weight)
        return weights

    def rejections(self, record: dict) -> list[tuple[int, int]]:
        """``(position, token)`` of each token the model was corrected at (none without ``reject_weight``)."""
        if not self.reject_weight:
            return []
        return [tuple(c["rejected"]) for c in record.get("corrections", ()) if "rejected" in c]


def _cut(records: list[dict]) -> int:
    """The length of the prefix ``records`` share, cut before the first token that carries loss."""
    ids = [r["ids"] for r in records]
    first_loss = min(r["loss_spans"][0][0] for r in records)
    return max(0, min(min(common_prefix_length(ids[0], other) for other in ids), first_loss - 1))


def _num_tokens(records: list[dict]) -> int:
    """:attr:`Batch.num_tokens` of the batch of ``records``, without building it."""
    cut = _cut(records)
    return _forwarded(cut, len(records), max(len(r["ids"]) for r in records) - cut)


def _batch(records: list[dict], weigh: Weighing) -> Batch:
    cut = _cut(records)
    rejections = [[(position - cut, token) for position, token in weigh.rejections(r)] for r in records]
    return Batch(records[0]["ids"][:cut], [r["ids"][cut:] for r in records], [weigh(r)[cut:] for r in records],
                 rejections if any(rejections) else None, weigh.reject_weight)


def _chunks(records: list[dict], max_samples: int, max_tokens: int, weigh: Weighing
            ) -> tuple[list[Batch], list[dict]]:
    """Full batches of ``records`` in order, and the records of a last, partly filled one."""
    batches, run = [], []
    for record in records:
        if run and (len(run) == max_samples or _num_tokens(run + [record]) > max_tokens):
            batches.append(_batch(run, weigh))
            run = []
        run.append(record)
    if len(run) == max_samples:
        return batches + [_batch(run, weigh)], []
    return batches, run


def make_batches(records: list[dict], max_samples: int, max_tokens: int, weigh: Weighing = Weighing()
                 ) -> list[Batch]:
    """Batches of up to ``max_samples`` samples and ``max_tokens`` forwarded tokens."""
    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    groups: dict[tuple[int, ...], list[dict]] = {}
    for r in records:
        if r["loss_spans"]:
            groups.setdefault(tuple(r["ids"][:r["system_tokens"]]), []).append(r)
    batches, rest = [], []
    for key in sorted(groups):
        full, left = _chunks(sorted(groups[key], key=lambda r: (len(r["ids"]), r["ids"])), max_samples, max_tokens,
                             weigh)
        batches += full
        rest += left
    full, left = _chunks(sorted(rest, key=lambda r: (len(r["ids"]), r["ids"])), max_samples, max_tokens, weigh)
    return batches + full + ([_batch(left, weigh)] if left else [])


def epoch_order(num_batches: int, seed: int, epoch: int) -> list[int]:
    """The batches' order in ``epoch``: a shuffle fixed by the seed, different each epoch."""
    order = list(range(num_batches))
    random.Random(f"{seed}:epoch:{epoch}").shuffle(order)
    return order
