//! Moving a [`Context`]'s KV cache out of the device tier (offload, restore, evict) and sharing
//! it across inferlets (export, import, named snapshots). Exported, imported and snapshot pages
//! are never written: the exporter's later writes and masks, and an importer's, copy them first
//! (the server refuses a write into a snapshot's page). As the Python SDK's `sharing.py`.

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

    /// Keep the pages of the forwarded tokens, with those tokens, as snapshot `name` of this
    /// instance's client: any of its inferlets may open it ([`from_snapshot`](Context::from_snapshot)),
    /// reuse it for a prompt that starts with its tokens ([`from_prefix`](Context::from_prefix)) or
    /// drop it; another client never sees it. How many tokens it holds (after
    /// [`flush`](Context::flush), all but the last). This context copies the pages before writing
    /// into them. `Err` if the name is taken, past the client's caps, with nothing forwarded or
    /// with tokens hidden ([`drop_range`](Context::drop_range)).
    pub async fn snapshot(&mut self, name: &str) -> Result<usize, String> {
        if self.num_committed == 0 || self.dropped.iter().any(|hidden| *hidden) {
            return Err("a snapshot needs forwarded tokens and none hidden".to_string());
        }
        self.recompute_discarded().await?;
        if !self.side_calls.is_empty() {
            self.synchronize().await?; // copies and masks land before another instance reads
            self.check_side_calls()?;
        }
        let count = (self.num_committed + self.page_size - 1) / self.page_size;
        kvpages::save_snapshot(&self.pages.handles()[..count], &self.token_ids[..self.num_committed], name)?;
        self.pages.mark_exported(count);
        Ok(self.num_committed)
    }

    /// A context over this client's snapshot `name`: its tokens forwarded, its pages shared
    /// (read-only: the first write copies). `Err` if there is no such snapshot.
    pub fn from_snapshot(name: &str) -> Result<Context, String> {
        let token_ids = kvpages::snapshot_tokens(name)?;
        let pages = kvpages::open_snapshot(name)?;
        let count = token_ids.len();
        Ok(Context::over_snapshot(&token_ids, pages, count))
    }

    /// A context filled with `token_ids` whose longest prefix held by one of this client's
    /// snapshots (the server's prefix index, `match-snapshot`) reuses that snapshot's pages
    /// instead of being forwarded again: `len() - num_pending()` is that prefix's length (0 when
    /// none matched), the rest pending, the last token at least (the next step feeds it).
    /// Generate as usual.
    pub fn from_prefix(token_ids: &[u32]) -> Context {
        let name = match token_ids.len() {
            0 | 1 => String::new(),
            n => kvpages::match_snapshot(&token_ids[..n - 1]),
        };
        let opened = if name.is_empty() {
            None
        } else {
            // Dropped meanwhile, or held by another inference replica: forward everything.
            kvpages::snapshot_tokens(&name).ok().and_then(|held| kvpages::open_snapshot(&name).ok().map(|p| (held, p)))
        };
        let (held, pages) = match opened {
            Some(opened) => opened,
            None => {
                let mut ctx = Context::new();
                ctx.fill_tokens(token_ids);
                return ctx;
            }
        };
        let limit = held.len().min(token_ids.len() - 1);
        let reused = (0..limit).find(|&i| held[i] != token_ids[i]).unwrap_or(limit);
        let mut ctx = Context::over_snapshot(&token_ids[..reused], pages, reused);
        ctx.fill_tokens(&token_ids[reused..]);
        ctx
    }

    /// A context whose first `count` tokens are forwarded in the first of `pages` (shared); the
    /// pages past them are let go.
    fn over_snapshot(token_ids: &[u32], pages: Vec<u32>, count: usize) -> Context {
        let mut ctx = Context::new();
        let keep = (count + ctx.page_size - 1) / ctx.page_size;
        if keep < pages.len() {
            ctx.side_calls.push(kvpages::dealloc_kvpages(ctx.queue.id(), &pages[keep..]));
        }
        pages[..keep.min(pages.len())].iter().for_each(|page| ctx.pages.push(*page));
        ctx.pages.mark_exported(keep.min(pages.len()));
        ctx.token_ids = token_ids[..count].to_vec();
        ctx.num_committed = count;
        ctx
    }

    /// Drop this client's snapshot `name` (its pages stay with the contexts holding them). `Err`
    /// if the client has no such snapshot.
    pub fn drop_snapshot(name: &str) -> Result<(), String> {
        kvpages::drop_snapshot(name)
    }
}
