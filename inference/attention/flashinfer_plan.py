"""Host-side planning for the FlashInfer backend: which wrapper a batch takes, and the arrays it gets.

Nothing here imports flashinfer, so the choices are tested on any machine.

Three wrappers, because a FlashInfer prefill wrapper with ``backend="auto"``
fixes its backend at its first ``plan()``: on Hopper an unmasked causal first
plan picks fa3, whose kernels reject custom masks (cudaErrorNotSupported), and
every later masked plan on that wrapper would fail.

* ``DECODE``: every item has one new token and nothing is masked;
* ``CAUSAL``: the rest without masks: a prefill wrapper left on ``auto`` (fa3 on Hopper);
* ``MASKED``: some item has a user mask or a masked slot in its context: a prefill wrapper fixed to fa2.
"""

from __future__ import annotations

import numpy as np

from .base import BatchLayout

DECODE, CAUSAL, MASKED = "decode", "causal", "masked"


def plan_kind(layout: BatchLayout, custom_mask: bool) -> str:
    """The wrapper a batch takes; ``custom_mask`` is :meth:`AttentionBackend.needs_custom_mask`."""
    if custom_mask:
        return MASKED
    return DECODE if bool((layout.q_lens == 1).all()) else CAUSAL


def append_rows(layout: BatchLayout) -> tuple[np.ndarray, np.ndarray]:
    """int32 (batch index, position in its context) of every new token, as ``append_paged_kv_cache``
    takes them: what ``flashinfer.get_batch_indices_positions`` computes on the device, here on the host."""
    q_lens = layout.q_lens.astype(np.int64)
    batch_indices = np.repeat(np.arange(layout.num_items, dtype=np.int32), q_lens)
    starts = np.repeat(layout.kv_lens - q_lens, q_lens)
    offsets = np.arange(len(batch_indices)) - np.repeat(layout.qo_indptr[:-1].astype(np.int64), q_lens)
    return batch_indices, (starts + offsets).astype(np.int32)


def packed_masks(masks: list[np.ndarray]) -> np.ndarray:
    """uint8 bits (little bit order) of the items' bool masks [q_len, kv_len], laid out for FlashInfer 0.7.

    The kernel reads item b's bits from byte ``mask_indptr[b]`` of the packed mask
    (include/flashinfer/attention/variants.cuh), but ``plan()`` given a
    ``packed_custom_mask`` computes ``mask_indptr`` in mask *elements*
    (``_compute_page_mask_indptr``); only its own ``segment_packbits`` path, which
    reads a device total back with ``.item()``, gives byte offsets. So item b's
    bytes start here at byte = its element offset, sum of ``q_len * kv_len`` of the
    items before it; the gaps are zero and never read. The packed mask is then as
    long as the unpacked one, which is what the ``custom_mask`` path uploads anyway.
    """
    sizes = [m.size for m in masks]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    out = np.zeros(int(starts[-1]) + (sizes[-1] + 7) // 8 if masks else 0, dtype=np.uint8)
    for start, mask in zip(starts, masks):
        bits = np.packbits(mask.reshape(-1), bitorder="little")
        out[start:start + len(bits)] = bits
    return out

