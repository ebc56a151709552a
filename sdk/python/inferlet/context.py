"""Context: a token sequence and the KvPages that hold its K/V, on a queue of its own.

Token i sits at position i in slot i of the context's pages. Filled tokens wait in ``pending``
until the next forward, so a decode step is one fused ``forward-text`` call. A flush (the
prefill) forwards every pending token but the last, which the next decode step feeds and gets the
distribution after it from the same call; a decode step with nothing pending feeds the last
forwarded token again. While generating, pages are allocated ahead of need and prefetched. This
is the Rust SDK's ``Context`` (``sdk/rust/oven/src/context.rs``) call for call: the same host calls
in the same order, so the same pages; editing (fork, masks, truncate) is in ``edit.py``, moving
and sharing the KV cache (offload, evict, export, import) in ``sharing.py``, recomputing K/V the
server discarded in ``recompute.py``.
"""

from __future__ import annotations

from wit_world.imports import forward, futures, kvpages

from . import host
from .pipelined import Pipelined
from .edit import Editing
from .pages import PageTable
from .queue import Queue
from .recompute import Recompute, set_recomputable
from .sampling import Greedy, Sampler, server_spec
from .shaping import Logprobs, Shape
from .sharing import Sharing
from .stop import Stop
from .tasks import HostFuture, OvenError, spawn

# While generating, pages are allocated this many tokens ahead of need (4 pages of 16).
ALLOC_AHEAD_TOKENS = 64


class Context(Editing, Sharing, Recompute, Pipelined):
    """A token sequence being generated, with its KV cache. ``close()`` (or leaving a ``with``
    block) frees what it alone holds: its pages (shared ones stay with the contexts that still hold
    them) and its queue.

    ``adapter`` is the LoRA adapter its forwards run through: 0, the base model, or an id from
    ``open_adapter``; forks inherit it, and it may be changed between forwards."""

    def __init__(self, priority: int = 0, adapter: int = 0):
        self.priority = priority
        self.adapter = adapter
        self.queue = Queue(priority)
        self.tokens: list[int] = []   # forwarded: their K/V is in the pages
        self.pending: list[int] = []  # filled, forwarded with the next step
        self.pages = PageTable()
        self.page_size = host.page_size()
        self.generated: list[int] = []  # the tokens of the last generate
        self.logprobs: list[Logprobs] = []  # of the last generate or shaped_step whose Shape asked for them
        self._shaping = None  # while a shaped generation runs: (WIT shaping, keep log-probabilities)
        self._hidden: set[int] = set()  # token indices masked out of attention (drop_range)
        self._planned_len = 0  # while generate runs: the length it may reach (pages are allocated ahead)
        self._spare: HostFuture | None = None  # pages allocated ahead of need (see _prefetch)

    def __len__(self) -> int:
        return len(self.tokens) + len(self.pending)

    # -- filling (no call until the next forward) ---------------------------------------------
    def fill(self, text: str) -> None:
        self.pending += host.encode(text)

    def fill_tokens(self, tokens: list[int]) -> None:
        self.pending += tokens

    def fill_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> None:
        self.fill(host.render_chat(messages, add_generation_prompt))

    # -- the queue ------------------------------------------------------------------------------
    def set_priority(self, priority: int) -> None:
        self.priority = priority
        self.queue.set_priority(priority)

    def synchronize(self) -> HostFuture:
        """Completes once every call this context issued has."""
        return self.queue.synchronize()

    # -- forwarding ---------------------------------------------------------------------------
    async def flush(self) -> None:
        """Prefill: forward every pending token but the last, keeping no distribution.

        The last stays pending: the next decode step feeds it and gets the distribution after
        it from the same call (a fork carries it, so each fork feeds it itself).
        """
        if len(self.pending) > 1:
            await self._forward([], 0, len(self.pending) - 1)

    async def next_dist(self, top_k: int = 0):
        """Forward the pending tokens; the distribution after the last (``token_ids``, ``probs``,
        most probable first; ``top_k`` 0 = the server's default K).

        With nothing pending, the last token is forwarded again (its K/V slot rewritten with the
        same values). Raises ValueError if the context is empty.
        """
        (dist,) = await self._forward_pending(top_k, False)
        return dist

    async def dists(self, top_k: int = 0) -> list:
        """Forward the pending tokens; the distribution after each of them (speculative decoding:
        fill the drafted tokens, check each against the distribution before it, then ``truncate``).

        With nothing pending, the last token is forwarded again: one distribution, after it.
        Raises ValueError if the context is empty.
        """
        return await self._forward_pending(top_k, True)

    async def decode_step(self, sampler: Sampler | None = None) -> int:
        """Sample the next token and fill it (it is forwarded with the next step); as ``next_dist``."""
        sampler = sampler or Greedy()
        dist = await self.next_dist(sampler.top_k)
        token = sampler.sample(dist.token_ids, dist.probs)
        self.pending.append(token)
        return token

    async def generate_tokens(self, sampler: Sampler | None = None, stop: Stop = Stop(),
                              shape: Shape | None = None) -> list[int]:
        """Decode until ``stop``; the new tokens, a final stop token included (also ``self.generated``).

        With a built-in sampler the server draws the tokens, one step in flight ahead (``pipelined.py``):
        the same tokens, the same context afterwards. Otherwise the loop is ``decode_step`` written
        out: it is the per-token path of most inferlets, and every coroutine frame costs
        microseconds in WebAssembly. ``shape`` (shaping.py: a grammar, a mask, biases, penalties,
        log-probabilities into ``self.logprobs``) needs a built-in sampler: the server applies it.
        """
        sampler = sampler or Greedy()
        spec = server_spec(sampler)
        self.logprobs = []
        if shape is not None and spec is None:
            raise ValueError("a Shape needs one of the built-in samplers (Greedy, Temperature, TopK, TopP, MinP): "
                             "the server applies it where it draws the token")
        if spec is not None:
            return await self._generate_pipelined(sampler, stop, spec, shape)
        stop_ids = stop.stop_token_ids(host.stop_tokens())
        top_k, sample, limit = sampler.top_k, sampler.sample, stop.max_tokens
        strings, tail = stop.strings, stop.tail_tokens()
        generated = []
        self.generated, self._planned_len = generated, len(self) + limit
        try:
            while len(generated) < limit:
                self._feed_last_again()
                end = len(self.tokens) + len(self.pending)
                if self._needs_pages(end):
                    await self._reserve(end)
                one, start, outputs = len(self.pending) == 1, len(self.tokens), [len(self.pending) - 1]
                try:
                    (dist,) = await self._issue_forward(outputs, top_k, len(self.pending))
                except OvenError as err:  # the server discarded pages: recompute, then this step again
                    (dist,) = await self._retry_discarded(err, start, outputs, top_k)
                self._prefetch_after_decode(one)
                token = sample(dist.token_ids, dist.probs)
                self.pending.append(token)
                generated.append(token)
                if token in stop_ids:
                    break
                if strings and stop.find_string(host.decode(generated[-tail:])) is not None:
                    break
        finally:
            self._planned_len = 0
        return generated

    async def generate(self, sampler: Sampler | None = None, stop: Stop = Stop(), shape: Shape | None = None) -> str:
        """Decode until ``stop``; the new text, without stop tokens and cut before the earliest stop
        string (the tokens are in ``self.generated``). With nothing pending, the first step feeds the
        last token again; an empty context raises ValueError. ``shape``: as ``generate_tokens``."""
        generated = await self.generate_tokens(sampler, stop, shape)
        stop_ids = stop.stop_token_ids(host.stop_tokens())
        text = host.decode([t for t in generated if t not in stop_ids])
        at = stop.find_string(text)
        return text if at is None else text[:at]

    def _feed_last_again(self) -> None:
        """With nothing pending, make the last forwarded token pending again, so that a decode step
        has a token to feed (forwarding rewrites its slot and shows it if it was hidden)."""
        if self.pending:
            return
        if not self.tokens:
            raise ValueError("the context is empty: fill it before decoding")
        self.pending = [self.tokens.pop()]
        self._hidden.discard(len(self.tokens))

    async def _forward_pending(self, top_k: int, each: bool) -> list:
        """Forward every pending token (the last one again if none is pending); the distribution
        after the last, or after ``each`` one."""
        self._feed_last_again()
        count = len(self.pending)
        dists = await self._forward(list(range(count)) if each else [count - 1], top_k, count)
        if count == 1:
            self._prefetch()  # decoding
        return dists

    async def _forward(self, output_indices: list[int], top_k: int, count: int) -> list:
        """Forward the first ``count`` pending tokens; the distributions after ``output_indices``."""
        await self._reserve(len(self.tokens) + count)
        start = len(self.tokens)
        try:
            return await self._issue_forward(output_indices, top_k, count)
        except OvenError as err:  # the server discarded pages: recompute, then this forward again
            return await self._retry_discarded(err, start, output_indices, top_k)

    def _issue_forward(self, output_indices: list[int], top_k: int, count: int) -> HostFuture:
        """The ``forward-text`` call for the first ``count`` pending tokens (their pages reserved)."""
        tokens, start = self.pending[:count], len(self.tokens)
        end = start + count
        used = -(-end // self.page_size)
        positions = [start] if count == 1 else list(range(start, end))
        handle = forward.forward_text(self.queue.id, tokens, positions, self.pages.handles[:used],
                                      end - (used - 1) * self.page_size, output_indices, top_k, self.adapter)
        self.tokens += tokens
        self.pending = self.pending[count:]
        return self.queue.result(handle, futures.take_dists)

    # -- pages ----------------------------------------------------------------------------------
    def _needs_pages(self, end: int) -> bool:
        """Whether a step ending at ``end`` tokens must ``_reserve`` first: a page short, or its write
        page shared (copy on write)."""
        ps = self.page_size
        return -(-end // ps) > len(self.pages.handles) or self.pages.is_shared(len(self.tokens) // ps)

    def _prefetch_after_decode(self, one: bool) -> None:
        """After issuing a decode step of ``one`` token: prefetch once the last page is half full."""
        ps = self.page_size
        if one and self._spare is None and len(self.pages.handles) * ps - len(self.tokens) <= ps // 2:
            self._prefetch()

    async def _reserve(self, end: int) -> None:
        """Pages for the tokens up to ``end`` (topped up to the planned length, see ``_pages_ahead``),
        and a page of our own where the next forward starts writing."""
        ps, pages = self.page_size, self.pages
        needed = -(-end // ps)
        write_page = len(self.tokens) // ps
        copy_first = write_page < min(len(pages), needed) and pages.is_shared(write_page)
        if needed <= len(pages) and not copy_first:
            return
        missing = max(max(needed, self._pages_ahead(end)) - len(pages), 0) + copy_first
        fresh = []
        if self._spare is not None:
            spare, self._spare = self._spare, None
            fresh = await spare.poll_now()
        if len(fresh) < missing:
            fresh += await self.queue.result(kvpages.alloc_kvpages(self.queue.id, missing - len(fresh)),
                                             futures.take_handles)
        set_recomputable(fresh, True)  # ours alone: the server may discard them while we wait
        if copy_first:
            self._copy_on_write(write_page, fresh.pop(0))
        for page in fresh:
            pages.push(page)

    def _pages_ahead(self, end: int) -> int:
        """How many pages to hold once ``end`` tokens are in: while generating, enough for the planned
        length but at most ALLOC_AHEAD_TOKENS past ``end`` (one allocation per few pages, not per
        page, without holding a long budget's pages that an early stop would never use)."""
        return -(-max(min(self._planned_len, end + ALLOC_AHEAD_TOKENS), end) // self.page_size)

    def _prefetch(self) -> None:
        """While decoding, allocate the next pages once the last one is half full, so a decode step
        never waits for an allocation. On queue 0: its fresh-page masking then runs apart from this
        context's forwards instead of in front of the next one."""
        free_slots = len(self.pages) * self.page_size - len(self.tokens)
        if self._spare is not None or free_slots > self.page_size // 2:
            return
        count = 1 if self._planned_len == 0 else max(self._pages_ahead(len(self.tokens)) - len(self.pages), 0)
        if count > 0:
            self._spare = HostFuture(kvpages.alloc_kvpages(0, count), futures.take_handles)

    def _copy_on_write(self, index: int, page: int) -> None:
        """Put ``page`` in place of shared page ``index``, copying the forwarded tokens it holds."""
        ps = self.page_size
        count = min(max(len(self.tokens) - index * ps, 0), ps)
        if count > 0:
            self.queue.later(kvpages.copy_kvpage(self.queue.id, self.pages.handles[index], page, 0, 0, count))
        old = self.pages.replace(index, page)  # our handle on an exported page is ours to free
        if old is not None:
            self.queue.later(kvpages.dealloc_kvpages(self.queue.id, [old]))

    # -- freeing ------------------------------------------------------------------------------
    def free_pages_ahead(self) -> None:
        """Free the pages allocated ahead of need: those past the forwarded tokens, and a prefetch
        (a context about to wait then holds only the pages of its K/V; offload and evict do this)."""
        self._free_spare()
        freed = self.pages.truncate(-(-len(self.tokens) // self.page_size))
        if freed:
            self.queue.later(kvpages.dealloc_kvpages(self.queue.id, freed))

    def pause_hint(self, ms: float) -> None:
        """This context is about to wait about ``ms`` milliseconds on something outside the model (a
        tool, a user): it frees its pages allocated ahead, and the server's interception policy may
        keep its K/V on the device or swap it to the host tier meanwhile (it is back before it runs)."""
        self.free_pages_ahead()
        host.pause_hint(ms)

    def _free_spare(self) -> None:
        if self._spare is not None:
            spawn(_dealloc_when_allocated(self._spare))
            self._spare = None

    def close(self) -> None:
        """Free the pages (shared ones once their last holder closes) and give the queue back."""
        if self.queue is None:
            return
        self._free_spare()
        freed = self.pages.truncate(0)
        if freed:
            futures.discard(kvpages.dealloc_kvpages(self.queue.id, freed))
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


async def _dealloc_when_allocated(spare: HostFuture) -> None:
    """Free the pages of a prefetch the context no longer wants, once they are allocated."""
    try:
        pages = await spare.poll_now()
    except OvenError:  # the allocation failed: nothing to free
        return
    futures.discard(kvpages.dealloc_kvpages(0, pages))
