"""Prefix caching: time to first token with and without a cached prefix, side by side.

The ``prefix-cache`` inferlet (inferlets/prefix-cache) forwards a shared prefix once and exports
its KV pages; later instances import them and forward only their own suffix. With ``--snapshot``
it saves the prefix as a named KV snapshot instead, and later instances find it through the
server's prefix index (``Context.from_prefix``: one ``match-snapshot`` over their whole prompt).
Here a real inference process serves SmolLM2-135M-Instruct on this CPU; each run is one instance
that generates a single token, so launch-to-exit is its time to first token (instance start
included, the same in every case). Cases alternate round by round: ``--no-cache`` (prefix +
suffix forwarded), the export imported by name, and the snapshot matched by prefix (suffix only;
the export and the snapshot are made once before timing). Every case must generate the same token.

    .venv/bin/python bench/prefix_cache.py [--prefix-tokens 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import markdown_table, publish  # noqa: E402

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig, default_program_dir  # noqa: E402
from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402
from oven.control.runtime.loop import ControlLoop  # noqa: E402
from oven.control.tokenizer import Tokenizer  # noqa: E402
from oven.inference.config import InferenceConfig  # noqa: E402

PARAGRAPH = ("You are a careful assistant for a logistics company. Answer questions about shipments, "
             "warehouses and delivery windows precisely, cite the policy section you rely on, and say "
             "when the policy does not cover a case. ")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prefix-tokens", type=int, default=1024, help="about this many prefix tokens")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the inference process")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    config = InferenceConfig(model=args.model, endpoint=private_endpoint(), torch_threads=args.threads)
    with start_inference_process(config, timeout_s=300) as inference:
        events = []
        loop = ControlLoop(inference.client(), ControlConfig(
            program_dir=str(Path(default_program_dir()).parent / "bench-programs")),
            lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
        loop.programs.add((inferlets_dir() / "prefix-cache" / "prefix-cache.wasm").read_bytes(), "prefix-cache")
        tokenizer = Tokenizer(loop.info.tokenizer)
        prefix = PARAGRAPH
        while len(tokenizer.encode(prefix)) < args.prefix_tokens:
            prefix += PARAGRAPH
        prefix_tokens = len(tokenizer.encode(prefix))

        def run(flags: list[str], suffix: str) -> tuple[float, dict]:
            start = time.perf_counter()
            inst = loop.launch("prefix-cache", [prefix, suffix, "1", *flags])
            assert loop.run_until(lambda: not inst.alive, 300), "the instance did not finish"
            took = time.perf_counter() - start
            if inst.exit_code != 0:
                raise RuntimeError(f"prefix-cache failed: {inst.error}")
            (message,) = [p for i, k, p in events if i == inst.instance_id and k == "message"]
            return took, json.loads(message)

        run([], "Warm-up: export the prefix.")  # the exporter; also compiles and warms everything up
        run(["--snapshot"], "Warm-up: save the prefix as a snapshot.")
        cases = {"no cache": ["--no-cache"], "export (by name)": [], "snapshot (by prefix)": ["--snapshot"]}
        times: dict[str, list[float]] = {case: [] for case in cases}
        forwarded = {}
        for r in range(args.rounds):
            suffix = f"Question {r}: where is parcel {1000 + r}?"
            tokens = set()
            for case, flags in cases.items():
                took, report = run(flags, suffix)
                times[case].append(took)
                forwarded[case] = report["forwarded"]
                tokens.add(tuple(report["tokens"]))
                assert report["imported"] == (case != "no cache")
            assert len(tokens) == 1, f"the cases generated different tokens: {tokens}"
            print(f"round {r + 1}: " + ", ".join(f"{case} {times[case][-1] * 1e3:7.1f} ms" for case in cases),
                  flush=True)
        loop.close()

    med = {case: statistics.median(values) * 1e3 for case, values in times.items()}
    rows = [[case, f"{med[case]:.1f}", f"{min(times[case]) * 1e3:.1f}", f"{max(times[case]) * 1e3:.1f}",
             forwarded[case], f"{med['no cache'] / med[case]:.1f}x"] for case in times]
    table = markdown_table(["case", "TTFT median ms", "min", "max", "tokens forwarded", "speed-up"], rows)
    summary = (f"Prefix {prefix_tokens} tokens ({prefix_tokens - 1} held by the export and the snapshot), "
               f"{args.model}, {args.threads} torch thread(s), {args.rounds} rounds: time to first token without "
               f"the cache / with the export = **{med['no cache'] / med['export (by name)']:.1f}x**, / with the "
               f"snapshot = **{med['no cache'] / med['snapshot (by prefix)']:.1f}x**.")
    publish("prefix_cache", "Prefix caching: time to first token", [table, summary])
    return 0


if __name__ == "__main__":
    sys.exit(main())
