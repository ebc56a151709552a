"""Attention backends with one interface: pure PyTorch everywhere, FlashInfer on CUDA."""

from __future__ import annotations

import logging

from .base import AttentionBackend, BatchLayout
from .toolchain import Toolchain, choose_backend, probe_toolchain
from .torch_paged import TorchPagedAttention

__all__ = ["AttentionBackend", "BatchLayout", "TorchPagedAttention", "make_backend"]

log = logging.getLogger(__name__)


def make_backend(name: str, pool, num_q_heads: int) -> AttentionBackend:
    """``name``: auto | torch | flashinfer; see :func:`~.toolchain.choose_backend` (ValueError when
    ``flashinfer`` cannot run here). ``auto`` logs why it fell back to PyTorch on CUDA.

    The CPU path never imports flashinfer: its kernels fail there.
    """
    cache = pool.kv_cache
    toolchain = probe_toolchain() if cache.is_cuda and name != "torch" else Toolchain(None, None, None, None)
    chosen, reason = choose_backend(name, cache.device, cache.dtype, cache.shape[-1], toolchain)
    if chosen == "flashinfer":
        from .flashinfer_paged import FlashInferPagedAttention

        return FlashInferPagedAttention(cache, pool.page_mask, num_q_heads)
    if reason is not None and cache.is_cuda:
        log.warning("using the PyTorch attention backend on CUDA: %s", reason)
    return TorchPagedAttention(cache, pool.page_mask, num_q_heads)
