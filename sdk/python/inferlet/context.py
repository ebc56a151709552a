"""Context: a token sequence and the KvPages that hold its K/V, on a queue of its own.

Token i sits at position i in slot i of the context's pages. Filled tokens wait in
``pending`` until the next forward, so a decode step is one fused ``forward-text``
call. A flush (the prefill) forwards every pending token but the last, which the next
decode step feeds and gets the distribution after it from the same call; a decode step
with nothing pending feeds the last forwarded token again. Forks share full pages by
reference (counted here) and copy the partial last page; a page shared with another
context, imported or exported, is copied before it is written or masked (copy-on-write).
"""

from __future__ import annotations

from componentize_py_types import Err
from wit_world.imports import forward, futures, kvpages

from . import host
from .queue import Queue
from .sampling import Greedy, Sampler
from .stop import Stop
from .tasks import OvenError

_refs: dict[int, int] = {}  # page handle -> contexts holding it, for pages held by more than one
_imported: set[int] = set()  # handles onto exported pages (imported, or our own export): never written


def _pages_for(tokens: int) -> int:
    return -(-tokens // host.page_size())


def _shared(page: int) -> bool:
    """Held by another context too, or exported: copied before it is written or masked."""
    return page in _imported or _refs.get(page, 1) > 1


class Context:
    def __init__(self, priority: int = 0, queue: Queue | None = None):
        self.queue = queue or Queue(priority)
        self.tokens: list[int] = []   # forwarded: their K/V is in the pages
        self.pending: list[int] = []  # filled, forwarded with the next step
        self.pages: list[int] = []
        self.page_size = host.page_size()
        self._hidden: set[int] = set()

    def __len__(self) -> int:
        return len(self.tokens) + len(self.pending)

    # -- filling (no call until the next forward) ---------------------------------------------
    def fill(self, text: str) -> None:
        self.pending += host.encode(text)

    def fill_tokens(self, tokens: list[int]) -> None:
        self.pending += tokens

    def fill_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> None:
        self.fill(host.render_chat(messages, add_generation_prompt))

    # -- forwarding ---------------------------------------------------------------------------
    async def flush(self) -> None:
        """Prefill: forward every pending token but the last, keeping no distribution.

        The last stays pending: the next decode step feeds it and gets the distribution after
        it from the same call (a fork carries it, so each fork feeds it itself).
        """
        if len(self.pending) > 1:
            await self._forward([], 1, len(self.pending) - 1)

    async def next_dist(self, top_k: int = 0):
        """Forward the pending tokens; the distribution after the last (``token_ids``, ``probs``).

        With nothing pending, the last token is forwarded again (its K/V slot rewritten with the
        same values). Raises ValueError if the context is empty.
        """
        self._feed_last_again()
        (dist,) = await self._forward([len(self.pending) - 1], top_k)
        return dist

    async def dists(self, top_k: int = 0) -> list:
        """Forward the pending tokens; the distribution after each of them (speculative decoding).

        With nothing pending, the last token is forwarded again: one distribution, after it.
        Raises ValueError if the context is empty.
        """
        self._feed_last_again()
        return await self._forward(list(range(len(self.pending))), top_k)

    async def decode_step(self, sampler: Sampler | None = None) -> int:
        """Sample the next token and fill it (it is forwarded with the next step); as ``next_dist``."""
        sampler = sampler or Greedy()
        dist = await self.next_dist(sampler.top_k)
        token = sampler.sample(dist.token_ids, dist.probs)
        self.pending.append(token)
        return token

    async def generate(self, sampler: Sampler | None = None, stop: Stop = Stop()) -> str:
        """Decode until ``stop``; the text generated (end tokens and stop strings cut off). With
        nothing pending, the first step feeds the last token again; an empty context raises
        ValueError.

        The loop is ``decode_step`` written out: it is the per-token path of most inferlets,
        and every coroutine frame costs microseconds in WebAssembly.
        """
        sampler = sampler or Greedy()
        end, generated, shown = host.stop_tokens(), [], []  # shown: generated less end tokens
        top_k, sample, limit = sampler.top_k, sampler.sample, stop.max_tokens
        eos = end if stop.eos else ()
        # A stop string that appears now ends in the newest token, so it lies within the last
        # len(string) tokens (a token is at least one character): decode only those, not all.
        tail = max(map(len, stop.strings), default=0) + 1
        self._feed_last_again()
        while True:
            end_of_pending = len(self.tokens) + len(self.pending)
            if not self._has_room(end_of_pending):
                await self._make_room(end_of_pending)
            (dist,) = await self._issue_forward([len(self.pending) - 1], top_k, len(self.pending))
            token = sample(dist.token_ids, dist.probs)
            self.pending.append(token)
            generated.append(token)
            if len(generated) >= limit or token in eos:
                break
            if stop.strings and token not in end:
                shown.append(token)
                if stop.reached(generated, host.decode(shown[-tail:]), end):
                    break
        self.generated = generated
        return stop.cut(host.decode([t for t in generated if t not in end]))

    async def generate_until(self, *strings: str, max_tokens: int = 256, sampler: Sampler | None = None) -> str:
        return await self.generate(sampler, Stop(max_tokens=max_tokens, strings=strings))

    def _feed_last_again(self) -> None:
        """With nothing pending, make the last forwarded token pending again, so that a decode step
        has a token to feed (forwarding rewrites its slot and shows it if it was hidden)."""
        if self.pending:
            return
        if not self.tokens:
            raise ValueError("the context is empty: fill it before decoding")
        self.pending = [self.tokens.pop()]
        self._hidden.discard(len(self.tokens))

    async def _forward(self, output_indices: list[int], top_k: int, count: int | None = None) -> list:
        """Forward the first ``count`` pending tokens (all of them by default)."""
        count = len(self.pending) if count is None else count
        end = len(self.tokens) + count
        if not self._has_room(end):
            await self._make_room(end)
        return await self._issue_forward(output_indices, top_k, count)

    def _has_room(self, end: int) -> bool:
        """Do the pages cover the tokens up to ``end``, and are the ones the pending tokens before it
        go to ours alone (nothing to allocate or copy first)?"""
        used = -(-end // self.page_size)
        if used > len(self.pages):
            return False
        if not (_refs or _imported):  # the common case: nothing is shared anywhere
            return True
        return not any(_shared(page) for page in self.pages[len(self.tokens) // self.page_size:used])

    async def _make_room(self, end: int) -> None:
        await self._reserve(end)
        for index in range(len(self.tokens) // self.page_size, _pages_for(end)):
            await self._own(index)

    def _issue_forward(self, output_indices: list[int], top_k: int, count: int):
        """The ``forward-text`` call for the first ``count`` pending tokens (``_has_room`` must hold
        up to them); its future."""
        tokens, start = self.pending[:count], len(self.tokens)
        end = start + count
        used = -(-end // self.page_size)
        positions = [start] if end == start + 1 else list(range(start, end))
        handle = forward.forward_text(self.queue.id, tokens, positions, self.pages[:used],
                                      end - (used - 1) * self.page_size, output_indices, top_k)
        self.tokens += tokens
        self.pending = self.pending[count:]
        return self.queue.result(handle, futures.take_dists)

    async def _reserve(self, tokens: int) -> None:
        missing = _pages_for(tokens) - len(self.pages)
        if missing > 0:
            self.pages += await self.queue.result(kvpages.alloc_kvpages(self.queue.id, missing), futures.take_handles)

    async def _own(self, index: int) -> None:
        """Make page ``index`` this context's alone before it is written or masked."""
        page = self.pages[index]
        if not _shared(page):
            return
        (fresh,) = await self.queue.result(kvpages.alloc_kvpages(self.queue.id, 1), futures.take_handles)
        self.queue.later(kvpages.copy_kvpage(self.queue.id, page, fresh, 0, 0, self.page_size))
        self.pages[index] = fresh
        self._release([page])

    # -- forking, hiding, truncating ----------------------------------------------------------
    async def fork(self, priority: int = 0) -> "Context":
        """A copy that continues independently: full pages shared, the partial last page copied."""
        if self.queue._unchecked:  # a mask may still be in flight on our queue: let it land first
            await self.queue.synchronize()
        child = Context(priority)
        child.tokens, child.pending, child._hidden = list(self.tokens), list(self.pending), set(self._hidden)
        full, rest = divmod(len(self.tokens), self.page_size)
        child.pages = self.pages[:full]
        for page in child.pages:
            _refs[page] = _refs.get(page, 1) + 1
        if rest:
            await child._reserve(len(self.tokens))
            child.queue.later(kvpages.copy_kvpage(child.queue.id, self.pages[full], child.pages[full], 0, 0, rest))
        return child

    async def drop(self, start: int, end: int) -> None:
        """Hide forwarded tokens ``[start, end)`` from every later forward (they keep their positions)."""
        self._hidden.update(range(start, end))
        await self._apply_mask(start, end)

    async def undrop(self, start: int, end: int) -> None:
        self._hidden.difference_update(range(start, end))
        await self._apply_mask(start, end)

    async def _apply_mask(self, start: int, end: int) -> None:
        if not 0 <= start < end <= len(self.tokens):
            raise ValueError(f"[{start}, {end}) is not a range of the {len(self.tokens)} forwarded tokens")
        page_size = self.page_size
        for index in range(start // page_size, (end - 1) // page_size + 1):
            await self._own(index)
            base = index * page_size
            bits = [base + i in self._hidden or base + i >= len(self.tokens) for i in range(page_size)]
            self.queue.later(kvpages.mask_kvpage(self.queue.id, self.pages[index], bits))

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (forwarded or pending); later slots are rewritten."""
        if length >= len(self.tokens):
            self.pending = self.pending[:length - len(self.tokens)]
            return
        self.tokens, self.pending = self.tokens[:length], []
        self._hidden = {i for i in self._hidden if i < length}
        keep = _pages_for(length)
        self._release(self.pages[keep:])
        self.pages = self.pages[:keep]

    # -- while waiting: move the KV cache out of the device tier -------------------------------
    async def offload(self) -> None:
        """Move this context's pages to the host tier (they stay its pages; restore before forwarding)."""
        await self.queue.unit(kvpages.offload_kvpages(self.queue.id, self.pages))

    async def restore(self) -> None:
        await self.queue.unit(kvpages.restore_kvpages(self.queue.id, self.pages))

    def evict(self) -> None:
        """Free the pages and keep the tokens: the next forward recomputes their K/V (a re-prefill)."""
        self._release(self.pages)
        self.pages, self._hidden = [], set()
        self.pending, self.tokens = self.tokens + self.pending, []

    # -- sharing across inferlets -------------------------------------------------------------
    def export(self, name: str) -> int:
        """Publish the pages of the forwarded tokens under ``name``; returns how many tokens they hold."""
        pages = self.pages[:_pages_for(len(self.tokens))]
        try:
            kvpages.export_kvpages(pages, name)
        except Err as err:
            raise OvenError(err.value) from None
        _imported.update(pages)  # later writes and masks copy first
        return len(self.tokens)

    @classmethod
    def imported(cls, name: str, tokens: list[int], priority: int = 0) -> "Context":
        """A context over the pages exported as ``name``, which hold ``tokens`` (the exporter's prefix)."""
        try:
            pages = kvpages.import_kvpages(name)
        except Err as err:
            raise OvenError(err.value) from None
        if len(pages) != _pages_for(len(tokens)):
            kvpages.dealloc_kvpages(0, pages)
            raise ValueError(f"export {name!r} has {len(pages)} pages; {len(tokens)} tokens need {_pages_for(len(tokens))}")
        ctx = cls(priority)
        ctx.tokens, ctx.pages = list(tokens), pages
        _imported.update(pages)
        return ctx

    # -- freeing ------------------------------------------------------------------------------
    def _release(self, pages: list[int]) -> None:
        free = []
        for page in pages:
            holders = _refs.pop(page, 1) - 1
            if holders > 1:
                _refs[page] = holders
            elif holders == 0:
                _imported.discard(page)
                free.append(page)
        if free:
            futures.discard(kvpages.dealloc_kvpages(self.queue.id, free))

    def close(self) -> None:
        """Free the pages (shared ones once their last holder closes) and give the queue back."""
        if self.queue is not None:
            self._release(self.pages)
            self.pages = []
            self.queue.close()
            self.queue = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the host may be gone when the interpreter is torn down
            pass
