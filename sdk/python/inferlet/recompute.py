"""Recomputing a Context's K/V after the server discarded it (InferCept's discard), so the inferlet
never has to handle it.

A context declares the pages it writes *recomputable* (``kvpages.set-recomputable``): it keeps the
tokens it forwarded, so it can rewrite their K/V. While the inferlet waits on I/O, the server's
interception policy may then free those pages; the handles stay valid. The next forward over one
fails with an error starting ``kv discarded:`` before any device work; the context then takes the
pages back (``kvpages.restore-discarded``), forwards their tokens again at the same positions, one
forward per chunk of at most RECOMPUTE_CHUNK_PAGES pages so the server batches other inferlets'
decode steps between the chunks, hides its dropped tokens again, and retries the call that failed.
Pages shared with a fork are declared not recomputable (another context reads them), and imported
pages never are. As the Rust SDK's ``sdk/rust/oven/src/context/recompute.rs``.
"""

from __future__ import annotations

from componentize_py_types import Err
from wit_world.imports import forward, futures, kvpages

from .tasks import OvenError

KV_DISCARDED = "kv discarded:"  # how the host's error for a forward over a discarded page starts
RECOMPUTE_CHUNK_PAGES = 8  # tokens forwarded per recompute call: 8 pages (128 tokens of 16)


def set_recomputable(pages: list[int], recomputable: bool) -> None:
    """Whether the server may discard these pages' K/V while the inferlet waits (see the module)."""
    if pages:
        try:
            kvpages.set_recomputable(pages, recomputable)
        except Err as err:
            raise OvenError(err.value) from None


class Recompute:
    """Part of ``Context`` (its attributes are documented there)."""

    async def _retry_discarded(self, err: OvenError, start: int, output_indices: list[int], top_k: int) -> list:
        """The forward of the tokens from ``start`` failed with ``err``: if the server discarded pages,
        recompute them and forward again (the distributions); any other error is raised."""
        if not str(err).startswith(KV_DISCARDED):
            raise err
        count = len(self.tokens) - start
        self.pending = self.tokens[start:] + self.pending  # the failed forward wrote nothing
        self.tokens = self.tokens[:start]
        await self._recompute_discarded()
        return await self._issue_forward(output_indices, top_k, count)

    async def _recompute_discarded(self) -> None:
        """Rewrite the K/V of this context's discarded pages from its forwarded tokens, in chunks.
        Also called before the rarer calls that read pages without a forward (fork, masks, export,
        offload): one host call that finds nothing discarded."""
        try:
            discarded = set(kvpages.restore_discarded(self.pages.handles))
        except Err as err:
            raise OvenError(err.value) from None
        ps, handles, num_forwarded = self.page_size, self.pages.handles, len(self.tokens)
        index, num_pages = 0, -(-num_forwarded // ps)
        while index < num_pages:
            if handles[index] not in discarded:
                index += 1
                continue
            end_page = index
            while end_page < num_pages and end_page - index < RECOMPUTE_CHUNK_PAGES and handles[end_page] in discarded:
                end_page += 1
            start, end = index * ps, min(end_page * ps, num_forwarded)
            call = forward.forward_text(self.queue.id, self.tokens[start:end], list(range(start, end)),
                                        handles[:end_page], end - (end_page - 1) * ps, [], 0, self.adapter)
            await self.queue.result(call, futures.take_dists)
            self._hide_again(index, end_page)
            index = end_page

    def _hide_again(self, first_page: int, end_page: int) -> None:
        """Mask the dropped tokens of rewritten pages again (a forward unmasks what it writes)."""
        ps, num_forwarded = self.page_size, len(self.tokens)
        for index in range(first_page, end_page):
            slots = range(index * ps, (index + 1) * ps)
            if any(t in self._hidden for t in slots):
                row = [t >= num_forwarded or t in self._hidden for t in slots]
                self.queue.later(kvpages.mask_kvpage(self.queue.id, self.pages.handles[index], row))
