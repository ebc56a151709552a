"""What the benchmark scripts share: naming the machine, paged decode batches, interleaved timing, tables.

Imported by the scripts beside it (``python bench/<script>.py`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Callable

import torch

from oven.proto import inference as p

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ALICE_PROMPT = "Once upon a time"  # the decoding client of the isolation benches (alice_decodes)
SHIPPED_ADAPTER = Path(str(files("oven.client.asynclm") / "adapter"))  # the AsyncLM adapter oven ships


def shown_path(path: Path) -> str:
    """``path`` as a results file names it: relative to the working folder if it lies under it, else
    its last part, so that no machine's absolute path is written."""
    return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else path.name


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose description is a script's docstring's first paragraph and whose help
    ends with the rest, as written."""
    first, _, rest = doc.partition("\n\n")
    return argparse.ArgumentParser(description=first, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=rest)


def machine_lines() -> list[str]:
    """The CPU (model name from /proc/cpuinfo), core count, torch version and threads, and the GPU if any."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = info.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in info:
        cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
    lines = [f"CPU: {cpu}, {os.cpu_count()} logical cores, {len(os.sched_getaffinity(0))} usable",
             f"torch {torch.__version__}, Python {platform.python_version()}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
    return lines


@dataclass
class PagedBatch:
    """Sequences of one prompt length on disjoint pages, ready for prefill and decode steps.

    Sequence i owns pages ``[i * pages_per_seq, (i + 1) * pages_per_seq)``: enough
    for its prompt plus one decode token. A decode step feeds one token at
    position ``prompt_len``, so every rep *rewrites the same slot*: the context
    stays ``prompt_len + 1`` tokens long and steps are comparable across reps.
    """

    prompts: list[list[int]]
    page_size: int
    top_k: int = 1

    @property
    def prompt_len(self) -> int:
        return len(self.prompts[0])

    @property
    def pages_per_seq(self) -> int:
        return math.ceil((self.prompt_len + 1) / self.page_size)

    def _context(self, i: int, length: int) -> tuple[list[int], int]:
        num_pages = math.ceil(length / self.page_size)
        first = i * self.pages_per_seq
        return list(range(first, first + num_pages)), length - (num_pages - 1) * self.page_size

    def prefill_requests(self, max_tokens: int) -> list[p.ForwardTextRequest]:
        """Whole prompts, as few requests as ``max_tokens`` per request allows."""
        per_request = max(1, max_tokens // self.prompt_len)
        items = []
        for i, prompt in enumerate(self.prompts):
            pages, last = self._context(i, self.prompt_len)
            items.append(p.ForwardTextItem(prompt, list(range(self.prompt_len)), pages, last,
                                           [self.prompt_len - 1], top_k=self.top_k))
        return [p.ForwardTextRequest(items[k:k + per_request]) for k in range(0, len(items), per_request)]

    def decode_request(self, batch_size: int) -> p.ForwardTextRequest:
        """One token for each of the first ``batch_size`` sequences, at position ``prompt_len``."""
        items = []
        for i in range(batch_size):
            pages, last = self._context(i, self.prompt_len + 1)
            token = self.prompts[i][-1]
            items.append(p.ForwardTextItem([token], [self.prompt_len], pages, last, [0], top_k=self.top_k))
        return p.ForwardTextRequest(items)

    @property
    def num_pages(self) -> int:
        return len(self.prompts) * self.pages_per_seq


def text_prompts(tokenizer_json: str, num: int, length: int) -> list[list[int]]:
    """``num`` distinct prompts of exactly ``length`` tokens, from the model's own tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    base = ("A paged KV cache splits every sequence's keys and values into fixed-size pages, so many "
            "requests of different lengths share one pool of device memory without fragmentation. ")
    prompts = []
    for i in range(num):
        ids = tokenizer.encode(f"Request {i}: summarise this in {i + 3} words. " + base).ids
        while len(ids) < length:
            ids += tokenizer.encode(base).ids
        prompts.append(ids[:length])
    return prompts


def check_reply(reply: p.ForwardTextReply) -> p.ForwardTextReply:
    errors = [e for e in reply.errors if e is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} items failed, first: {errors[0].code}: {errors[0].message}")
    return reply


def interleaved_times(cases: dict[str, Callable[[], object]], reps: int, warmup: int,
                      sync: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """Seconds of each call of each case, timed round-robin (one call of every case per round) so drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_idx in range(warmup + reps):
        for name, fn in cases.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if round_idx >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in times.items()}


def iqr(values: list[float]) -> float:
    """Interquartile range: the spread of the middle half of the samples."""
    quartiles = statistics.quantiles(values, n=4)
    return quartiles[2] - quartiles[0]


class TokenTimes:
    """When each token future of each instance settled, by wrapping ``calls._settle`` in this process
    (a ControlLoop here): decode steps are never split into chunks, so they settle there."""

    def __init__(self):
        from oven.control.runtime import calls
        from oven.control.runtime.futures import TOKEN

        self.by_instance: dict[str, list[float]] = defaultdict(list)
        original = calls._settle

        def timed(inst, fut, reply, i):
            done = original(inst, fut, reply, i)
            if fut.kind == TOKEN:
                self.by_instance[inst.instance_id].append(time.monotonic())
            return done

        calls._settle = timed

    def gaps_ms(self, instances) -> list[float]:
        """The times (ms) between consecutive tokens of each of ``instances``, ascending (and forgets them)."""
        out = []
        for inst in instances:
            times = self.by_instance.pop(inst.instance_id, [])
            out += [(b - a) * 1000 for a, b in zip(times, times[1:])]
        return sorted(out)


def alice_decodes(loop, times: TokenTimes, instances: int, tokens: int, while_running: Callable[[], None],
                  timeout_s: float = 600) -> tuple[list[float], list[str], float]:
    """``alice`` runs ``instances`` `text-completion` × ``tokens`` tokens on ``loop`` (a ControlLoop that
    holds it), calling ``while_running`` each turn until they end: her gaps between tokens (ms,
    ascending), each instance's token message, and the seconds the run took. Exits on a failure."""
    start = time.monotonic()
    alice = [loop.launch("text-completion", [ALICE_PROMPT, str(tokens)], owner="alice") for _ in range(instances)]

    def done() -> bool:
        while_running()
        return not any(i.alive for i in alice)

    if not loop.run_until(done, timeout_s):
        raise SystemExit(f"alice's instances did not finish in {timeout_s:.0f} s")
    wall_s = time.monotonic() - start
    bad = [i for i in alice if i.exit_code != 0]
    if bad:
        raise SystemExit(f"alice: {len(bad)} instances failed, first: {bad[0].error}")
    outputs = [next(p for iid, k, p in loop.events if iid == i.instance_id and k == "message") for i in alice]
    return times.gaps_ms(alice), outputs, wall_s


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ascending values, nearest rank; NaN for none."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))]


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, title: str, sections: list[str]) -> Path:
    """Write ``bench/results/<name>.md``: the title, the machine, then the sections; return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.md"
    machine = "\n".join(f"- {line}" for line in machine_lines())
    stamp = time.strftime("%Y-%m-%d %H:%M %Z")
    path.write_text(f"# {title}\n\nMeasured {stamp} on:\n\n{machine}\n\n" + "\n\n".join(sections) + "\n")
    return path


def publish(name: str, title: str, sections: list[str]) -> Path:
    """Print the machine and ``sections``, then write them (:func:`write_results`) and say where."""
    print("\n".join(machine_lines()) + "\n\n" + "\n\n".join(sections))
    path = write_results(name, title, sections)
    print(f"\nwrote {path}")
    return path
