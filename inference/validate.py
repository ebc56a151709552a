"""Per-item checks: a bad item raises :class:`ItemFailure` and fails alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oven.proto import inference as p


class ItemFailure(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.error = p.ItemError(code, message)


@dataclass(frozen=True, slots=True)
class Limits:
    """The sizes items are checked against."""

    num_pages: int
    page_size: int
    num_embeds: int
    num_host_slots: int
    vocab_size: int
    max_position: int


def check_ids(ids: list[int], bound: int, code: str, what: str) -> None:
    for i in ids:
        if not 0 <= i < bound:
            raise ItemFailure(code, f"{what} {i} is out of range [0, {bound})")


def check_lengths(**lists: list) -> int:
    lengths = {name: len(v) for name, v in lists.items()}
    if len(set(lengths.values())) != 1:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, "lengths differ: " + ", ".join(f"{k}={v}" for k, v in lengths.items()))
    return next(iter(lengths.values()))


def check_context(lim: Limits, page_ids: list[int], last_page_len: int, num_inputs: int) -> int:
    """Validate a paged context that ends with ``num_inputs`` new tokens; return its length."""
    if not page_ids:
        raise ItemFailure(p.ERR_BAD_PAGE, "kv_page_ids is empty: a forward needs pages to write its inputs into")
    check_ids(page_ids, lim.num_pages, p.ERR_BAD_PAGE, "page")
    if len(set(page_ids)) != len(page_ids):
        raise ItemFailure(p.ERR_BAD_PAGE, "a page appears twice in one context")
    if not 1 <= last_page_len <= lim.page_size:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"kv_last_page_len {last_page_len} is outside [1, {lim.page_size}]")
    kv_len = (len(page_ids) - 1) * lim.page_size + last_page_len
    if not 1 <= num_inputs <= kv_len:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"{num_inputs} inputs do not fit a context of {kv_len} tokens")
    return kv_len


def check_positions(lim: Limits, positions: list[int]) -> None:
    check_ids(positions, lim.max_position, p.ERR_BAD_POSITION, "position")


def check_outputs(output_indices: list[int], num_inputs: int) -> None:
    check_ids(output_indices, num_inputs, p.ERR_BAD_ARGUMENT, "output index")


def check_top_k(top_k: int, vocab_size: int) -> None:
    if not 0 <= top_k <= vocab_size:
        raise ItemFailure(p.ERR_BAD_ARGUMENT, f"top_k {top_k} is outside [0, {vocab_size}]")


def unpack_mask(mask: list[bytes] | None, num_inputs: int, kv_len: int) -> np.ndarray | None:
    """Packed rows (numpy.packbits) -> bool [num_inputs, kv_len], True = may attend."""
    if mask is None:
        return None
    row_bytes = (kv_len + 7) // 8
    if len(mask) != num_inputs or any(len(row) != row_bytes for row in mask):
        raise ItemFailure(p.ERR_BAD_ARGUMENT,
                          f"attention_mask must have {num_inputs} rows of {row_bytes} bytes (context of {kv_len})")
    bits = np.unpackbits(np.frombuffer(b"".join(mask), dtype=np.uint8).reshape(num_inputs, row_bytes), axis=1)
    return bits[:, :kv_len].astype(bool)


def check_token_range(lim: Limits, offset: int, num_tokens: int, what: str) -> None:
    if num_tokens < 0 or offset < 0 or offset + num_tokens > lim.page_size:
        raise ItemFailure(p.ERR_BAD_ARGUMENT,
                          f"{what} range [{offset}, {offset + num_tokens}) is outside a page of {lim.page_size}")
