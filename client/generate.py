"""Greedy generation of one sequence over an inference server.

A stand-alone client of the inference protocol that owns a whole server: it
places its sequence on pages ``0, 1, 2, ...``. The inferlet runtime replaces
this bookkeeping with per-inferlet virtual pages; the request pattern
(one fused ``forward_text`` per step) stays the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from oven.proto import inference as p

from oven.control.inference_client import InferenceClient


class GenerationError(RuntimeError):
    pass


@dataclass
class PagedSequence:
    """Pages and length of one growing token sequence."""

    page_size: int
    free_page_ids: list[int]
    page_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0

    def extend(self, num_new: int) -> tuple[list[int], int]:
        """Make room for ``num_new`` more tokens; return (page ids, last page length) after them."""
        self.num_tokens += num_new
        while len(self.page_ids) * self.page_size < self.num_tokens:
            if not self.free_page_ids:
                raise GenerationError(f"out of KV pages at {self.num_tokens} tokens")
            self.page_ids.append(self.free_page_ids.pop(0))
        return list(self.page_ids), self.num_tokens - (len(self.page_ids) - 1) * self.page_size


@dataclass
class GenerationResult:
    token_ids: list[int]
    prompt_tokens: int
    time_to_first_token_s: float
    total_s: float
    stopped_by: str  # "stop_token" or "max_new_tokens"


def top_token(dist: p.TopKDist) -> int:
    """Most probable token of a sorted top-K distribution."""
    return int(np.frombuffer(dist.token_ids, dtype="<i4", count=1)[0])


def greedy_generate(client: InferenceClient, prompt_ids: list[int], max_new_tokens: int,
                    stop_token_ids: frozenset[int] | set[int], page_size: int, num_pages: int,
                    on_token: Callable[[int], None] | None = None,
                    adapter_id: int = p.BASE_MODEL) -> GenerationResult:
    """Decode greedily until a stop token (kept in the output) or ``max_new_tokens``, on the LoRA
    adapter ``adapter_id`` (one the inference process has loaded) or the base model."""
    if not prompt_ids:
        raise GenerationError("the prompt is empty")
    seq = PagedSequence(page_size, list(range(num_pages)))
    start = time.perf_counter()
    inputs, first_token_s, out = list(prompt_ids), 0.0, []
    while len(out) < max_new_tokens:
        pages, last_len = seq.extend(len(inputs))
        positions = list(range(seq.num_tokens - len(inputs), seq.num_tokens))
        item = p.ForwardTextItem(inputs, positions, pages, last_len, [len(inputs) - 1], top_k=1, adapter_id=adapter_id)
        reply = client.call(p.ForwardTextRequest([item]))
        if reply.errors[0] is not None:
            raise GenerationError(f"{reply.errors[0].code}: {reply.errors[0].message}")
        token = top_token(reply.dists[0][0])
        if not out:
            first_token_s = time.perf_counter() - start
        out.append(token)
        if on_token:
            on_token(token)
        if token in stop_token_ids:
            return GenerationResult(out, len(prompt_ids), first_token_s, time.perf_counter() - start, "stop_token")
        inputs = [token]
    return GenerationResult(out, len(prompt_ids), first_token_s, time.perf_counter() - start, "max_new_tokens")
