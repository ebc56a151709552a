"""A FAKE inference backend for control-layer benchmarks: the real protocol, no model, a simulated device.

It binds a ZeroMQ ROUTER and speaks :data:`oven.proto.inference.CODEC` exactly
like ``inference/server.py`` (same request and reply types, replies in arrival
order, an :class:`IdleNotice` to every peer served since the last one whenever
its queue runs dry), but it runs no model: each batch "runs" for a simulated
device time

    step_s = (base_ms + per_item_ms * num_items) / 1000

spent in ``time.sleep`` (the process sleeps, it does not spin, so it leaves the
CPU to the control process on a small machine), and every item succeeds:
``AckReply`` for calls with no payload, ``NextDistReply`` / ``ForwardTextReply``
carrying one fixed top-1 distribution (``token_id`` with probability 1); an item that asks the
server to sample (a token future) draws ``token_id``, as every sampler would from that distribution,
and an input naming a token future needs no resolving: the fake ignores its inputs.
``info`` answers at once with a plausible :class:`InfoReply` built around the
real SmolLM2 tokenizer, so inferlets tokenize and detokenize for real.

The cost model is what makes throughput grow with batch size the way a GPU's
does: a batch of 128 costs 11.4 ms with the defaults, 128 batches of one cost
645 ms. What it does not capture: prefill cost (a 500-token item costs what a
one-token item costs), attention growing with context, memory traffic, and the
real server's encode/decode time (that of the fake is not simulated device time
and adds to each step, tens of microseconds for a decode batch).

Use :class:`FakeInferenceProcess` from a benchmark, or run it alone:
``.venv/bin/python bench/fake_inference.py --endpoint ipc:///tmp/fake.sock``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import signal
import struct
import sys
import time
from dataclasses import dataclass

from oven.inference.server import InferenceServer
from oven.inference.validate import ItemFailure
from oven.proto import inference as p

FAKE_MODEL_NAME = "fake-device (no model; SmolLM2 tokenizer)"


@dataclass(frozen=True, slots=True)
class FakeDeviceConfig:
    """The simulated device and the pool sizes the fake reports in ``info``."""

    base_ms: float = 5.0  # fixed cost of one batch (kernel launches, weight reads)
    per_item_ms: float = 0.05  # added per item of the batch
    token_id: int = 1000  # the one token every distribution holds; not a stop token of SmolLM2
    page_size: int = 16
    num_kv_pages: int = 16384
    num_embeds: int = 65536
    num_host_pages: int = 4096
    max_batch_items: int = 512
    max_batch_tokens: int = 8192
    timeline_batches: int = 0  # the server's timeline (TimelineRequest); 0: off

    def __post_init__(self) -> None:
        if self.base_ms < 0 or self.per_item_ms < 0:
            raise ValueError("base_ms and per_item_ms must be non-negative")
        if min(self.page_size, self.num_kv_pages, self.num_embeds, self.max_batch_items, self.max_batch_tokens) < 1:
            raise ValueError("page_size, pool sizes and batch limits must be positive")

    def step_s(self, num_items: int) -> float:
        """Simulated device seconds of one batch of ``num_items`` items."""
        return (self.base_ms + self.per_item_ms * num_items) / 1000.0


def info_reply(config: FakeDeviceConfig, tokenizer: p.TokenizerSpec) -> p.InfoReply:
    """SmolLM2-135M's shape and tokenizer, the fake's pools and limits."""
    return p.InfoReply(
        model_name=FAKE_MODEL_NAME, architecture="llama", vocab_size=49152, hidden_size=576, num_layers=30,
        max_position=8192, device="fake", dtype="none", attention_backend="fake", page_size=config.page_size,
        num_kv_pages=config.num_kv_pages, num_embeds=config.num_embeds, num_host_pages=config.num_host_pages,
        max_batch_items=config.max_batch_items, max_batch_tokens=config.max_batch_tokens, default_top_k=1,
        traits=[p.TRAIT_INPUT_TEXT, p.TRAIT_TOKENIZE, p.TRAIT_OUTPUT_TEXT, p.TRAIT_FORWARD, p.TRAIT_FORWARD_TEXT,
                p.TRAIT_KVPAGE_HOST_TIER],
        tokenizer=tokenizer)


class FakeEngine:
    """Stands in for ``inference.engine.Engine`` behind the real ``InferenceServer`` loop:
    a sleeping, always-succeeding device with the same handler table."""

    def __init__(self, config: FakeDeviceConfig, tokenizer: p.TokenizerSpec):
        self.config = config
        self._info = info_reply(config, tokenizer)
        self._dist = p.TopKDist(struct.pack("<i", config.token_id), struct.pack("<f", 1.0))
        self._started_at = time.monotonic()
        self.num_batches = self.num_items = 0
        self.handlers = {
            p.InfoRequest: lambda _request: self._info,
            p.HealthRequest: self._health,
            p.NextDistRequest: self._next_dist,
            p.ForwardTextRequest: self._forward_text,
            p.FreeFuturesRequest: lambda _request: p.AckReply([]),
            **{cls: self._ack for cls in p.BATCH_REQUESTS if cls not in (p.NextDistRequest, p.ForwardTextRequest)},
        }

    def llg_tokenizer(self):
        """The server gives each connection's decoders this (``Engine.llg_tokenizer``): the fake has no
        grammars, so a decoder asked of it fails its item."""
        raise ItemFailure(p.ERR_BAD_ARGUMENT, "grammars are not available from the fake device")

    def handle(self, request, _token_futures=None):
        return self.handlers[type(request)](request)

    def check_batch_size(self, num_items: int, request=None) -> None:
        """The server asks before it decodes a batch; the control loop sends none past the limits the
        fake's InfoReply gave it, so there is nothing to refuse."""

    def _run(self, num_items: int) -> list[None]:
        time.sleep(self.config.step_s(num_items))
        self.num_batches += 1
        self.num_items += num_items
        return [None] * num_items

    def _ack(self, request) -> p.AckReply:
        return p.AckReply(self._run(len(request.items)))

    def _next_dist(self, request: p.NextDistRequest) -> p.NextDistReply:
        return p.NextDistReply(self._run(len(request.items)), [self._dist] * len(request.items))

    def _forward_text(self, request: p.ForwardTextRequest) -> p.ForwardTextReply:
        errors = self._run(len(request.items))
        sampled = [self.config.token_id if item.sample is not None else None for item in request.items]
        return p.ForwardTextReply(errors, [[self._dist] * len(item.output_indices) for item in request.items], sampled)

    def _health(self, _request) -> p.HealthReply:
        return p.HealthReply(True, time.monotonic() - self._started_at, self.num_batches, self.num_items, 0)


def serve(endpoint: str, config: FakeDeviceConfig, tokenizer: p.TokenizerSpec) -> None:
    """Process entry point: serve until SIGTERM or SIGINT."""
    server = InferenceServer(endpoint, timeline_batches=config.timeline_batches)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    server.serve_forever(FakeEngine(config, tokenizer))


def real_tokenizer(model: str = "smollm2-135m-instruct") -> p.TokenizerSpec:
    """The real model's tokenizer spec (converts the embedded GGUF once; a few seconds, imports torch)."""
    from oven.inference.models import resolve_model

    return resolve_model(model).tokenizer


class FakeInferenceProcess:
    """The fake server in a child process (spawned: no state shared with the caller); a context manager."""

    def __init__(self, endpoint: str, config: FakeDeviceConfig, tokenizer: p.TokenizerSpec, timeout_s: float = 60):
        from oven.control.inference_client import InferenceClient

        self.endpoint, self.config = endpoint, config
        self.process = multiprocessing.get_context("spawn").Process(
            target=serve, args=(endpoint, config, tokenizer), name="fake-inference", daemon=True)
        self.process.start()
        with InferenceClient(endpoint, timeout_s=timeout_s) as client:
            self.info = client.info()

    def health(self) -> p.HealthReply:
        from oven.control.inference_client import InferenceClient

        with InferenceClient(self.endpoint) as client:
            return client.call(p.HealthRequest())

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)

    def __enter__(self) -> "FakeInferenceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    defaults = FakeDeviceConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="ipc:///tmp/oven-fake-inference.sock", help="ROUTER address to bind")
    parser.add_argument("--base-ms", type=float, default=defaults.base_ms,
                        help="simulated device ms per batch (default %(default)s)")
    parser.add_argument("--per-item-ms", type=float, default=defaults.per_item_ms,
                        help="simulated device ms per batch item (default %(default)s)")
    args = parser.parse_args(argv)
    config = FakeDeviceConfig(base_ms=args.base_ms, per_item_ms=args.per_item_ms)
    print(f"fake inference: serving on {args.endpoint} (step = {config.base_ms} ms + {config.per_item_ms} ms/item)",
          file=sys.stderr, flush=True)
    serve(args.endpoint, config, real_tokenizer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
