"""Attention backends with one interface: pure PyTorch everywhere, FlashInfer on CUDA."""

from __future__ import annotations

import importlib.util
import logging

from .base import AttentionBackend, BatchLayout
from .torch_paged import TorchPagedAttention

__all__ = ["AttentionBackend", "BatchLayout", "TorchPagedAttention", "make_backend", "flashinfer_available"]

log = logging.getLogger(__name__)


def flashinfer_available() -> bool:
    """True when the flashinfer package is installed (it is only ever imported for CUDA pools)."""
    return importlib.util.find_spec("flashinfer") is not None


def make_backend(name: str, pool, num_q_heads: int) -> AttentionBackend:
    """``name``: auto | torch | flashinfer. ``auto`` picks FlashInfer for a CUDA pool when it imports.

    The CPU path never imports flashinfer: its kernels fail there.
    """
    on_cuda = pool.kv_cache.is_cuda
    if name == "flashinfer" and not on_cuda:
        raise ValueError("the flashinfer backend needs a CUDA device")
    if name == "flashinfer" or (name == "auto" and on_cuda and flashinfer_available()):
        from .flashinfer_paged import FlashInferPagedAttention

        return FlashInferPagedAttention(pool.kv_cache, pool.page_mask, num_q_heads)
    if name == "auto" and on_cuda:
        log.warning("flashinfer is not installed; using the PyTorch attention backend on CUDA")
    return TorchPagedAttention(pool.kv_cache, pool.page_mask, num_q_heads)
