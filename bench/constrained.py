"""Constrained decoding on the CPU: what a grammar costs per token, and where its masks are computed.

SmolLM2-135M (float32, one torch thread), a JSON Schema that keeps generating (an array of at least
1,000 objects {"name": string of at most 16, "age": integer}, so every step stays constrained), the
SDK's Temperature(1.0) sampler drawn in the inference process, ``--steps`` decode steps after the
prompt (48), sequences on disjoint KV pages.

(a) Mask cost per constrained token, in process (an ``Engine``): three sets of sequences decoded step
    by step in turn (token futures: each step reads the previous step's token from its slot), at
    batch 1 and 32: constrained with the engine's default (grammar masks computed and matchers
    advanced on its mask worker, beside the forward), constrained with ``masks_beside_forward``
    False (both inline in the step), and unconstrained. The step's own shaping work is timed around
    ``Engine._shape`` (wait for the batch's masks, apply them to its rows; inline, compute them
    too); the worker's jobs are timed on the worker; and the difference of the median constrained
    and unconstrained steps says what a grammar adds end to end (on a machine with no idle core the
    worker's CPU is taken from the forward). Goals: ``_shape`` p50 <= 100 µs per token at batch 1,
    <= 50 µs per item at batch 32.
(b) TPOT constrained / unconstrained through a real inference process (private endpoint, the same
    model and thread), 1 and 32 concurrent sequences in one batch per step, pipelined as the SDKs'
    ``generate``: step k+1 is sent (its input a token future) before step k's reply is read.
    Goal <= 1.10 at both.
(c) The design we rejected: masks computed outside the inference process, as a control layer would
    (an llguidance matcher per sequence here, in the bench's process): each step waits for the
    tokens, advances the matchers, computes their masks and sends the next step with an explicit
    ``allowed`` mask, so nothing is pipelined; against (b)'s constrained run (decoders in the
    inference process, pipelined). Its tokens must equal (b)'s: the same masks, the same draws.
    Beside them, the unconstrained loop without pipelining, for what pipelining alone is worth.

Cases are interleaved round by round (``--rounds``, medians). The load average is printed with the
results: on a shared machine it moves every figure. Results go to stdout and
``bench/results/constrained.md``.

    .venv/bin/python bench/constrained.py           # about 5 minutes on 2 cores
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, markdown_table, percentile, publish  # noqa: E402

from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.inference import engine as engine_module  # noqa: E402
from oven.inference.config import DEFAULT_MODEL, InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402
from oven.proto import grammar as g  # noqa: E402
from oven.proto import inference as p  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

log = logging.getLogger("constrained")
SCHEMA = {"type": "array", "minItems": 1000, "maxItems": 100000,
          "items": {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                    "properties": {"name": {"type": "string", "maxLength": 16},
                                   "age": {"type": "integer", "minimum": 0, "maximum": 120}}}}
PAGE, TOP_K, SEED = 16, 50, 1234
GOLDEN = 0x9E3779B97F4A7C15  # the SDK generator's step: a sample k steps ahead has state + k x this
GOAL_B1_US, GOAL_B32_US, GOAL_TPOT = 100, 50, 1.10
# Byte with little-endian bits (llguidance's words) -> the same byte with big-endian bits (numpy.packbits).
REVERSED = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], np.uint8)
CASES = {"unconstrained": "unconstrained, pipelined",
         "decoder": "constrained, decoder in the inference process, pipelined (chosen)",
         "outside": "constrained, masks outside, not pipelined (rejected)",
         "stepwise": "unconstrained, not pipelined"}


def parse_args():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model spec (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=48, help="decode steps per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of (b) and (c) (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="(default: 1 32)")
    parser.add_argument("--parts", default="a,b", help="a (in process), b (b and c, a real process); default a,b")
    return parser.parse_args()


class Batch:
    """``len(prompts)`` sequences on disjoint pages, each sampling a token per step into a future slot.

    ``mode``: None (unconstrained), "decoder" (a grammar decoder per sequence, in the inference
    process) or "outside" (an explicit ``allowed`` mask per step). Step 0 is the prompt; step k >= 1
    feeds step k-1's token, from its slot (``pipelined``) or as given."""

    def __init__(self, prompts: list[list[int]], first_page: int, steps: int, slot_base: int, mode: str | None,
                 grammar_text: str, decoder_base: int = 0):
        self.prompts, self.mode, self.slot_base, self.decoder_base = prompts, mode, slot_base, decoder_base
        self.pages_each = -(-(max(map(len, prompts)) + steps) // PAGE)
        self.first_page = first_page
        self.spec = p.DecoderSpec(grammar_text)

    @property
    def size(self) -> int:
        return len(self.prompts)

    def slot(self, k: int, i: int) -> int:
        return self.slot_base + (k % 3) * self.size + i  # step k+3 reuses step k's slot, long read by then

    def slots(self) -> list[int]:
        return [self.slot_base + j for j in range(3 * self.size)]

    def decoders(self) -> list[int]:
        return [self.decoder_base + i for i in range(self.size)]

    def request(self, k: int, tokens: list[int] | None = None, allowed: list[bytes] | None = None
                ) -> p.ForwardTextRequest:
        items = []
        for i, prompt in enumerate(self.prompts):
            if k == 0:
                ids, positions, futures = prompt, list(range(len(prompt))), None
            elif tokens is None:
                ids, positions, futures = [0], [len(prompt) + k - 1], [self.slot(k - 1, i)]
            else:
                ids, positions, futures = [tokens[i]], [len(prompt) + k - 1], None
            length = positions[-1] + 1
            used = -(-length // PAGE)
            pages = list(range(self.first_page + i * self.pages_each, self.first_page + i * self.pages_each + used))
            shape = None
            if self.mode == "decoder":
                shape = p.ShapeSpec(decoder_id=self.decoder_base + i, decoder=self.spec if k == 0 else None)
            elif self.mode == "outside":
                shape = p.ShapeSpec(allowed=allowed[i])
            sample = p.SampleSpec(self.slot(k, i), p.SAMPLE_TEMPERATURE, 1.0, 0.0,
                                  (SEED + i + k * GOLDEN) % 2**64, shape)
            items.append(p.ForwardTextItem(ids, positions, pages, length - (used - 1) * PAGE, [len(ids) - 1], TOP_K,
                                           token_futures=futures, sample=sample))
        return p.ForwardTextRequest(items)


def checked(reply) -> p.ForwardTextReply:
    if isinstance(reply, p.ErrorReply):
        raise RuntimeError(f"{reply.code}: {reply.message}")
    errors = [e for e in reply.errors if e is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} items failed, first: {errors[0].code}: {errors[0].message}")
    return reply


def prompts_of(tokenizer, count: int) -> list[list[int]]:
    return [tokenizer.encode(f"Request {i}: list {i + 3} people of {['Paris', 'Oslo', 'Lima', 'Pune'][i % 4]} as a "
                             "JSON array of objects with their name and age.").ids for i in range(count)]


# -- (a) in process --------------------------------------------------------------------------------------

class Timers:
    """Wall time of ``Engine._shape`` (on the step's path) and of the mask worker's jobs (beside it)."""

    def __init__(self, engine: Engine):
        self.shape: list[float] = []
        self.masks: list[tuple[float, int]] = []  # (seconds, items)
        self.advance: list[tuple[float, int]] = []
        shape, masks, advance = engine._shape, engine_module.grammar_masks, engine_module.advance_matchers

        def timed_shape(*args):
            start = time.perf_counter()
            try:
                return shape(*args)
            finally:
                self.shape.append(time.perf_counter() - start)

        def timed(fn, into):
            def run(work, *args):
                start = time.perf_counter()
                try:
                    return fn(work, *args)
                finally:
                    into.append((time.perf_counter() - start, len(work)))
            return run

        engine._shape = timed_shape
        engine_module.grammar_masks = timed(masks, self.masks)
        engine_module.advance_matchers = timed(advance, self.advance)


def in_process(args, tokenizer, text: str) -> tuple[list[str], dict]:
    sizes = args.batch_sizes
    biggest = max(sizes)
    prompts = prompts_of(tokenizer, biggest)
    pages_each = -(-(max(map(len, prompts)) + args.steps) // PAGE)
    cfg = InferenceConfig(model=args.model, device="cpu", dtype="float32", page_size=PAGE,
                          num_kv_pages=3 * biggest * pages_each, num_host_pages=1, torch_threads=1)
    engine = Engine(cfg, progress=False)
    timers = Timers(engine)
    rows, figures = [], {}
    for b in sizes:
        batches = {"con": Batch(prompts[:b], 0, args.steps, 0, "decoder", text, decoder_base=1000 * b),
                   "inline": Batch(prompts[:b], b * pages_each, args.steps, 3 * b, "decoder", text,
                                   decoder_base=1000 * b + b),
                   "unc": Batch(prompts[:b], 2 * b * pages_each, args.steps, 6 * b, None, text)}
        for name, batch in batches.items():
            engine.masks_beside_forward = name != "inline"
            checked(engine.handle(batch.request(0)))
        steps = {name: [] for name in batches}
        shape = {name: [] for name in batches}
        timers.masks.clear(), timers.advance.clear()
        drawn = []
        for k in range(1, args.steps + 1):
            names = list(batches)[k % 3:] + list(batches)[:k % 3]  # each case first, second and third in turn
            for name in names:
                engine.masks_beside_forward = name != "inline"
                timers.shape.clear()
                start = time.perf_counter()
                reply = checked(engine.handle(batches[name].request(k)))
                steps[name].append(time.perf_counter() - start)
                shape[name] += timers.shape
                if name == "con":
                    drawn.append(reply.sampled[0])
        engine.masks_beside_forward = True
        engine._mask_worker.submit(lambda: None).result()
        stops = set(engine.source.tokenizer.stop_token_ids)
        if stops & set(drawn):
            raise RuntimeError("the grammar ended: a stop token was drawn, so later steps were not constrained")
        masks = sorted(s / n for s, n in timers.masks)
        advance = sorted(s / n for s, n in timers.advance)
        median = {name: statistics.median(values) for name, values in steps.items()}
        f = figures[b] = {"masks_us": percentile(masks, 50) * 1e6, "advance_us": percentile(advance, 50) * 1e6,
                          "step_unc_ms": median["unc"] * 1e3, "sample": tokenizer.decode(drawn[:40])}
        goal = GOAL_B1_US if b == 1 else GOAL_B32_US
        for name, label in (("con", "beside the forward (default)"), ("inline", "inline in `_shape`")):
            shaped = sorted(shape[name])
            f[name] = {"shape_p50_us": percentile(shaped, 50) / b * 1e6,
                       "shape_p90_us": percentile(shaped, 90) / b * 1e6,
                       "added_us": (median[name] - median["unc"]) / b * 1e6, "step_ms": median[name] * 1e3}
            c = f[name]
            rows.append([b, label, f"{c['shape_p50_us']:.0f}", f"{c['shape_p90_us']:.0f}",
                         f"{f['masks_us']:.0f}" if name == "con" else "(in `_shape`)",
                         f"{f['advance_us']:.0f}" if name == "con" else "(inline)",
                         f"{c['added_us']:.0f}", f"{f['step_unc_ms']:.1f}", f"{c['step_ms']:.1f}",
                         f"{'met' if c['shape_p50_us'] <= goal else 'missed'} (<= {goal})"])
            log.info("(a) batch %d, masks %s: _shape p50 %.0f us per item, added %.0f us per item", b, label,
                     c["shape_p50_us"], c["added_us"])
        engine.handle(p.DropDecodersRequest(batches["con"].decoders() + batches["inline"].decoders()))
        engine.handle(p.FreeFuturesRequest([s for batch in batches.values() for s in batch.slots()]))
    table = markdown_table(["batch", "grammar masks", "`_shape` p50 µs/item (on the path)", "p90",
                            "grammar mask µs/item (worker)", "matcher advance µs/item (worker)",
                            "constrained − unconstrained step µs/item", "unconstrained step ms",
                            "constrained step ms", "goal (`_shape` p50)"], rows)
    sample = figures[sizes[0]]["sample"]
    lines = [f"- batch {b}: `_shape` p50 **{figures[b]['con']['shape_p50_us']:.0f} µs** per item "
             f"({'met' if figures[b]['con']['shape_p50_us'] <= (GOAL_B1_US if b == 1 else GOAL_B32_US) else 'missed'}"
             f", goal <= {GOAL_B1_US if b == 1 else GOAL_B32_US}); end to end a grammar adds "
             f"{figures[b]['con']['added_us']:.0f} µs per item beside the forward, "
             f"{figures[b]['inline']['added_us']:.0f} inline" for b in sizes]
    text_out = (f"**(a) Mask cost per constrained token, in process** ({args.steps} steps per case; constrained with "
                "masks beside the forward, constrained with masks inline, and unconstrained steps in turn). On the "
                "step's path: `Engine._shape` (wait for the batch's masks, apply them to its rows: a table lookup and "
                "an add per row; inline, compute them first). Beside it, on the mask worker while the forward runs: "
                "computing the grammar masks (llguidance) and advancing the matchers past the draws. The "
                "constrained − unconstrained column subtracts the median unconstrained step from the median "
                "constrained one.\n\n" + table + "\n\n" + "\n".join(lines)
                + f"\n\nThe first sequence's text (batch {sizes[0]}): `{sample!r}`")
    return [text_out], figures


# -- (b) and (c) through a real inference process --------------------------------------------------------

def run_case(client, vocab: int, prompts, steps: int, case: str, text: str, llg_tokenizer,
             decoder_base: int) -> tuple[float, list]:
    """TPOT (s) of one run and the tokens drawn, per sequence."""
    mode = {"unconstrained": None, "stepwise": None, "decoder": "decoder", "outside": "outside"}[case]
    batch = Batch(prompts, 0, steps, 0, mode, text, decoder_base)
    matchers = [g.matcher(text, llg_tokenizer) for _ in prompts] if case == "outside" else []
    words = np.zeros((vocab + 31) // 32, np.int32)

    def masks(tokens: list[int] | None) -> list[bytes]:
        out = []
        for i, matcher in enumerate(matchers):
            if tokens is not None:
                matcher.consume_token(tokens[i])
            matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            out.append(REVERSED[words.view(np.uint8)[:(vocab + 7) // 8]].tobytes())
        return out

    reply = checked(client.call(batch.request(0, allowed=masks(None) if matchers else None)))
    drawn = [[t] for t in reply.sampled]
    start = time.perf_counter()
    if case in ("unconstrained", "decoder"):  # pipelined: step k+1 goes out before step k's reply is read
        sent = {1: client.send(batch.request(1))}
        for k in range(1, steps + 1):
            if k < steps:
                sent[k + 1] = client.send(batch.request(k + 1))
            reply = checked(client.wait(sent.pop(k)))
            for i, t in enumerate(reply.sampled):
                drawn[i].append(t)
    else:
        for k in range(1, steps + 1):
            tokens = [d[-1] for d in drawn]
            reply = checked(client.call(batch.request(k, tokens, masks(tokens) if matchers else None)))
            for i, t in enumerate(reply.sampled):
                drawn[i].append(t)
    tpot = (time.perf_counter() - start) / steps
    client.call(p.FreeFuturesRequest(batch.slots()))
    if mode == "decoder":
        client.call(p.DropDecodersRequest(batch.decoders()))
    return tpot, drawn


def served(args, tokenizer, text: str) -> tuple[list[str], dict]:
    sizes = args.batch_sizes
    prompts = prompts_of(tokenizer, max(sizes))
    pages_each = -(-(max(map(len, prompts)) + args.steps) // PAGE)
    config = InferenceConfig(model=args.model, endpoint=private_endpoint(), num_kv_pages=max(sizes) * pages_each + 8,
                             torch_threads=1)
    times = {(b, case): [] for b in sizes for case in CASES}
    tokens = {}
    with start_inference_process(config, timeout_s=300) as process, process.client() as client:
        info = client.info()
        llg_tokenizer = g.tokenizer(info.tokenizer.tokenizer_json, info.vocab_size, info.tokenizer.stop_token_ids)
        decoder_base = 1
        for r in range(args.rounds):
            for b in sizes:
                order = list(CASES)[r % len(CASES):] + list(CASES)[:r % len(CASES)]
                for case in order:
                    tpot, drawn = run_case(client, info.vocab_size, prompts[:b], args.steps, case, text,
                                           llg_tokenizer, decoder_base)
                    decoder_base += b
                    times[b, case].append(tpot)
                    tokens.setdefault((b, case), drawn)
                    log.info("(b) round %d batch %d %s: %.1f ms per step", r, b, case, tpot * 1e3)
    rows, figures = [], {}
    for b in sizes:
        m = {case: statistics.median(times[b, case]) for case in CASES}
        same_con = tokens[b, "decoder"] == tokens[b, "outside"]
        same_unc = tokens[b, "unconstrained"] == tokens[b, "stepwise"]
        figures[b] = {"tpot_ms": {c: v * 1e3 for c, v in m.items()}, "ratio": m["decoder"] / m["unconstrained"],
                      "rejected": m["outside"] / m["decoder"], "pipelining": m["stepwise"] / m["unconstrained"],
                      "gap_ms": (m["outside"] - m["decoder"]) * 1e3,
                      "same_constrained": same_con, "same_unconstrained": same_unc}
        for case, label in CASES.items():
            rows.append([b, label, f"{m[case] * 1e3:.1f}", f"{m[case] / m['unconstrained']:.3f}x",
                         {"decoder": "yes" if same_con else "NO", "outside": "yes" if same_con else "NO",
                          "unconstrained": "yes" if same_unc else "NO", "stepwise": "yes" if same_unc else "NO"}[case]])
    table = markdown_table(["sequences", "case", "TPOT ms (median)", "÷ unconstrained pipelined",
                            "same tokens as its pair"], rows)
    lines = []
    for b in sizes:
        f = figures[b]
        lines.append(f"- {b} sequence{'s' if b > 1 else ''}: constrained ÷ unconstrained (pipelined) "
                     f"**{f['ratio']:.3f}**"
                     f" ({'met' if f['ratio'] <= GOAL_TPOT else 'missed'}, goal <= {GOAL_TPOT}); the rejected design "
                     f"÷ the chosen one **{f['rejected']:.3f}** ({f['gap_ms']:+.1f} ms per step); unconstrained "
                     f"without ÷ with pipelining {f['pipelining']:.3f}")
    text_out = (f"**(b) TPOT and (c) the rejected design, through a real inference process** ({args.steps} steps "
                f"per run, median of {args.rounds} interleaved rounds; one batch per step holds every sequence). "
                "Pairs that must draw the same tokens: the two constrained designs, and the unconstrained loop with "
                "and without pipelining.\n\n" + table + "\n\n" + "\n".join(lines))
    return [text_out], figures


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    torch.set_num_threads(1)
    from oven.inference.models import resolve_model
    from tokenizers import Tokenizer
    source = resolve_model(args.model)
    tokenizer = Tokenizer.from_str(source.tokenizer.tokenizer_json)
    text = g.grammar_text("json-schema", json.dumps(SCHEMA))
    loads = [f"at the start {load()}"]
    sections, figures = [], {}
    parts = set(args.parts.split(","))
    if "a" in parts:
        out, figures["a"] = in_process(args, tokenizer, text)
        sections += out
        loads.append(f"after (a) {load()}")
    if "b" in parts:
        out, figures["b"] = served(args, tokenizer, text)
        sections += out
        loads.append(f"after (b, c) {load()}")
    intro = (f"Model `{args.model}` (float32, one torch thread), JSON Schema `{json.dumps(SCHEMA)}`, Temperature(1.0) "
             f"drawn in the inference process, top-{TOP_K} distributions. Load average (1 / 5 / 15 min, "
             f"{os.cpu_count()} logical cores, shared): " + "; ".join(loads) + ".")
    publish("constrained", "Constrained decoding: mask cost and TPOT", [intro] + sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
