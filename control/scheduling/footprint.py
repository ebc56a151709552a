"""What a command reads and writes, in physical ids.

A command names the memory it touches as *resources*: token-slot ranges of a
KvPage (:class:`KvSlots`, which also covers the page's mask bits), Embed slots
(:class:`Embed`), host-tier slots (:class:`HostSlot`) and token future slots (:class:`TokenSlot`). All ids are physical.
KvPage footprints are ranges rather than one key per token so that a 512-token
prefill costs a handful of keys, not 512. Which footprints may share a batch
is :mod:`.conflicts`' question.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "KvSlots",
    "Embed",
    "HostSlot",
    "TokenSlot",
    "Resource",
    "forward_kv_footprint",
]

# Larger than any page size: the stop of a range meaning "to the end of the page".
PAGE_END = 2**31 - 1


@dataclass(frozen=True, slots=True)
class KvSlots:
    """Token slots ``[start, stop)`` of KvPage ``page_id`` (K, V and mask bits)."""

    page_id: int
    start: int = 0
    stop: int = PAGE_END

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(f"empty or negative slot range [{self.start}, {self.stop}) of page {self.page_id}")

    @classmethod
    def page(cls, page_id: int) -> KvSlots:
        """Every slot of the page: what mask, offload and restore touch."""
        return cls(page_id)


@dataclass(frozen=True, slots=True)
class Embed:
    embed_id: int


@dataclass(frozen=True, slots=True)
class HostSlot:
    host_slot_id: int


@dataclass(frozen=True, slots=True)
class TokenSlot:
    """A token future slot of the inference process: a sampling forward writes it, a forward fed
    by that token reads it (so the two never share a batch, where the token does not exist yet)."""

    slot_id: int


Resource = KvSlots | Embed | HostSlot | TokenSlot


def forward_kv_footprint(kv_page_ids: list[int], kv_last_page_len: int, num_inputs: int,
                         page_size: int) -> tuple[frozenset[KvSlots], frozenset[KvSlots]]:
    """(reads, writes) of a forward over a paged context, in the conventions of ``proto/inference.py``.

    The context holds ``(len(kv_page_ids) - 1) * page_size + kv_last_page_len``
    tokens; the inputs are its last ``num_inputs`` and are written there; every
    slot of the context may be read. Naming the last page's valid slots exactly
    (not the whole page) is what lets the next chunk of the same prompt, which
    writes the rest of that page, join the same batch.
    """
    if not kv_page_ids or not 1 <= kv_last_page_len <= page_size:
        raise ValueError("a context needs at least one page and 1 <= kv_last_page_len <= page_size")
    num_tokens = (len(kv_page_ids) - 1) * page_size + kv_last_page_len
    if not 1 <= num_inputs <= num_tokens:
        raise ValueError(f"{num_inputs} inputs do not fit a context of {num_tokens} tokens")
    return (frozenset(_ranges(kv_page_ids, 0, num_tokens, page_size)),
            frozenset(_ranges(kv_page_ids, num_tokens - num_inputs, num_tokens, page_size)))


def _ranges(kv_page_ids: list[int], first: int, stop: int, page_size: int) -> Iterable[KvSlots]:
    """Per-page slot ranges covering context positions ``[first, stop)``."""
    for index in range(first // page_size, (stop + page_size - 1) // page_size):
        base = index * page_size
        yield KvSlots(kv_page_ids[index], max(first, base) - base, min(stop, base + page_size) - base)
