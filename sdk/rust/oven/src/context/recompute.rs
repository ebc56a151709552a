//! Recomputing a [`Context`]'s K/V after the server discarded it (InferCept's discard), so the
//! inferlet never has to handle it.
//!
//! A context declares the pages it writes *recomputable* (`kvpages::set_recomputable`): it keeps
//! the tokens it forwarded, so it can rewrite their K/V. While the inferlet waits on I/O, the
//! server's interception policy may then free those pages; the handles stay valid. The next
//! forward over one fails with an error starting `kv discarded:` before any device work; the
//! context then takes the pages back (`kvpages::restore_discarded`), forwards their tokens again
//! at the same positions, one forward per chunk of at most `RECOMPUTE_CHUNK_PAGES` pages so the
//! server batches other inferlets' decode steps between the chunks, hides its dropped tokens
//! again, and retries the call that failed. Pages shared with a fork are declared not
//! recomputable (another context reads them), and imported pages never are. As the Python SDK's
//! `sdk/python/inferlet/recompute.py`.

use oven_raw::{forward, kvpages};

use super::Context;
use crate::HostFuture;

/// How the host's error for a forward over a discarded page starts.
pub(super) const KV_DISCARDED: &str = "kv discarded:";
/// Pages whose tokens one recompute call forwards: 8 (128 tokens of 16).
const RECOMPUTE_CHUNK_PAGES: usize = 8;

/// Whether the server may discard these pages' K/V while the inferlet waits (see the module).
pub(super) fn set_recomputable(pages: &[u32], recomputable: bool) -> Result<(), String> {
    if pages.is_empty() {
        return Ok(());
    }
    kvpages::set_recomputable(pages, recomputable)
}

impl Context {
    /// Rewrite the K/V of this context's discarded pages from its forwarded tokens, in chunks. Also
    /// called before the rarer calls that read pages without a forward (fork, masks, export,
    /// offload): one host call that finds nothing discarded.
    pub(super) async fn recompute_discarded(&mut self) -> Result<(), String> {
        let discarded = kvpages::restore_discarded(self.pages.handles())?;
        let ps = self.page_size;
        let num_forwarded = self.num_committed;
        let num_pages = (num_forwarded + ps - 1) / ps;
        let is_discarded = |handles: &[u32], index: usize| discarded.contains(&handles[index]);
        let mut index = 0;
        while index < num_pages {
            if !is_discarded(self.pages.handles(), index) {
                index += 1;
                continue;
            }
            let mut end_page = index;
            while end_page < num_pages && end_page - index < RECOMPUTE_CHUNK_PAGES
                && is_discarded(self.pages.handles(), end_page)
            {
                end_page += 1;
            }
            let (start, end) = (index * ps, (end_page * ps).min(num_forwarded));
            let positions: Vec<u32> = (start as u32..end as u32).collect();
            let call = forward::forward_text(
                self.queue.id(),
                &self.token_ids[start..end],
                &positions,
                &self.pages.handles()[..end_page],
                (end - (end_page - 1) * ps) as u32,
                &[],
                0,
                self.adapter,
            );
            HostFuture::dists(call).await?;
            self.check_side_calls()?;
            self.hide_again(index, end_page);
            index = end_page;
        }
        Ok(())
    }

    /// Mask the dropped tokens of rewritten pages again (a forward unmasks what it writes).
    fn hide_again(&mut self, first_page: usize, end_page: usize) {
        let ps = self.page_size;
        for index in first_page..end_page {
            let slots = index * ps..(index + 1) * ps;
            if !slots.clone().any(|t| self.dropped.get(t).copied().unwrap_or(false)) {
                continue;
            }
            let row: Vec<bool> = slots
                .map(|t| t >= self.num_committed || self.dropped.get(t).copied().unwrap_or(false))
                .collect();
            self.side_calls.push(kvpages::mask_kvpage(self.queue.id(), self.pages.handles()[index], &row));
        }
    }
}
