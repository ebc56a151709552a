//! Editing a [`Context`]'s KV cache: fork, hide and show tokens, truncate. Pages shared with
//! another context or an export are never written: they are copied first (`copy_on_write`).

use oven_raw::kvpages;

use super::{set_recomputable, Context};
use crate::HostFuture;

impl Context {
    /// A copy that continues independently, on a queue of its own with this one's priority and
    /// adapter. Pending tokens are flushed first; full pages are then shared (by reference) and
    /// the partial last page is copied. The shared pages are never discarded by the server from
    /// then on: two contexts read them.
    pub async fn fork(&mut self) -> Result<Context, String> {
        self.recompute_discarded().await?;
        self.flush().await?;
        let num_full = self.num_committed / self.page_size;
        let num_partial = self.num_committed % self.page_size;
        let mut child = Context::with_priority(self.priority).with_adapter(self.adapter);
        child.token_ids = self.token_ids.clone();
        child.num_committed = self.num_committed;
        child.dropped = self.dropped.clone();
        child.pages = self.pages.share_prefix(num_full);
        set_recomputable(child.pages.handles(), false)?;
        if num_partial > 0 {
            // On the parent's queue, after its writes, and awaited before the child forwards.
            let page = HostFuture::handles(kvpages::alloc_kvpages(self.queue.id(), 1)).await?[0];
            child.pages.push(page); // the child frees it, even if the copy fails
            set_recomputable(&[page], true)?;
            let src = self.pages.handles()[num_full];
            HostFuture::unit(kvpages::copy_kvpage(self.queue.id(), src, page, 0, 0, num_partial as u32)).await?;
        }
        Ok(child)
    }

    /// Hide tokens `[start, end)` from every later forward (their K/V stay; positions do not
    /// shift). The last token cannot be dropped: the next decode step feeds it.
    pub async fn drop_range(&mut self, start: usize, end: usize) -> Result<(), String> {
        self.set_dropped(start, end, true).await
    }

    /// Show tokens `[start, end)` again after [`Context::drop_range`].
    pub async fn undrop_range(&mut self, start: usize, end: usize) -> Result<(), String> {
        self.set_dropped(start, end, false).await
    }

    async fn set_dropped(&mut self, start: usize, end: usize, dropped: bool) -> Result<(), String> {
        let len = self.token_ids.len();
        if start > end || end >= len {
            return Err(format!("[{}, {}) is not a range of tokens before the last of {}", start, end, len));
        }
        if start == end {
            return Ok(());
        }
        self.recompute_discarded().await?; // masks are written into the pages: they must hold their K/V
        self.flush().await?; // now every token but the last is in the pages
        self.dropped.resize(len, false);
        self.dropped[start..end].iter_mut().for_each(|d| *d = dropped);
        let ps = self.page_size;
        let touched = start / ps..(end + ps - 1) / ps;
        let shared: Vec<usize> = touched.clone().filter(|i| self.pages.is_shared(*i)).collect();
        if !shared.is_empty() {
            let fresh = HostFuture::handles(kvpages::alloc_kvpages(self.queue.id(), shared.len() as u32)).await?;
            set_recomputable(&fresh, true)?;
            for (index, page) in shared.into_iter().zip(fresh) {
                self.copy_on_write(index, page);
            }
        }
        for index in touched {
            // Slots past the forwarded tokens stay masked: a forward unmasks what it writes.
            let row: Vec<bool> = (index * ps..(index + 1) * ps)
                .map(|t| t >= self.num_committed || self.dropped[t])
                .collect();
            self.side_calls.push(kvpages::mask_kvpage(self.queue.id(), self.pages.handles()[index], &row));
        }
        Ok(())
    }

    /// Keep the first `len` tokens; pages past them are let go.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.token_ids.len() {
            return;
        }
        self.token_ids.truncate(len);
        self.dropped.truncate(len);
        self.num_committed = self.num_committed.min(len);
        let freed = self.pages.truncate((len + self.page_size - 1) / self.page_size);
        if !freed.is_empty() {
            self.side_calls.push(kvpages::dealloc_kvpages(self.queue.id(), &freed));
        }
    }

    /// Put `page` in place of shared page `index`, copying the forwarded tokens it holds.
    pub(super) fn copy_on_write(&mut self, index: usize, page: u32) {
        let ps = self.page_size;
        let count = self.num_committed.saturating_sub(index * ps).min(ps) as u32;
        if count > 0 {
            let src = self.pages.handles()[index];
            self.side_calls.push(kvpages::copy_kvpage(self.queue.id(), src, page, 0, 0, count));
        }
        // Our handle on an exported page is ours to free; the export keeps the page.
        if let Some(old) = self.pages.replace(index, page) {
            self.side_calls.push(kvpages::dealloc_kvpages(self.queue.id(), &[old]));
        }
    }
}
