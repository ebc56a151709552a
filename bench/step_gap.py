"""How long the device waits for the control layer between two steps, read from the inference
process's own timeline (issue 15, xLLM's figure: ≤ 200 µs).

A control loop in this process drives ``--instances`` (1 and 32) concurrent greedy decode loops of
``--tokens`` tokens, ``text-completion`` (Python SDK, ``generate``: the server draws the tokens, one
step in flight ahead), ``text-completion --stepwise`` (the same with the sampler run in the
inferlet: today's path, one round trip per token) and ``hello-python --fused`` (the raw API, one
forward-text per token), against two devices: the fake one of
``fake_inference.py`` (5 ms + 0.05 ms per item) and SmolLM2 on the CPU (one torch thread). The
inference server keeps a timeline of its batches (``--timeline-batches``); the gap is the time
from one batch's end to the next one's start, over the decode phase (batches of forward-text
items of one token each: launch and prefill left out). The device is idle for the gap's length:
the reply's trip back, the wasm resume, sampling in the inferlet, its host calls, batch forming
and the next request's trip there.

    .venv/bin/python bench/step_gap.py [--instances 1 32] [--tokens 64] [--devices fake,smollm2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine_lines, markdown_table, write_results  # noqa: E402
from fake_inference import FakeDeviceConfig, FakeInferenceProcess, real_tokenizer  # noqa: E402

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig, default_program_dir  # noqa: E402
from oven.control.inference_client import InferenceClient  # noqa: E402
from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.control.runtime.loop import ControlLoop  # noqa: E402
from oven.inference.config import InferenceConfig  # noqa: E402
from oven.proto import inference as p  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

TIMELINE = 1 << 16
PROMPT = "Once upon a time"
PROGRAMS = {"text-completion": lambda tokens: [PROMPT, str(tokens)],
            "text-completion --stepwise": lambda tokens: [PROMPT, str(tokens), "--stepwise"],
            "hello-python --fused": lambda tokens: [PROMPT, str(tokens), "--fused"],
            "text-completion-rust": lambda tokens: [PROMPT, str(tokens)]}
GOAL_US = 200


def decode_gaps(timeline: p.TimelineReply, instances: int) -> tuple[list[float], float, float, float]:
    """Gaps (µs) before each decode batch after the first, the mean items per decode batch, the
    device's busy share over the decode phase, and its time per output token (ms): the phase's span
    per decode batch, each instance's token per batch."""
    batches = list(zip(timeline.call_types, timeline.num_items, timeline.starts_ns, timeline.ends_ns))
    decode = [i for i, (kind, items, _, _) in enumerate(batches) if kind == "forward_text" and items <= instances]
    first, last = decode[len(decode) // 10], decode[-1]  # skip the ramp: launches and prefills overlap it
    span = batches[first:last + 1]
    gaps = [(start - prev_end) / 1e3 for (_, _, _, prev_end), (_, _, start, _) in zip(span, span[1:])]
    busy = sum(end - start for _, _, start, end in span) / (span[-1][3] - span[0][2])
    items = statistics.mean(batches[i][1] for i in decode[len(decode) // 10:])
    return gaps, items, busy, (span[-1][3] - span[0][2]) / len(span) / 1e6


def measure(client: InferenceClient, program_dir: str, program: str, instances: int, tokens: int) -> dict:
    loop = ControlLoop(client, ControlConfig(program_dir=program_dir, instance_memory_mib=256), lambda *_: None)
    try:
        name, *flags = program.split()
        loop.programs.add((inferlets_dir() / name / f"{name}.wasm").read_bytes(), name)
        loop.replicas[0].client.call(p.TimelineRequest(clear=True))
        launched = [loop.launch(name, PROGRAMS[program](tokens)) for _ in range(instances)]
        if not loop.run_until(lambda: not any(i.alive for i in launched), 900):
            raise TimeoutError(f"{program} x {instances} did not finish")
        if any(i.exit_code != 0 for i in launched):
            raise RuntimeError(f"{program}: an instance failed: {next(i for i in launched if i.exit_code)}")
        gaps, items, busy, tpot_ms = decode_gaps(loop.replicas[0].client.call(p.TimelineRequest(clear=True)), instances)
    finally:
        loop.close()
    return {"program": program, "instances": instances, "median": statistics.median(gaps),
            "p90": sorted(gaps)[int(0.9 * len(gaps))], "items": items, "busy": busy, "n": len(gaps),
            "tpot_ms": tpot_ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--devices", default="fake,smollm2", help="fake and/or a model spec, comma-separated")
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=list(PROGRAMS))
    parser.add_argument("--program-dir", default=str(Path(default_program_dir()).parent / "bench-programs"))
    args = parser.parse_args()
    rows, sections = [], [*machine_lines()]
    for device in args.devices.split(","):
        if device == "fake":
            server = FakeInferenceProcess(private_endpoint(), FakeDeviceConfig(timeline_batches=TIMELINE),
                                          real_tokenizer())
            client = lambda server=server: InferenceClient(server.endpoint)  # noqa: E731
            label = "fake (5 ms + 0.05 ms/item)"
        else:
            model = "smollm2-135m-instruct" if device == "smollm2" else device
            server = start_inference_process(InferenceConfig(model=model, endpoint=private_endpoint(),
                                                             torch_threads=1, timeline_batches=TIMELINE))
            client = server.client  # CURVE, with the key the server was started with
            label = f"{model} (CPU, 1 thread)"
        with server:
            for program in args.programs:
                for instances in args.instances:
                    r = measure(client(), args.program_dir, program, instances, args.tokens)
                    print(f"{label:30} {program:22} x{instances:<3} gap median {r['median']:8.0f} us  p90 "
                          f"{r['p90']:8.0f} us  {r['items']:5.1f} items/batch  device busy {r['busy']:.0%}  "
                          f"TPOT {r['tpot_ms']:.2f} ms ({1 / r['busy']:.3f}x the step)",
                          flush=True)
                    rows.append([label, f"`{program}`", instances, f"{r['median']:.0f}", f"{r['p90']:.0f}",
                                 f"{r['items']:.1f}", f"{r['busy']:.0%}", f"{r['tpot_ms']:.2f}",
                                 f"{1 / r['busy']:.3f}x", r["n"]])
    sections += [f"{args.tokens} greedy tokens per instance; gap = the device idle between two decode batches, "
                 f"from the inference process's timeline (µs). Goal: median ≤ {GOAL_US} µs. TPOT = the decode "
                 "phase's span per decode batch (ms), ÷ step = TPOT over the mean batch time (issue 15: ≤ 1.04x "
                 "at one instance).", "",
                 markdown_table(["device", "inferlet", "instances", "gap median µs", "gap p90 µs", "items/batch",
                                 "device busy", "TPOT ms", "÷ step", "gaps"], rows)]
    print(f"\nwrote {write_results('step_gap', 'Device idle between decode steps', sections)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
