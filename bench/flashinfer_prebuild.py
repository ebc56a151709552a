"""Build the FlashInfer kernels oven uses, all in one parallel ninja run, before their first use.

FlashInfer 0.7 JIT-compiles each kernel family the first time it is called, one family at a time,
which makes a first GPU run spend minutes compiling in series. This builds, for one head size and
dtype, every family oven's CUDA path calls (see inference/attention/flashinfer_paged.py, llama.py and
lora.py): batch prefill on fa2 (masked prefill, and decode with tensor cores) and fa3 (causal prefill
on Hopper), batch decode without tensor cores, KV page appends, RMSNorm, RoPE, and segment GEMM. What
is already built is skipped; a family missed here is still compiled at its first use.

Each family is built by its own ``JitSpec.build()``, all at once on threads, and not by
``flashinfer.jit.build_jit_specs``: that runs one ninja in the cache's root, so its log of command
lines lands there, and the first use of each family then runs ninja in the family's own folder, finds
no logged command for any output, and rebuilds it all (seen on an H200: the prebuilt kernels compiled
again inside the tests).

    python bench/flashinfer_prebuild.py [--head-dim 64] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch


def specs(head_dim: int, dtype: torch.dtype) -> list:
    from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.attention.modules import _gen_batch_prefill_primary_module
    from flashinfer.jit.gemm import gen_gemm_module, gen_gemm_sm90_module
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.jit.rope import gen_rope_module
    from flashinfer.utils import determine_gemm_backend

    # (dtype q, kv, o, index dtype, head dims qk/vo, no RoPE in-kernel, no sliding window, no soft cap)
    common = (dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False)
    # fa2 prefill loads its "primary" module (KV strides specialised equal), not the public one:
    # flashinfer.prefill.get_batch_prefill_module (0.7), hence the private generator.
    found = [gen_batch_decode_module(*common), _gen_batch_prefill_primary_module("fa2", *common, False),
             gen_page_module(), gen_norm_module(), gen_rope_module()]
    if torch.cuda.get_device_capability()[0] == 9:  # causal prefill takes fa3 on Hopper
        found.append(gen_batch_prefill_module("fa3", *common, False))
    # segment GEMM (LoRA): the sm90 kernels on Hopper, else the sm80 ones
    found.append(gen_gemm_sm90_module() if determine_gemm_backend(torch.device("cuda")) == "sm90"
                 else gen_gemm_module())
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, default=64, help="attention head size (default: %(default)s)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                        help="model dtype (default: %(default)s)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("flashinfer_prebuild: torch sees no CUDA device", file=sys.stderr)
        return 1
    todo = specs(args.head_dim, getattr(torch, args.dtype))
    # Each family's ninja takes MAX_JOBS compilers (FlashInfer reads it per build): a share of the cores,
    # so that the three large families (fa2, fa3, segment GEMM: ~10 files each) fill the machine together.
    os.environ.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 1) // 3)))
    print(f"flashinfer_prebuild: {len(todo)} kernel families, {os.environ['MAX_JOBS']} compilers each: "
          f"{', '.join(s.name for s in todo)}", flush=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(len(todo)) as pool:  # ninja and nvcc do the work; the threads only wait
        list(pool.map(lambda spec: spec.build(need_lock=True), todo))  # re-raises a failed build
    print(f"flashinfer_prebuild: built in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
