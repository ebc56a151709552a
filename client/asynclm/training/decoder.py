"""What the check and the on-policy runs decode with: sessions that rank a context's next tokens.

A session holds one context's KV cache; ``ranked(ids)`` gives the ``TOP_K`` (or ``top_k``) likeliest next tokens
after the context ``ids`` (likeliest first), forwarding only what its cache does not hold yet
(the longest prefix it shares with the ids cached is kept, the rest dropped), so a caller may
rewind as well as extend. Two decoders make sessions:

* :class:`TransformersDecoder`: transformers (+ PEFT), one forward per call; the reference.
* :class:`EngineDecoder`: oven's own paged engine in this process, the served model's numbers
  (its LoRA executor, its attention); sessions on other threads are batched, one forward for
  every session waiting, as the server batches inferlets. A check of 50 tasks is one thread each.

Greedy choices on the two agree except where two tokens tie within float error
(``tests/test_asynclm_training_check.py`` compares them).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .segments import common_prefix_length

TOP_K = 64  # tokens ranked per step: the token monitor may refuse the likeliest ones
DECODERS = ("engine", "transformers")


def make_decoder(kind: str, model: str, adapter: Path | None, threads: int, max_sessions: int = 1):
    """A decoder of ``kind`` (:data:`DECODERS`) on ``model`` with ``adapter`` (a PEFT folder, or None),
    and the model's source (its tokenizer)."""
    from oven.inference.models import resolve_model

    if kind == "engine":
        return EngineDecoder(model, adapter, max_sessions, threads=threads), resolve_model(model)
    if kind != "transformers":
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, not {kind!r}")
    import torch

    from .model import load_base, with_adapter

    torch.set_num_threads(threads)
    base, source = load_base(model, 0)
    if adapter is not None:
        base = with_adapter(base, adapter)
    return TransformersDecoder(base), source


class TransformersDecoder:
    """Sessions on a transformers causal LM (``model``, with or without a PEFT adapter)."""

    max_sessions = 1  # one forward per call, nothing batched: sessions run one at a time

    def __init__(self, model):
        self.model = model.eval()

    def session(self) -> TransformersSession:
        return TransformersSession(self.model)

    def close(self) -> None:
        pass


class TransformersSession:
    def __init__(self, model):
        self.model, self.cache, self.cached_ids = model, None, []

    def ranked(self, ids: list[int], top_k: int = TOP_K) -> list[int]:
        import torch

        keep = min(common_prefix_length(self.cached_ids, ids), len(ids) - 1)  # the last one's logits are needed
        if self.cache is not None and keep < self.cache.get_seq_length():
            self.cache.crop(keep - self.cache.get_seq_length())  # a count to drop (transformers 5)
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids[keep:]]), cache=self.cache, use_cache=True)
        self.cache, self.cached_ids = out.cache, list(ids)
        return out.logits[0, -1].topk(top_k).indices.tolist()

    def close(self) -> None:
        self.cache, self.cached_ids = None, []


@dataclass
class _Step:
    """One session's forward, waiting to be batched: its new tokens go to positions ``start``..."""
    session: EngineSession
    token_ids: list[int]
    start: int
    top_k: int = TOP_K
    ranked: list[int] | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class EngineDecoder:
    """Sessions on oven's paged engine (``oven.inference.engine.Engine``), batched across threads.

    ``max_sessions`` sessions may be open at once; the KvPage pool holds ``max_sessions`` contexts
    of ``mean_context`` tokens (one may be longer where others are shorter). A batch is formed when every open session waits
    or ``gather_s`` after the first one did, up to ``max_batch_tokens`` new tokens.
    """

    def __init__(self, model: str, adapter: Path | None = None, max_sessions: int = 50, mean_context: int = 2048,
                 threads: int | None = None, max_batch_tokens: int = 4096, gather_s: float = 0.005):
        from oven.inference.config import InferenceConfig
        from oven.inference.engine import Engine
        from oven.proto import inference as p

        page_size = 16
        pages_each = -(-mean_context // page_size)
        self.engine = Engine(InferenceConfig(
            model=model, device="cpu", page_size=page_size, num_kv_pages=max_sessions * pages_each,
            num_host_pages=1, num_embeds=1, torch_threads=threads, max_batch_tokens=max_batch_tokens,
            max_batch_items=max(max_sessions, 1)), progress=False)
        self.page_size, self.max_batch_tokens, self.max_sessions = page_size, max_batch_tokens, max_sessions
        self.adapter_id = p.BASE_MODEL
        if adapter is not None:
            reply = self.engine.handle(p.LoadAdapterRequest(1, adapter.name or "adapter", str(adapter)))
            if isinstance(reply, p.ErrorReply):
                raise ValueError(reply.message)  # it names the folder
            self.adapter_id = 1
        self.free_pages = list(range(max_sessions * pages_each))
        self.gather_s = gather_s
        self.cond = threading.Condition()
        self.waiting: list[_Step] = []
        self.open_sessions = 0
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, name="engine-decoder", daemon=True)
        self.thread.start()

    def session(self) -> EngineSession:
        with self.cond:
            self.open_sessions += 1
        return EngineSession(self)

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join()

    # -- called by sessions (their own threads) -------------------------------------------
    def _pages(self, count: int) -> list[int]:
        with self.cond:
            if count > len(self.free_pages):
                raise RuntimeError("the decoder's KvPage pool is exhausted: more sessions or longer contexts "
                                   "than it was made for")
            taken, self.free_pages = self.free_pages[:count], self.free_pages[count:]
            return taken

    def _release(self, pages: list[int], closing: bool = False) -> None:
        with self.cond:
            self.free_pages += pages
            if closing:
                self.open_sessions -= 1
                self.cond.notify_all()

    def _forward(self, step: _Step) -> list[int]:
        with self.cond:
            self.waiting.append(step)
            self.cond.notify_all()
        step.done.wait()
        if step.error is not None:
            raise RuntimeError(f"the engine refused a decode step: {step.error}")
        return step.ranked

    # -- the batching thread ----------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.stopped:
                    self.cond.wait()
                if self.stopped:
                    return
                deadline = time.monotonic() + self.gather_s
                while len(self.waiting) < self.open_sessions and (left := deadline - time.monotonic()) > 0:
                    self.cond.wait(left)
                batch, tokens = [], 0
                for step in list(self.waiting):
                    if batch and tokens + len(step.token_ids) > self.max_batch_tokens:
                        break
                    batch.append(step)
                    tokens += len(step.token_ids)
                del self.waiting[:len(batch)]
            self._run(batch)

    def _run(self, batch: list[_Step]) -> None:
        import numpy as np

        from oven.proto import inference as p

        items = []
        for step in batch:
            end = step.start + len(step.token_ids)
            pages = step.session.pages
            items.append(p.ForwardTextItem(
                token_ids=step.token_ids, positions=list(range(step.start, end)), kv_page_ids=list(pages),
                kv_last_page_len=end - (len(pages) - 1) * self.page_size, output_indices=[len(step.token_ids) - 1],
                top_k=step.top_k, adapter_id=self.adapter_id))
        try:
            reply = self.engine.handle(p.ForwardTextRequest(items))
            for step, error, dists in zip(batch, reply.errors, reply.dists):
                if error is not None:
                    step.error = f"{error.code}: {error.message}"
                else:
                    step.ranked = np.frombuffer(dists[0].token_ids, dtype="<i4").tolist()
        except Exception as exc:  # every waiting session hears it, none hangs
            for step in batch:
                step.error = f"{type(exc).__name__}: {exc}"
        for step in batch:
            step.done.set()


class EngineSession:
    """One context on an :class:`EngineDecoder`; use it from one thread."""

    def __init__(self, decoder: EngineDecoder):
        self.decoder, self.pages, self.cached_ids = decoder, [], []
        self.closed = False

    def ranked(self, ids: list[int], top_k: int = TOP_K) -> list[int]:
        keep = min(common_prefix_length(self.cached_ids, ids), len(ids) - 1)
        page_size = self.decoder.page_size
        needed = -(-len(ids) // page_size)
        kept_pages = -(-keep // page_size)
        if kept_pages < len(self.pages):  # pages past the kept prefix hold only what is dropped
            self.decoder._release(self.pages[kept_pages:])
            self.pages = self.pages[:kept_pages]
        self.pages += self.decoder._pages(needed - len(self.pages))
        ranked = self.decoder._forward(_Step(self, list(ids[keep:]), keep, top_k))
        self.cached_ids = list(ids)
        return ranked

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.decoder._release(self.pages, closing=True)
            self.pages, self.cached_ids = [], []
