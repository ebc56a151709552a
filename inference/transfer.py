"""Host arrays onto the device without stalling the host.

A plain ``torch.tensor(list, device="cuda")`` or ``from_numpy(a).to("cuda")``
copies from pageable memory, which the driver does synchronously. Here arrays
are copied into pinned memory (torch's caching host allocator, which keeps a
block until the copies reading it have run) and sent with ``non_blocking``, so
the host goes on planning while the copy is queued behind earlier work. On the
CPU the arrays are wrapped without a copy.
"""

from __future__ import annotations

import numpy as np
import torch


def pinned(array: np.ndarray) -> torch.Tensor:
    """A host tensor in pinned memory holding ``array`` (a copy)."""
    return torch.from_numpy(np.ascontiguousarray(array)).pin_memory()


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device`` (its dtype kept); asynchronous on CUDA."""
    if device.type != "cuda":
        return torch.from_numpy(np.ascontiguousarray(array))
    return pinned(array).to(device, non_blocking=True)


def to_device_many(arrays: list[np.ndarray], dtype: np.dtype, device: torch.device) -> list[torch.Tensor]:
    """Several 1-D arrays cast to ``dtype`` and sent as one copy; returns views of it, one per array."""
    sizes = [len(a) for a in arrays]
    flat = to_device(np.concatenate([np.asarray(a, dtype=dtype) for a in arrays]) if arrays else
                     np.empty(0, dtype=dtype), device)
    return list(torch.split(flat, sizes))


def long_tensor(values, device: torch.device) -> torch.Tensor:
    """int64 indices (a list or array) on ``device``."""
    return to_device(np.asarray(values, dtype=np.int64), device)
