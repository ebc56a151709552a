"""Editing a Context's KV cache: fork, hide and show tokens, truncate. Pages shared with another
context or an export are never written: they are copied first (``_copy_on_write``). As the Rust
SDK's ``sdk/rust/oven/src/context/edit.rs``.
"""

from __future__ import annotations

from wit_world.imports import futures, kvpages

from .recompute import set_recomputable


class Editing:
    """Part of ``Context`` (its attributes are documented there)."""

    async def fork(self):
        """A copy that continues independently, on a queue of its own with this one's priority and adapter.
        Pending tokens are flushed first (but the last, which the copy carries); full pages are then
        shared (by reference) and the partial last page is copied. The shared pages are never
        discarded by the server from then on: two contexts read them."""
        await self._recompute_discarded()
        await self.flush()
        num_full, num_partial = divmod(len(self.tokens), self.page_size)
        child = type(self)(self.priority, self.adapter)
        child.tokens, child.pending, child._hidden = list(self.tokens), list(self.pending), set(self._hidden)
        child.pages = self.pages.share_prefix(num_full)
        set_recomputable(child.pages.handles, False)
        if num_partial:
            # On this context's queue, after its writes, and awaited before the child forwards.
            (page,) = await self.queue.result(kvpages.alloc_kvpages(self.queue.id, 1), futures.take_handles)
            child.pages.push(page)  # the child frees it, even if the copy fails
            set_recomputable([page], True)
            src = self.pages.handles[num_full]
            await self.queue.unit(kvpages.copy_kvpage(self.queue.id, src, page, 0, 0, num_partial))
        return child

    async def drop_range(self, start: int, end: int) -> None:
        """Hide tokens ``[start, end)`` from every later forward (their K/V stay; positions do not
        shift). The last token cannot be dropped: the next decode step feeds it."""
        await self._set_dropped(start, end, True)

    async def undrop_range(self, start: int, end: int) -> None:
        """Show tokens ``[start, end)`` again after ``drop_range``."""
        await self._set_dropped(start, end, False)

    async def _set_dropped(self, start: int, end: int, dropped: bool) -> None:
        length = len(self)
        if not 0 <= start <= end < length:
            raise ValueError(f"[{start}, {end}) is not a range of tokens before the last of {length}")
        if start == end:
            return
        await self._recompute_discarded()  # masks are written into the pages: they must hold their K/V
        await self.flush()  # now every token but the last is in the pages
        if dropped:
            self._hidden.update(range(start, end))
        else:
            self._hidden.difference_update(range(start, end))
        ps = self.page_size
        touched = range(start // ps, -(-end // ps))
        shared = [index for index in touched if self.pages.is_shared(index)]
        if shared:
            fresh = await self.queue.result(kvpages.alloc_kvpages(self.queue.id, len(shared)), futures.take_handles)
            set_recomputable(fresh, True)
            for index, page in zip(shared, fresh):
                self._copy_on_write(index, page)
        num_forwarded = len(self.tokens)
        for index in touched:
            # Slots past the forwarded tokens stay masked: a forward unmasks what it writes.
            row = [t >= num_forwarded or t in self._hidden for t in range(index * ps, (index + 1) * ps)]
            self.queue.later(kvpages.mask_kvpage(self.queue.id, self.pages.handles[index], row))

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (forwarded or pending); pages past them are let go."""
        if length >= len(self):
            return
        if length >= len(self.tokens):
            self.pending = self.pending[:length - len(self.tokens)]
        else:
            self.tokens, self.pending = self.tokens[:length], []
            self._hidden = {i for i in self._hidden if i < length}
        freed = self.pages.truncate(-(-length // self.page_size))
        if freed:
            self.queue.later(kvpages.dealloc_kvpages(self.queue.id, freed))
