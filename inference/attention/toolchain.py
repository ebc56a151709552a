"""Can FlashInfer run here? Checked without importing it (its import is slow, and the CPU path never does).

FlashInfer 0.7 ships Python and CUDA sources: the first use of each kernel
JIT-compiles it with nvcc and ninja (minutes, cached in ``~/.cache/flashinfer``)
unless ``flashinfer-jit-cache`` holds it prebuilt, and FlashInfer refuses a
prebuilt package whose version is not exactly its own (a ``+cuXYZ`` suffix
allowed). So FlashInfer is usable when it is installed and either a CUDA
compiler and ninja are there, or a jit-cache of the matching version is.

Which backend serves a pool is :func:`choose_backend`, a pure function of the
request, the device, the dtype, the head size and this probe, so it is tested
everywhere.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

# Head sizes FlashInfer's attention kernels are built for (DISPATCH_HEAD_DIM; fa3 prefill takes these three).
FLASHINFER_HEAD_DIMS = (64, 128, 256)
# FlashInfer has no fp32 attention kernels: a plan with fp32 q/kv fails with a KeyError.
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True, slots=True)
class Toolchain:
    """What FlashInfer needs on this machine. ``version`` is None when flashinfer-python is not installed."""

    version: str | None
    nvcc: str | None
    ninja: str | None
    jit_cache_version: str | None

    @property
    def jit_cache_matches(self) -> bool:
        v, cache = self.version, self.jit_cache_version
        return v is not None and cache is not None and (cache == v or cache.startswith(v + "+"))

    def problem(self) -> str | None:
        """None when FlashInfer can run its kernels here, else why it cannot (one line)."""
        if self.version is None:
            return "flashinfer-python is not installed (pip install 'oven[gpu]')"
        if (self.nvcc and self.ninja) or self.jit_cache_matches:
            return None
        missing = " and ".join(what for what, found in (("nvcc (a CUDA toolkit)", self.nvcc), ("ninja", self.ninja))
                               if not found)
        cache = (f"flashinfer-jit-cache {self.jit_cache_version} does not match flashinfer {self.version}"
                 if self.jit_cache_version else f"no flashinfer-jit-cache=={self.version}")
        return (f"FlashInfer {self.version} compiles its kernels at first use, but {missing} is missing "
                f"and {cache}")


def probe_toolchain() -> Toolchain:
    return Toolchain(version=_dist_version("flashinfer-python"), nvcc=find_nvcc(), ninja=_find_ninja(),
                     jit_cache_version=_dist_version("flashinfer-jit-cache"))


def find_nvcc() -> str | None:
    """Where FlashInfer's JIT looks: $FLASHINFER_NVCC, $CUDA_HOME or $CUDA_PATH, PATH, /usr/local/cuda."""
    explicit = os.environ.get("FLASHINFER_NVCC")
    if explicit:
        return explicit if _executable(explicit) else None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:  # FlashInfer takes this folder as given, so look nowhere else
        candidate = str(Path(home) / "bin" / "nvcc")
        return candidate if _executable(candidate) else None
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    default = "/usr/local/cuda/bin/nvcc"
    return default if _executable(default) else None


def _find_ninja() -> str | None:
    if importlib.util.find_spec("ninja") is not None:  # the PyPI package carries its own binary
        return "ninja (Python package)"
    return shutil.which("ninja")


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def choose_backend(requested: str, device: torch.device, dtype: torch.dtype, head_dim: int,
                   toolchain: Toolchain) -> tuple[str, str | None]:
    """-> (``"flashinfer"`` or ``"torch"``, why FlashInfer was not taken or None).

    ``requested``: auto | torch | flashinfer. ``auto`` takes FlashInfer on CUDA
    when it can serve this dtype and head size and its kernels can be built or
    loaded here; ``flashinfer`` asked for where it cannot run raises ValueError
    with the reason. The CPU never gets FlashInfer: its kernels fail there.
    """
    if requested == "torch":
        return "torch", None
    if device.type != "cuda":
        reason = "the flashinfer backend needs a CUDA device"
    elif dtype not in FLASHINFER_DTYPES:
        reason = f"FlashInfer has no {str(dtype).removeprefix('torch.')} attention kernels (float16 and bfloat16 only)"
    elif head_dim not in FLASHINFER_HEAD_DIMS:
        reason = (f"FlashInfer's attention kernels take head sizes {', '.join(map(str, FLASHINFER_HEAD_DIMS))}, "
                  f"not {head_dim}")
    else:
        reason = toolchain.problem()
    if reason is None:
        return "flashinfer", None
    if requested == "flashinfer":
        raise ValueError(reason)
    return "torch", reason
