"""Time per token at batch 1: `text-completion` through `oven serve` against Hugging Face `generate`.

Both on the same weights, dtype (float32 on CPU) and torch thread count, greedy, the same prompt;
rounds interleave the two so drift hits both alike.

* **oven**: one `oven serve` (``--torch-threads``), `text-completion` (Python SDK, pipelined
  ``generate``: the server samples and the next step is in flight before the inferlet sees a
  token), from ``launch`` to the exit event, end to end: instantiation, prefill, decode, exit;
* **oven, stepwise**: the same with ``--stepwise`` (the inferlet samples each token itself, so
  every step waits for the round trip): what pipelining saves;
* **HF**: ``model.generate`` from the token ids to its return, prefill included.

Time per token = the run's wall time / the tokens it generated (both stop at the same end token:
greedy on the same weights gives the same tokens, which the bench checks). Issue 15's goal: oven ≤
0.95× HF.

    .venv/bin/python bench/hf_relative.py [--tokens 64] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, machine_lines, markdown_table, write_results  # noqa: E402
from served import Server, run_to_exit, wasm  # noqa: E402

from oven.control.tokenizer import Tokenizer  # noqa: E402
from oven.inference.config import DEFAULT_MODEL  # noqa: E402
from oven.inference.models import resolve_model  # noqa: E402

PROMPT = "The history of the printing press begins"
GOAL = 0.95


def oven_run(client, program: str, tokens: int, *flags: str) -> tuple[float, list[int]]:
    started = time.monotonic()
    instance_id = client.launch(program, [PROMPT, str(tokens), *flags])
    (code, error, messages), = run_to_exit(client, {instance_id}).values()
    wall = time.monotonic() - started
    if code != 0 or not messages:
        raise SystemExit(f"text-completion failed: exit {code}: {error}")
    return wall, [int(t) for t in messages[-1].split()]


def hf_run(model, prompt_ids: list[int], tokens: int, stop_ids: list[int]) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt_ids])
    started = time.monotonic()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False,
                             eos_token_id=stop_ids, pad_token_id=stop_ids[0])
    wall = time.monotonic() - started
    return wall, out[0, len(prompt_ids):].tolist()


def through_stop(tokens: list[int], stop_ids: list[int]) -> list[int]:
    """The tokens up to and including the first stop token (HF pads after it; oven sends it last)."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in stop_ids), len(tokens))
    return tokens[:end]


def main() -> int:
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens at most (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides (default %(default)s)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    source = resolve_model(args.model)
    if source.weights_dir is None:
        raise SystemExit(f"{args.model} has no weights to compare with Hugging Face")
    model = AutoModelForCausalLM.from_pretrained(source.weights_dir, dtype=torch.float32).eval()
    tokenizer = Tokenizer(source.tokenizer)
    prompt_ids, stop_ids = tokenizer.encode(PROMPT), sorted(tokenizer.stop_token_ids)
    times: dict[str, list[float]] = {"oven": [], "oven, stepwise": [], "HF generate": []}
    outputs: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="oven-hf-relative-") as root:
        srv = Server(Path(root), args.model, "--torch-threads", str(args.threads))
        try:
            with srv.client() as client:
                program = client.upload(wasm("text-completion"))
                oven_run(client, program, 4)  # warm: the compiled component, the first batch
                hf_run(model, prompt_ids, 4, stop_ids)
                for r in range(args.rounds):
                    for name in times:
                        if name == "HF generate":
                            wall, out = hf_run(model, prompt_ids, args.tokens, stop_ids)
                        else:
                            flags = ("--stepwise",) if name == "oven, stepwise" else ()
                            wall, out = oven_run(client, program, args.tokens, *flags)
                        generated = through_stop(out, stop_ids)
                        times[name].append(wall / len(generated))
                        outputs.setdefault(name, generated)
                    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                        f"{name} {1e3 * t[-1]:.2f} ms/token" for name, t in times.items()), flush=True)
        finally:
            srv.stop()
    same = outputs["oven"] == outputs["HF generate"] == outputs["oven, stepwise"]
    hf = statistics.median(times["HF generate"])
    rows = [[name, f"{1e3 * statistics.median(t):.2f}", f"{1e3 * min(t):.2f}", f"{statistics.median(t) / hf:.2f}x"]
            for name, t in times.items()]
    ratio = statistics.median(times["oven"]) / hf
    lines = [*machine_lines(),
             f"`{args.model}`, float32, {args.threads} torch thread(s), greedy, up to {args.tokens} new tokens "
             f"({len(outputs['oven'])} generated) after a {len(prompt_ids)}-token prompt; {args.rounds} interleaved "
             f"rounds after one warm-up each; time per token = wall time / tokens generated, end to end (oven: "
             f"launch to exit; HF: `generate` call). Same tokens on all three: {'yes' if same else '**no**'}.", "",
             markdown_table(["run", "median ms/token", "best ms/token", "/ HF generate"], rows), "",
             f"- oven / HF generate: {ratio:.2f}x (goal ≤ {GOAL}: {'met' if ratio <= GOAL else 'missed'})."]
    print("\n".join(lines))
    print(f"\nwrote {write_results('hf_relative', 'Time per token at batch 1 against Hugging Face', lines)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
