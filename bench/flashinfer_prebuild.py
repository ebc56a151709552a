"""Build the FlashInfer kernels oven uses, all in one parallel ninja run, before their first use.

FlashInfer 0.7 JIT-compiles each kernel family the first time it is called, one family at a time,
which makes a first GPU run spend minutes compiling in series. This builds, for one head size and
dtype, every family oven's CUDA path calls (see inference/attention/flashinfer_paged.py, llama.py and
lora.py): batch prefill on fa2 (masked prefill, and decode with tensor cores) and fa3 (causal prefill
on Hopper), batch decode without tensor cores, KV page appends, RMSNorm, RoPE, and segment GEMM (sm80
and sm90). What is already built is skipped; a family missed here is still compiled at first use.

    python bench/flashinfer_prebuild.py [--head-dim 64] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def specs(head_dim: int, dtype: torch.dtype) -> list:
    from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.gemm import gen_gemm_module, gen_gemm_sm90_module
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.jit.rope import gen_rope_module

    # (dtype q, kv, o, index dtype, head dims qk/vo, no RoPE in-kernel, no sliding window, no soft cap)
    common = (dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False)
    found = [gen_batch_decode_module(*common), gen_page_module(), gen_norm_module(), gen_rope_module(),
             gen_gemm_module()]
    major, _ = torch.cuda.get_device_capability()
    backends = ["fa2", "fa3"] if major == 9 else ["fa2"]
    found += [gen_batch_prefill_module(backend, *common, False) for backend in backends]
    if major == 9:
        found.append(gen_gemm_sm90_module())
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
    from flashinfer.jit import build_jit_specs

    todo = specs(args.head_dim, getattr(torch, args.dtype))
    print(f"flashinfer_prebuild: {len(todo)} kernel families: {', '.join(s.name for s in todo)}", flush=True)
    start = time.perf_counter()
    build_jit_specs(todo, verbose=False)
    print(f"flashinfer_prebuild: built in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
