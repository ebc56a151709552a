"""Chunked prefill: one client's decode beside another client's long prompts, chunked and whole.

One real inference process (``--model``, one torch thread) and, in turn, ControlLoops that differ only in
``prefill_chunk_tokens``. ``alice`` runs ``--instances`` `text-completion` × ``--tokens`` tokens: alone,
then while ``bob`` keeps ``--prompts`` instances forwarding a prompt of ``--prompt-tokens`` tokens (one
token each, relaunched as they end), once per chunk size in ``--chunks`` (0: forwards go whole, as
before chunking existed). Alice's time per output token is taken from when the inference process's
reply settles each of her token futures (consecutive tokens of one instance); the table gives its p50
and p99, whether her tokens equal her tokens alone, bob's prompt tokens forwarded per second
meanwhile, and how long one of bob's prompts takes with nothing beside it (what chunking costs the
long prompts).

Writes ``results/chunked_prefill.md``.

    .venv/bin/python bench/chunked_prefill.py [--model smollm2-135m-instruct] [--chunks 0 128 256]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (TokenTimes, alice_decodes, doc_parser, machine_lines, markdown_table,  # noqa: E402
                      percentile, write_results)

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig  # noqa: E402
from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.control.runtime.loop import ControlLoop  # noqa: E402
from oven.control.runtime.programs import LIBRARY  # noqa: E402
from oven.control.tokenizer import Tokenizer  # noqa: E402
from oven.inference.config import InferenceConfig  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

NUM_PAGES = 2048


def long_prompt(num_tokens: int) -> str:
    """About ``num_tokens`` tokens of plain text (the SmolLM2 tokenizer: about one token per 4.3 characters)."""
    sentence = "The shelves of the old library held maps, letters and ledgers from every harbour of the coast. "
    return sentence * max(1, num_tokens * 43 // (10 * len(sentence)))


def run(loop: ControlLoop, times: TokenTimes, args, prompt: str, prompts: int) -> dict:
    """Alice's run, beside ``prompts`` of bob's long prompts at once."""
    bob: list = []
    forwarded = 0

    def keep_bob_busy() -> None:
        nonlocal forwarded
        for inst in [b for b in bob if not b.alive]:
            forwarded += inst.exit_code == 0
            bob.remove(inst)
        while len(bob) < prompts:
            bob.append(loop.launch("text-completion", [prompt, "1"], owner="bob"))

    if prompts:
        keep_bob_busy()
        loop.run_until(lambda: keep_bob_busy() or False, 1)  # bob's prompts in flight first
    gaps, outputs, wall_s = alice_decodes(loop, times, args.instances, args.tokens, keep_bob_busy, 1800)
    for inst in bob:
        loop.terminate(inst.instance_id, "bench over")
    return {"gaps": gaps, "outputs": outputs, "wall_s": wall_s, "bob_prompts": forwarded}


def lone_prompt_s(loop: ControlLoop, prompt: str) -> float:
    """Seconds one of bob's prompts takes with nothing beside it (launch to exit; the better of two)."""
    seconds = []
    for _ in range(2):
        start = time.monotonic()
        inst = loop.launch("text-completion", [prompt, "1"], owner="bob")
        if not loop.run_until(lambda: not inst.alive, 600) or inst.exit_code != 0:
            raise SystemExit(f"bob's prompt alone failed: {inst.error}")
        seconds.append(time.monotonic() - start)
    return min(seconds)


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--instances", type=int, default=4, help="alice's instances (default: 4)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens each of alice's instances decodes (24)")
    parser.add_argument("--prompts", type=int, default=2, help="bob's long prompts in flight at once (default: 2)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="tokens of each of bob's prompts (1024)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 128, 256],
                        help="prefill_chunk_tokens to compare (0: forwards go whole; default: 0 128 256)")
    args = parser.parse_args()
    times = TokenTimes()
    prompt = long_prompt(args.prompt_tokens)
    config = InferenceConfig(model=args.model, endpoint=private_endpoint(), num_kv_pages=NUM_PAGES, torch_threads=1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="oven-chunked-") as root, \
            start_inference_process(config, timeout_s=600) as inference:
        prompt_tokens = len(Tokenizer(inference.info.tokenizer).encode(prompt))
        for chunk in [None, *args.chunks]:  # None: alice alone (chunking moot: her prompt is short)
            events: list = []
            loop = ControlLoop(inference.client(), ControlConfig(program_dir=str(Path(root) / "programs"),
                                                                 prefill_chunk_tokens=chunk or 0),
                               lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
            loop.events = events
            loop.programs.add((inferlets_dir() / "text-completion" / "text-completion.wasm").read_bytes(),
                              "text-completion", namespace=LIBRARY)
            if chunk is None:
                print("warm-up and alice alone ...", flush=True)
                run(loop, times, args, prompt, 0)
            else:
                print(f"alice beside {args.prompts} prompts of {prompt_tokens} tokens, "
                      f"{f'chunks of {chunk}' if chunk else 'whole forwards'} ...", flush=True)
            results[chunk] = run(loop, times, args, prompt, 0 if chunk is None else args.prompts)
            if chunk is not None:
                results[chunk]["lone_s"] = lone_prompt_s(loop, prompt)
            loop.close()
    alone = results.pop(None)

    def figures(r: dict) -> list[str]:
        gaps = r["gaps"]
        return [f"{sum(gaps) / len(gaps):.1f}", f"{percentile(gaps, 50):.1f}", f"{percentile(gaps, 99):.1f}",
                f"{max(gaps):.0f}", f"{r['wall_s']:.1f}"]

    rows = [["alone", *figures(alone), "", "", ""]]
    for chunk, r in results.items():
        rows.append([f"beside bob, {'whole forwards' if not chunk else f'chunks of {chunk}'}", *figures(r),
                     "yes" if r["outputs"] == alone["outputs"] else "NO",
                     f"{r['bob_prompts'] * prompt_tokens / r['wall_s']:.0f}", f"{r['lone_s']:.2f}"])
    table = markdown_table(["alice's run", "TPOT mean ms", "p50", "p99", "max", "alice's wall s", "same tokens",
                            "bob's prompt tokens/s", "one prompt alone s"], rows)
    sections = [
        f"Model `{args.model}`, alice: {args.instances} × `text-completion` × {args.tokens} tokens; bob: "
        f"{args.prompts} `text-completion` instances at once on prompts of {prompt_tokens} tokens, "
        "one token each, relaunched as they end.",
        table,
    ]
    print("\n\n".join(["\n".join(machine_lines()), *sections]))
    print(f"wrote {write_results('chunked_prefill', 'Chunked prefill', sections)}")


if __name__ == "__main__":
    main()
