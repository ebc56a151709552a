"""Do batches fill end to end? Concurrent `text-completion` runs through `oven serve` against the same
engine decoding the same batch in process (issue 15's "batches that fill").

* **served**: `oven serve` on the model (one torch thread, the given dispatch policies, one server
  each), ``--instances`` concurrent `text-completion` runs of ``--tokens`` tokens launched at once
  over one client; the wall time from the first launch to the last exit, and the server's own
  batch statistics (batches, commands, mean items per batch, and the seconds batches took from
  send to reply: where the wall time went that no batch was running);
* **in process**: an :class:`~oven.inference.engine.Engine` on the same model and thread count,
  ``--instances`` sequences at the served runs' mean context, timing one decode step of the whole
  batch (median of ``--reps``): the rate the device could give if every batch held every instance.

Goal: at least 14 items per batch on average, and end-to-end decode tokens/s ≥ 0.9× the in-process
batch rate. Writes ``results/batch_fill.md``.

    .venv/bin/python bench/batch_fill.py [--model smollm2-135m-instruct] [--instances 16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import PagedBatch, check_reply, interleaved_times, machine_lines, markdown_table, text_prompts, \
    write_results  # noqa: E402
from served import Server, run_to_exit, wasm  # noqa: E402

from oven.control.tokenizer import Tokenizer  # noqa: E402
from oven.inference.config import InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402

PROMPT = "Once upon a time"
GOAL_ITEMS, GOAL_RATE = 14, 0.9


def served(model: str, policy: str, instances: int, tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="oven-batch-fill-") as root:
        srv = Server(Path(root), model, "--torch-threads", "1", "--dispatch-policy", policy)
        try:
            with srv.client() as client:
                program = client.upload(wasm("text-completion"))
                (alone,) = run_to_exit(client, {client.launch(program, [PROMPT, str(tokens)])}).values()
                before = client.stats()
                started = time.monotonic()
                ids = {client.launch(program, [PROMPT, str(tokens)]) for _ in range(instances)}
                results = run_to_exit(client, ids)
                wall = time.monotonic() - started
                after = client.stats()
        finally:
            srv.stop()
    batches, commands = after.num_batches - before.num_batches, after.num_commands - before.num_commands
    return {"policy": policy, "wall_s": wall, "batches": batches, "commands": commands,
            "device_s": after.device_s - before.device_s,
            "correct": sum(r == alone for r in results.values())}


def in_process(model: str, instances: int, tokens: int, reps: int) -> tuple[float, int]:
    """Seconds per decode step of ``instances`` sequences at the served runs' mean context, and that context."""
    torch.set_num_threads(1)
    page_size, context = 16, 2 * tokens  # bounds the pages; the context is set below
    cfg = InferenceConfig(model=model, device="cpu", page_size=page_size, torch_threads=1, num_host_pages=1,
                          num_kv_pages=instances * -(-(context + 1) // page_size))
    engine = Engine(cfg, progress=False)
    context = len(Tokenizer(engine.source.tokenizer).encode(PROMPT)) + tokens // 2
    batch = PagedBatch(text_prompts(engine.source.tokenizer.tokenizer_json, instances, context), page_size)
    for request in batch.prefill_requests(cfg.max_batch_tokens):
        check_reply(engine.forward_text(request))
    step = batch.decode_request(instances)
    times = interleaved_times({"step": lambda: check_reply(engine.forward_text(step))}, reps, 3)["step"]
    return statistics.median(times), context


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--instances", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--policies", default="adaptive,t", help="dispatch policies, comma-separated")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    runs = [served(args.model, policy, args.instances, args.tokens) for policy in args.policies.split(",")]
    step_s, context = in_process(args.model, args.instances, args.tokens, args.reps)
    rate_in_process = args.instances / step_s
    decode_tokens = args.instances * args.tokens
    rows = [[r["policy"], f"{r['wall_s']:.1f}", f"{decode_tokens / r['wall_s']:.0f}",
             f"{decode_tokens / r['wall_s'] / rate_in_process:.2f}x", r["batches"], r["commands"],
             f"{r['commands'] / r['batches']:.1f}", f"{r['device_s']:.1f}",
             f"{1e3 * r['device_s'] / r['batches']:.1f}", f"{r['correct']} of {args.instances}"] for r in runs]
    best = runs[0]
    items, ratio = best["commands"] / best["batches"], decode_tokens / best["wall_s"] / rate_in_process
    lines = [*machine_lines(),
             f"{args.instances} concurrent `text-completion` × {args.tokens} tokens on `{args.model}` (one torch "
             f"thread), launched at once over one client; in process: one decode step of {args.instances} "
             f"sequences of {context} tokens (the served runs' mean context), median of "
             f"{args.reps}: {step_s * 1e3:.1f} ms, **{rate_in_process:.0f} tokens/s**.", "",
             markdown_table(["dispatch policy", "wall s", "tokens/s end to end", "/ in process", "batches",
                             "commands", "items per batch", "batches s", "ms per batch",
                             "outputs equal to a run alone"], rows), "",
             f"- `{best['policy']}`: {items:.1f} items per batch (goal ≥ {GOAL_ITEMS}: "
             f"{'met' if items >= GOAL_ITEMS else 'missed'}); {ratio:.2f}× the in-process batch rate (goal ≥ "
             f"{GOAL_RATE}: {'met' if ratio >= GOAL_RATE else 'missed'}; the wall time includes launch, prefill "
             "and exit)."]
    print("\n".join(lines))
    print(f"\nwrote {write_results('batch_fill', 'Batches that fill, end to end', lines)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
