"""Training text as the inferlet builds it: token segments, each tokenized on its own, and the loss mask.

The inferlet fills its context piece by piece: ``fill_chat`` renders the system and user turns
with the model's chat template and tokenizes the result; every token the model writes is its own;
every interrupt is tokenized by ``ctx.fill(interrupt_text(...))`` alone. A sample therefore
concatenates the ids of separately tokenized segments; tokenizing the whole transcript at once
could merge tokens across a boundary and teach the model a context it never sees.
Loss falls only on what the model writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from oven.control.tokenizer import Tokenizer

ROLES = ("prompt", "model", "interrupt", "user", "turn")  # "turn": chat-template text between turns
LOSS_ROLES = frozenset({"model"})


@dataclass
class Segment:
    role: str
    token_ids: list[int]

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown segment role {self.role!r}; expected one of {ROLES}")


def flatten(segments: list[Segment]) -> tuple[list[int], list[list[int]]]:
    """``(ids, loss_spans)``: the concatenated ids and the [start, end) spans that carry loss."""
    ids: list[int] = []
    spans: list[list[int]] = []
    for segment in segments:
        start = len(ids)
        ids += segment.token_ids
        if segment.role in LOSS_ROLES and segment.token_ids:
            if spans and spans[-1][1] == start:
                spans[-1][1] = len(ids)
            else:
                spans.append([start, len(ids)])
    return ids, spans


def loss_mask(num_tokens: int, spans: list[list[int]]) -> list[bool]:
    mask = [False] * num_tokens
    for start, end in spans:
        mask[start:end] = [True] * (end - start)
    return mask


class Encoder:
    """The serving tokenizer, used the way the inferlet uses it."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.render_chat(messages, add_generation_prompt)

    def prompt(self, system: str, user: str) -> Segment:
        """What ``ctx.fill_chat([system, user])`` puts in the context."""
        return Segment("prompt", self.encode(self.chat([{"role": "system", "content": system},
                                                        {"role": "user", "content": user}])))

    def system_length(self, system: str, prompt_ids: list[int]) -> int:
        """How many of ``prompt_ids`` are the system turn (samples with equal system prompts share
        them; the trainer forwards them once per batch), or 0 where they are no prefix of it."""
        system_ids = self.encode(self.chat([{"role": "system", "content": system}], add_generation_prompt=False))
        return len(system_ids) if prompt_ids[:len(system_ids)] == system_ids else 0

    @cached_property
    def end_of_turn_id(self) -> int:
        """The token the chat template closes an assistant turn with (``<|im_end|>``), a stop token."""
        marker = "\u2063"
        messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}]
        closing = self.chat(messages, add_generation_prompt=False).split(marker, 1)[1]
        token_id = self.encode(closing)[0]
        if token_id not in self.tokenizer.stop_token_ids:
            raise ValueError(f"the chat template closes a turn with {closing!r}, which starts with no stop token")
        return token_id
