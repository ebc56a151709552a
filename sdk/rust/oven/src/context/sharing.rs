//! Moving a [`Context`]'s KV cache out of the device tier (offload, restore, evict) and sharing
//! it across inferlets (export, import). Exported and imported pages are never written: the
//! exporter's later writes and masks, and an importer's, copy them first.

use oven_raw::{futures as raw_futures, kvpages};

use super::Context;
use crate::HostFuture;

/// What the server's error says when an export is held by another inference replica (data
/// parallel serving); the Python SDK's `sharing.py` looks for the same words.
const EXPORT_ELSEWHERE: &str = "held by another inference replica";

impl Context {
    /// Move the pages of this context's K/V to the host tier (those allocated ahead are freed);
    /// they stay its pages, but must be [`restore`](Context::restore)d before it (or a fork
    /// sharing them) forwards again.
    pub async fn offload(&mut self) -> Result<(), String> {
        self.recompute_discarded().await?;
        self.free_pages_ahead();
        HostFuture::unit(kvpages::offload_kvpages(self.queue.id(), self.pages.handles())).await
    }

    /// Bring the pages [`offload`](Context::offload) moved back to the device tier.
    pub async fn restore(&mut self) -> Result<(), String> {
        HostFuture::unit(kvpages::restore_kvpages(self.queue.id(), self.pages.handles())).await
    }

    /// Free the pages and keep the tokens: the next forward recomputes their K/V (a re-prefill).
    /// Dropped tokens are shown again.
    pub fn evict(&mut self) {
        self.free_spare();
        let freed = self.pages.truncate(0);
        if !freed.is_empty() {
            self.side_calls.push(kvpages::dealloc_kvpages(self.queue.id(), &freed));
        }
        self.num_committed = 0;
        self.dropped.clear();
    }

    /// Publish the pages of the forwarded tokens under `name`, server-wide; how many tokens they
    /// hold (after [`flush`](Context::flush), all but the last). They live until the export is
    /// released, and this context copies them before writing into them.
    pub async fn export(&mut self, name: &str) -> Result<usize, String> {
        self.recompute_discarded().await?;
        if !self.side_calls.is_empty() {
            self.synchronize().await?; // copies and masks land before another instance reads
            self.check_side_calls()?;
        }
        let count = (self.num_committed + self.page_size - 1) / self.page_size;
        kvpages::export_kvpages(&self.pages.handles()[..count], name)?;
        self.pages.mark_exported(count);
        Ok(self.num_committed)
    }

    /// A context over the pages exported as `name`, which hold `token_ids` (the tokens the
    /// exporter had forwarded, as its [`export`](Context::export) counted them). Fill more and
    /// generate as usual; its writes go to pages of its own. An export held by another inference
    /// replica gives a context that computes `token_ids` again (its first forward fills them).
    pub fn imported(name: &str, token_ids: &[u32]) -> Result<Context, String> {
        let pages = match kvpages::import_kvpages(name) {
            Ok(pages) => pages,
            // The export's K/V is in another inference replica's memory: compute it again here.
            Err(err) if err.contains(EXPORT_ELSEWHERE) => {
                let mut ctx = Context::new();
                ctx.fill_tokens(token_ids);
                return Ok(ctx);
            }
            Err(err) => return Err(err),
        };
        let mut ctx = Context::new();
        let needed = (token_ids.len() + ctx.page_size - 1) / ctx.page_size;
        if pages.len() != needed {
            raw_futures::discard(kvpages::dealloc_kvpages(0, &pages));
            return Err(format!(
                "export {:?} has {} pages; {} tokens need {}",
                name,
                pages.len(),
                token_ids.len(),
                needed
            ));
        }
        pages.into_iter().for_each(|page| ctx.pages.push(page));
        ctx.pages.mark_exported(needed);
        ctx.token_ids = token_ids.to_vec();
        ctx.num_committed = token_ids.len();
        Ok(ctx)
    }

    /// Release an export this instance made (its pages stay with the contexts holding them).
    /// `Err` if this instance exported no such name.
    pub fn release_export(name: &str) -> Result<(), String> {
        kvpages::release_export(name)
    }
}
