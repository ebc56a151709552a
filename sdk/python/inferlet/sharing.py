"""Moving a Context's KV cache out of the device tier (offload, restore, evict) and sharing it across
inferlets (export, import, named snapshots). Exported, imported and snapshot pages are never
written: the exporter's later writes and masks, and an importer's, copy them first (the server
refuses a write into a snapshot's page). As the Rust SDK's ``sdk/rust/oven/src/context/sharing.rs``.
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

    # -- named snapshots: a client's pages with the tokens they hold, matched by prefix ----------------
    async def snapshot(self, name: str) -> int:
        """Keep the pages of the forwarded tokens, with those tokens, as snapshot ``name`` of this
        instance's client: any of its inferlets may open it (``from_snapshot``), reuse it for a prompt
        that starts with its tokens (``from_prefix``) or drop it; another client never sees it. How
        many tokens it holds (after ``flush``, all but the last). This context copies the pages before
        writing into them. Raises OvenError if the name is taken or past the client's caps,
        ValueError with nothing forwarded or with tokens hidden (``drop_range``: the pages would not
        hold what the tokens say)."""
        if not self.tokens or self._hidden:
            raise ValueError("a snapshot needs forwarded tokens and none hidden")
        await self._recompute_discarded()
        if self.queue.has_unchecked():
            await self.synchronize()  # copies and masks land before another instance reads
        count = -(-len(self.tokens) // self.page_size)
        try:
            kvpages.save_snapshot(self.pages.handles[:count], self.tokens, name)
        except Err as err:
            raise OvenError(err.value) from None
        self.pages.mark_exported(count)
        return len(self.tokens)

    @classmethod
    def from_snapshot(cls, name: str):
        """A context over this client's snapshot ``name``: its tokens forwarded, its pages shared
        (read-only: the first write copies). Raises OvenError if there is no such snapshot."""
        try:
            tokens = kvpages.snapshot_tokens(name)
            pages = kvpages.open_snapshot(name)
        except Err as err:
            raise OvenError(err.value) from None
        return cls._over_snapshot(tokens, pages, len(tokens))

    @classmethod
    def from_prefix(cls, tokens: list[int]):
        """A context filled with ``tokens`` whose longest prefix held by one of this client's snapshots
        (the server's prefix index, ``match-snapshot``) reuses that snapshot's pages instead of being
        forwarded again: ``ctx.tokens`` is that prefix (empty when none matched), ``ctx.pending`` the
        rest, the last token at least (the next step feeds it). Generate as usual."""
        tokens = list(tokens)
        name = kvpages.match_snapshot(tokens[:-1]) if len(tokens) > 1 else ""
        if name:
            try:
                held = kvpages.snapshot_tokens(name)
                pages = kvpages.open_snapshot(name)
            except Err:  # dropped meanwhile, or held by another inference replica: forward everything
                name = ""
        if not name:
            ctx = cls()
            ctx.fill_tokens(tokens)
            return ctx
        reused = 0
        while reused < min(len(held), len(tokens) - 1) and held[reused] == tokens[reused]:
            reused += 1
        ctx = cls._over_snapshot(tokens[:reused], pages, reused)
        ctx.fill_tokens(tokens[reused:])
        return ctx

    @classmethod
    def _over_snapshot(cls, tokens: list[int], pages: list[int], count: int):
        """A context whose first ``count`` tokens are forwarded in the first of ``pages`` (shared); the
        pages past them are let go."""
        ctx = cls()
        keep = -(-count // ctx.page_size)
        if keep < len(pages):
            ctx.queue.later(kvpages.dealloc_kvpages(ctx.queue.id, pages[keep:]))
        for page in pages[:keep]:
            ctx.pages.push(page)
        ctx.pages.mark_exported(keep)
        ctx.tokens = list(tokens[:count])
        return ctx

    @staticmethod
    def drop_snapshot(name: str) -> None:
        """Drop this client's snapshot ``name`` (its pages stay with the contexts holding them).
        Raises OvenError if the client has no such snapshot."""
        try:
            kvpages.drop_snapshot(name)
        except Err as err:
            raise OvenError(err.value) from None
