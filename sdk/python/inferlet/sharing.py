"""Moving a Context's KV cache out of the device tier (offload, restore, evict) and sharing it across
inferlets (export, import). Exported and imported pages are never written: the exporter's later
writes and masks, and an importer's, copy them first. As the Rust SDK's
``sdk/rust/oven/src/context/sharing.rs``.
"""

from __future__ import annotations

from componentize_py_types import Err
from wit_world.imports import futures, kvpages

from .tasks import OvenError

# What the server's error says when an export is held by another inference replica (data parallel serving:
# control/runtime/placement.py ELSEWHERE); the Rust SDK's context/sharing.rs looks for the same words.
EXPORT_ELSEWHERE = "held by another inference replica"


class Sharing:
    """Part of ``Context`` (its attributes are documented there)."""

    async def offload(self) -> None:
        """Move the pages of this context's K/V to the host tier (those allocated ahead are freed);
        they stay its pages, but must be restored before it (or a fork sharing them) forwards again."""
        await self._recompute_discarded()
        self.free_pages_ahead()
        await self.queue.unit(kvpages.offload_kvpages(self.queue.id, self.pages.handles))

    async def restore(self) -> None:
        """Bring the pages ``offload`` moved back to the device tier."""
        await self.queue.unit(kvpages.restore_kvpages(self.queue.id, self.pages.handles))

    def evict(self) -> None:
        """Free the pages and keep the tokens: the next forward recomputes their K/V (a re-prefill).
        Dropped tokens are shown again."""
        self._free_spare()
        freed = self.pages.truncate(0)
        if freed:
            self.queue.later(kvpages.dealloc_kvpages(self.queue.id, freed))
        self.pending, self.tokens, self._hidden = self.tokens + self.pending, [], set()

    async def export(self, name: str) -> int:
        """Publish the pages of the forwarded tokens under ``name``, server-wide; how many tokens they
        hold (after ``flush``, all but the last). They live until the export is released, and this
        context copies them before writing into them. Raises OvenError if the name is taken."""
        await self._recompute_discarded()
        if self.queue.has_unchecked():
            await self.synchronize()  # copies and masks land before another instance reads
        count = -(-len(self.tokens) // self.page_size)
        try:
            kvpages.export_kvpages(self.pages.handles[:count], name)
        except Err as err:
            raise OvenError(err.value) from None
        self.pages.mark_exported(count)
        return len(self.tokens)

    @classmethod
    def imported(cls, name: str, tokens: list[int]):
        """A context over the pages exported as ``name``, which hold ``tokens`` (the tokens the exporter
        had forwarded, as its ``export`` counted them). Fill more and generate as usual; its writes go
        to pages of its own. An export held by another inference replica gives a context that computes
        ``tokens`` again (its first forward fills them). Raises OvenError if there is no such export,
        ValueError if ``tokens`` do not fit its pages."""
        try:
            pages = kvpages.import_kvpages(name)
        except Err as err:
            if EXPORT_ELSEWHERE in err.value:  # its K/V is in another inference replica's memory: compute it here
                ctx = cls()
                ctx.fill_tokens(list(tokens))
                return ctx
            raise OvenError(err.value) from None
        ctx = cls()
        needed = -(-len(tokens) // ctx.page_size)
        if len(pages) != needed:
            futures.discard(kvpages.dealloc_kvpages(0, pages))
            ctx.close()
            raise ValueError(f"export {name!r} has {len(pages)} pages; {len(tokens)} tokens need {needed}")
        for page in pages:
            ctx.pages.push(page)
        ctx.pages.mark_exported(needed)
        ctx.tokens = list(tokens)
        return ctx

    @staticmethod
    def release_export(name: str) -> None:
        """Release an export this instance made (its pages stay with the contexts holding them).
        Raises OvenError if this instance exported no such name."""
        try:
            kvpages.release_export(name)
        except Err as err:
            raise OvenError(err.value) from None
