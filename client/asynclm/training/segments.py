"""Training text as the inferlet builds it: token segments, each tokenized on its own, and the loss mask.

The inferlet fills its context piece by piece: ``fill_chat`` renders the system and user turns
with the model's chat template and tokenizes the result; every token the model writes is its own;
every interrupt is tokenized by ``ctx.fill(interrupt_text(...))`` alone. A sample therefore
concatenates the ids of separately tokenized segments; tokenizing the whole transcript at once
could merge tokens across a boundary and teach the model a context it never sees.
Loss falls only on what the model writes; the calls in it may weigh more (``call_weight``): a
task fails on one wrong token of a call, while most of the answer's tokens are easy to predict.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the CLI builds its parser from this package without jinja2 and tokenizers
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


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def loss_weights(num_tokens: int, spans: list[list[int]], marked: list[list[int]] | None = None,
                 weight: float = 1.0) -> list[float]:
    """Each token's weight in the loss: 0 outside ``spans``, ``weight`` in the ``marked`` ones, else 1."""
    weights = [0.0] * num_tokens
    for start, end in spans:
        weights[start:end] = [1.0] * (end - start)
    for start, end in marked or []:
        weights[start:end] = [weight if w else 0.0 for w in weights[start:end]]
    return weights


def _find(ids: list[int], pattern: list[int], start: int, end: int) -> int:
    """Where ``pattern`` first occurs in ``ids[start:end]``, or -1."""
    for i in range(start, end - len(pattern) + 1):
        if ids[i:i + len(pattern)] == pattern:
            return i
    return -1


def call_spans(ids: list[int], spans: list[list[int]], markers: tuple[list[int], list[int]]) -> list[list[int]]:
    """The [start, end) ranges of the calls the model wrote: from an opening marker to the next
    closing one (:func:`call_markers`), inside the loss spans."""
    opening, closing = markers
    found = []
    for start, end in spans:
        at = _find(ids, opening, start, end)
        while at >= 0:
            close = _find(ids, closing, at + len(opening), end)
            stop = end if close < 0 else close + len(closing)
            found.append([at, stop])
            at = _find(ids, opening, stop, end)
    return found


def call_markers(encoder: Encoder) -> tuple[list[int], list[int]]:
    """The tokens every call the model writes starts and ends with: the common head and tail of
    two calls written by the inferlet's own ``call_text``."""
    from .protocol import prompt

    # ids that differ from their first letter, so that no part of an id is taken for a marker
    a = encoder.encode(prompt().call_text("t1", 'f(x="a")'))
    b = encoder.encode(prompt().call_text("job22", "g(2)"))
    head = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    tail = next((i for i, (x, y) in enumerate(zip(a[::-1], b[::-1])) if x != y), min(len(a), len(b)))
    if head == 0 or tail == 0:
        raise ValueError("the inferlet's calls share no opening or closing tokens")
    return a[:head], a[len(a) - tail:]


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
