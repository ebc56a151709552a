//! [`Context`]: a token sequence, its KV pages and its own command queue.
//!
//! Filling only buffers tokens; forwards happen in [`Context::flush`] and in every decode step,
//! each one fused `forward-text` call. The last filled token stays pending after a flush: the
//! next decode step feeds it and gets the distribution of the token after it from the same call.
//! Each context issues its calls on a queue of its own, so the host batches the decode steps of
//! many contexts (forks, concurrent tasks) horizontally. K/V the server discarded while the
//! inferlet waited is recomputed on the next forward (`context/recompute.rs`).

use oven_raw::futures::{self as raw_futures, Distribution};
use oven_raw::{forward, kvpages, runtime};

use crate::model::{detokenize, render_chat, tokenize, vocab_size};
use crate::pages::PageTable;
use crate::shaping::{Decoder, WitShaping};
use crate::{spawn, HostFuture, Logprobs, Queue, Sampler, Shape, Stop};

mod edit;
mod pipelined;
mod recompute;
mod sharing;

use recompute::{set_recomputable, KV_DISCARDED};

/// While generating, pages are allocated this many tokens ahead of need (4 pages of 16).
const ALLOC_AHEAD_TOKENS: usize = 64;

/// A token sequence being generated, with its KV cache.
///
/// Dropping it frees what it alone holds: its pages (shared ones stay with the contexts that
/// still hold them) and its queue, whose unfinished calls are cancelled. Its forwards run through
/// the LoRA adapter set by [`Context::with_adapter`] (0, the default, is the base model); forks
/// inherit it.
pub struct Context {
    queue: Queue,
    priority: u32,
    adapter: u32,
    page_size: usize,
    token_ids: Vec<u32>,
    /// Tokens `[..num_committed]` have their K/V in `pages`; the rest are pending.
    num_committed: usize,
    pages: PageTable,
    /// `dropped[i]`: token i is hidden from later forwards (empty until `drop_range` is used).
    dropped: Vec<bool>,
    /// While `generate` runs: the length it may reach, so pages are allocated ahead in chunks.
    planned_len: usize,
    /// Pages allocated ahead of need (see `prefetch_pages`).
    spare: Option<HostFuture<Vec<u32>>>,
    /// Calls issued without waiting (copies, masks, frees), checked after the next forward:
    /// issued earlier on the same queue, they have completed by then.
    side_calls: Vec<u32>,
    /// Of the last generation or shaped step whose `Shape` asked for them.
    logprobs: Vec<Logprobs>,
}

impl Default for Context {
    fn default() -> Self {
        Self::new()
    }
}

impl Context {
    /// An empty context on a new queue of priority 0.
    pub fn new() -> Self {
        Self::with_priority(0)
    }

    /// An empty context on a new queue of `priority` (higher is dispatched first).
    pub fn with_priority(priority: u32) -> Self {
        Context {
            queue: Queue::new(priority),
            priority,
            adapter: 0,
            page_size: runtime::page_size() as usize,
            token_ids: Vec::new(),
            num_committed: 0,
            pages: PageTable::default(),
            dropped: Vec::new(),
            planned_len: 0,
            spare: None,
            side_calls: Vec::new(),
            logprobs: Vec::new(),
        }
    }

    /// This context with its forwards running through `adapter`: 0 (the base model) or an id from
    /// [`open_adapter`](crate::open_adapter).
    pub fn with_adapter(mut self, adapter: u32) -> Self {
        self.adapter = adapter;
        self
    }

    /// The LoRA adapter its forwards run through (0: the base model).
    pub fn adapter(&self) -> u32 {
        self.adapter
    }

    /// Run the next forwards through `adapter` (0: the base model).
    pub fn set_adapter(&mut self, adapter: u32) {
        self.adapter = adapter;
    }

    /// Append `text`, tokenized on its own (no call to the model yet).
    pub fn fill(&mut self, text: &str) {
        self.token_ids.extend(tokenize(text));
    }

    /// Append tokens (no call to the model yet).
    pub fn fill_tokens(&mut self, token_ids: &[u32]) {
        self.token_ids.extend_from_slice(token_ids);
    }

    /// Append messages rendered with the model's chat template (parallel role/content lists).
    pub fn fill_chat(&mut self, roles: &[&str], contents: &[&str], add_generation_prompt: bool) {
        self.fill(&render_chat(roles, contents, add_generation_prompt));
    }

    /// Every token, forwarded or pending.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Tokens filled but not yet forwarded.
    pub fn num_pending(&self) -> usize {
        self.token_ids.len() - self.num_committed
    }

    /// The log-probabilities of each token of the last generation (`generate*` empties them) whose
    /// [`Shape`] asked for them, and of each [`Context::shaped_step`] since.
    pub fn logprobs(&self) -> &[Logprobs] {
        &self.logprobs
    }

    /// The context's command queue.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Handles of the KV pages holding the forwarded tokens (and any allocated ahead).
    pub fn page_handles(&self) -> &[u32] {
        self.pages.handles()
    }

    pub fn set_priority(&mut self, priority: u32) {
        self.priority = priority;
        self.queue.set_priority(priority);
    }

    /// Completes once every call this context issued has.
    pub fn synchronize(&self) -> HostFuture<()> {
        self.queue.synchronize()
    }

    /// Prefill: forward every pending token but the last (which the next decode step feeds).
    pub async fn flush(&mut self) -> Result<(), String> {
        let upto = self.token_ids.len().saturating_sub(1);
        if upto > self.num_committed {
            self.forward(upto, &[], 0).await?;
        }
        Ok(())
    }

    /// Forward the pending tokens; the top-`top_k` distribution of the next token (0 = the
    /// server's default K). With nothing pending, the last token is forwarded again.
    pub async fn next_dist(&mut self, top_k: u32) -> Result<Distribution, String> {
        match self.forward_pending(top_k, false).await?.pop() {
            Some(dist) if !dist.token_ids.is_empty() => Ok(dist),
            _ => Err("forward-text returned no distribution".to_string()),
        }
    }

    /// Forward the pending tokens; the distribution after each of them, in order (speculative
    /// decoding: fill the drafted tokens, check each against the distribution before it, then
    /// `truncate` the rejected ones). With nothing pending, the last token is forwarded again.
    pub async fn dists(&mut self, top_k: u32) -> Result<Vec<Distribution>, String> {
        let dists = self.forward_pending(top_k, true).await?;
        if dists.iter().any(|dist| dist.token_ids.is_empty()) {
            return Err("forward-text returned an empty distribution".to_string());
        }
        Ok(dists)
    }

    /// Forward every pending token (the last one again if none is pending); the distribution
    /// after the last, or after `each` one.
    async fn forward_pending(&mut self, top_k: u32, each: bool) -> Result<Vec<Distribution>, String> {
        self.feed_last_again()?;
        let pending = self.num_pending() as u32;
        let outputs: Vec<u32> = if each { (0..pending).collect() } else { vec![pending - 1] };
        let dists = self.forward(self.token_ids.len(), &outputs, top_k).await?;
        if pending == 1 {
            self.prefetch_pages(); // decoding
        }
        if dists.len() != outputs.len() {
            return Err(format!("forward-text returned {} distributions for {} outputs", dists.len(), outputs.len()));
        }
        Ok(dists)
    }

    /// With nothing pending, make the last forwarded token pending again, so that a decode step has a
    /// token to feed; an error for an empty context.
    fn feed_last_again(&mut self) -> Result<(), String> {
        if self.num_committed == self.token_ids.len() {
            if self.num_committed == 0 {
                return Err("the context is empty: fill it before decoding".to_string());
            }
            self.num_committed -= 1; // rewriting its K/V slot is harmless, and shows it if it was hidden
            if let Some(dropped) = self.dropped.get_mut(self.num_committed) {
                *dropped = false;
            }
        }
        Ok(())
    }

    /// One decode step: sample the next token and append it (pending); return it.
    pub async fn decode_step<S: Sampler + ?Sized>(&mut self, sampler: &mut S) -> Result<u32, String> {
        let dist = self.next_dist(sampler.top_k()).await?;
        let token = sampler.sample(&dist);
        self.token_ids.push(token);
        Ok(token)
    }

    /// Decode until `stop`; the new tokens, a final stop token included. With a built-in sampler the
    /// server draws the tokens, one step in flight ahead (`context/pipelined.rs`): the same tokens,
    /// the same context afterwards, the sampler's generator moved on by the same draws.
    pub async fn generate_tokens<S: Sampler + ?Sized>(&mut self, sampler: &mut S, stop: &Stop) -> Result<Vec<u32>, String> {
        self.generate_tokens_with(sampler, stop, None).await
    }

    /// [`Context::generate_tokens`] under `shape` (a grammar, an allowed set, biases, penalties,
    /// log-probabilities into [`Context::logprobs`]), which the server applies where it draws: the
    /// sampler must be a built-in one. A grammar or penalties get a decoder on the server for the
    /// generation, dropped at its end.
    pub async fn generate_tokens_shaped<S: Sampler + ?Sized>(&mut self, sampler: &mut S, stop: &Stop, shape: &Shape) -> Result<Vec<u32>, String> {
        self.generate_tokens_with(sampler, stop, Some(shape)).await
    }

    async fn generate_tokens_with<S: Sampler + ?Sized>(&mut self, sampler: &mut S, stop: &Stop, shape: Option<&Shape>) -> Result<Vec<u32>, String> {
        self.logprobs.clear();
        let draw = pipelined::Draw::of(sampler);
        if shape.is_some() && draw.is_none() {
            return Err("a Shape needs one of the built-in samplers (Greedy, Temperature, TopK, TopP, MinP): the server \
                        applies it where it draws the token"
                .to_string());
        }
        let mut generated = Vec::new();
        let result = match draw {
            Some(mut draw) => {
                let decoder = match shape {
                    Some(shape) if shape.needs_decoder() => Some(Decoder::new(shape)?),
                    _ => None,
                };
                let shaping = match shape {
                    Some(shape) => match WitShaping::of(shape, decoder.as_ref(), vocab_size()) {
                        Ok(shaping) => Some((shaping, shape.logprobs() >= 0)),
                        Err(message) => return Err(message), // the decoder is dropped
                    },
                    None => None,
                };
                draw.shaping = shaping;
                self.planned_len = self.token_ids.len() + stop.max_new_tokens();
                let result = self.decode_pipelined(&draw, stop, &mut generated).await;
                if let Some(rng) = sampler.server_spec().and_then(|spec| spec.rng) {
                    rng.skip(generated.len() as u64); // the draws the server made for the tokens kept
                }
                self.planned_len = 0;
                drop(decoder); // after the last step (a step dropped ahead is discarded first)
                result
            }
            None => {
                self.planned_len = self.token_ids.len() + stop.max_new_tokens();
                let result = self.decode_until(sampler, stop, &mut generated).await;
                self.planned_len = 0;
                result
            }
        };
        result.map(|()| generated)
    }

    async fn decode_until<S: Sampler + ?Sized>(&mut self, sampler: &mut S, stop: &Stop, generated: &mut Vec<u32>) -> Result<(), String> {
        let stop_token_ids = stop.stop_token_ids();
        let tail = stop.tail_tokens();
        while generated.len() < stop.max_new_tokens() {
            let token = self.decode_step(sampler).await?;
            generated.push(token);
            if stop_token_ids.contains(&token) {
                break;
            }
            // A stop string that appears now lies within the newest `tail` tokens: decode only those.
            if !stop.strings().is_empty() && stop.find_string(&detokenize(&generated[generated.len().saturating_sub(tail)..])).is_some() {
                break;
            }
        }
        Ok(())
    }

    /// Decode until `stop`; the new text, without stop tokens and cut before the earliest stop string.
    pub async fn generate<S: Sampler + ?Sized>(&mut self, sampler: &mut S, stop: &Stop) -> Result<String, String> {
        let generated = self.generate_tokens(sampler, stop).await?;
        Ok(Self::text_of(generated, stop))
    }

    /// [`Context::generate`] under `shape`, as [`Context::generate_tokens_shaped`].
    pub async fn generate_shaped<S: Sampler + ?Sized>(&mut self, sampler: &mut S, stop: &Stop, shape: &Shape) -> Result<String, String> {
        let generated = self.generate_tokens_shaped(sampler, stop, shape).await?;
        Ok(Self::text_of(generated, stop))
    }

    /// The generated tokens less the stop tokens, detokenized, cut before the earliest stop string.
    fn text_of(generated: Vec<u32>, stop: &Stop) -> String {
        let stop_token_ids = stop.stop_token_ids();
        let kept: Vec<u32> = generated.into_iter().filter(|t| !stop_token_ids.contains(t)).collect();
        let mut text = detokenize(&kept);
        if let Some(at) = stop.find_string(&text) {
            text.truncate(at);
        }
        text
    }

    /// One forward-text call over the pending tokens up to `upto`; the top-`top_k` distributions
    /// after the `outputs` among them (indices counted from the first pending token). If the server
    /// discarded pages meanwhile, they are recomputed and the call made again.
    async fn forward(&mut self, upto: usize, outputs: &[u32], top_k: u32) -> Result<Vec<Distribution>, String> {
        self.reserve(upto).await?;
        match self.forward_text(upto, outputs, top_k).await {
            Err(message) if message.starts_with(KV_DISCARDED) => {
                self.recompute_discarded().await?;
                self.forward_text(upto, outputs, top_k).await
            }
            result => result,
        }
    }

    /// The forward-text call of [`Context::forward`], its pages reserved.
    async fn forward_text(&mut self, upto: usize, outputs: &[u32], top_k: u32) -> Result<Vec<Distribution>, String> {
        let first = self.num_committed;
        let ps = self.page_size;
        let num_pages = (upto + ps - 1) / ps;
        let last_page_len = (upto - (num_pages - 1) * ps) as u32;
        let positions: Vec<u32> = (first as u32..upto as u32).collect();
        let call = forward::forward_text(
            self.queue.id(),
            &self.token_ids[first..upto],
            &positions,
            &self.pages.handles()[..num_pages],
            last_page_len,
            outputs,
            top_k,
            self.adapter,
        );
        let dists = HostFuture::dists(call).await;
        let side_calls = self.check_side_calls();
        let dists = dists?;
        self.num_committed = upto;
        side_calls.map(|()| dists)
    }

    /// Pages for tokens `[..upto]` (topped up to the planned length, see `pages_ahead`), and a page
    /// of our own where the forward starts writing.
    async fn reserve(&mut self, upto: usize) -> Result<(), String> {
        if !self.needs_pages(upto) {
            return Ok(());
        }
        let ps = self.page_size;
        let needed = (upto + ps - 1) / ps;
        let write_page = self.num_committed / ps;
        let copy_first = write_page < self.pages.len().min(needed) && self.pages.is_shared(write_page);
        let missing = needed.max(self.pages_ahead(upto)).saturating_sub(self.pages.len()) + copy_first as usize;
        let mut fresh = match self.spare.take() {
            Some(spare) => spare.await?,
            None => Vec::new(),
        };
        if fresh.len() < missing {
            let count = (missing - fresh.len()) as u32;
            fresh.extend(HostFuture::handles(kvpages::alloc_kvpages(self.queue.id(), count)).await?);
        }
        set_recomputable(&fresh, true)?; // ours alone: the server may discard them while we wait
        let mut fresh = fresh.into_iter();
        if copy_first {
            let page = fresh.next().expect("allocated above");
            self.copy_on_write(write_page, page);
        }
        fresh.for_each(|page| self.pages.push(page));
        Ok(())
    }

    /// Whether a forward of the pending tokens up to `upto` must reserve first: a page short, or its
    /// write page shared (copy on write).
    fn needs_pages(&self, upto: usize) -> bool {
        let ps = self.page_size;
        let needed = (upto + ps - 1) / ps;
        let write_page = self.num_committed / ps;
        needed > self.pages.len() || (write_page < self.pages.len().min(needed) && self.pages.is_shared(write_page))
    }

    /// How many pages to hold once `upto` tokens are in: while generating, enough for the planned
    /// length but at most `ALLOC_AHEAD_TOKENS` past `upto` (one allocation per few pages, not per
    /// page, without holding a long budget's pages that an early stop would never use).
    fn pages_ahead(&self, upto: usize) -> usize {
        let target = self.planned_len.min(upto + ALLOC_AHEAD_TOKENS).max(upto);
        (target + self.page_size - 1) / self.page_size
    }

    /// While decoding, allocate the next pages once the last one is half full, so a decode step
    /// never waits for an allocation. On queue 0: its fresh-page masking then runs apart from
    /// this context's forwards instead of in front of the next one.
    fn prefetch_pages(&mut self) {
        self.prefetch_pages_at(self.num_committed);
    }

    /// `prefetch_pages` as it would run with `num_committed` tokens forwarded (the pipelined loop has
    /// issued the next step by then).
    fn prefetch_pages_at(&mut self, num_committed: usize) {
        let free_slots = self.pages.len() * self.page_size - num_committed;
        if self.spare.is_some() || free_slots > self.page_size / 2 {
            return;
        }
        let count = match self.planned_len {
            0 => 1, // decode steps driven by the caller: one page at a time
            _ => self.pages_ahead(num_committed).saturating_sub(self.pages.len()),
        };
        if count > 0 {
            self.spare = Some(HostFuture::handles(kvpages::alloc_kvpages(0, count as u32)).checking_first());
        }
    }

    /// Free the pages allocated ahead of need: those past the forwarded tokens, and a prefetch (a
    /// context about to wait then holds only the pages of its K/V; offload and evict do this).
    pub fn free_pages_ahead(&mut self) {
        self.free_spare();
        let freed = self.pages.truncate((self.num_committed + self.page_size - 1) / self.page_size);
        if !freed.is_empty() {
            self.side_calls.push(kvpages::dealloc_kvpages(self.queue.id(), &freed));
        }
    }

    /// This context is about to wait about `ms` milliseconds on something outside the model (a tool,
    /// a user): it frees its pages allocated ahead, and the server's interception policy may keep its
    /// K/V on the device or swap it to the host tier meanwhile (it is back before it runs).
    pub fn pause_hint(&mut self, ms: u64) {
        self.free_pages_ahead();
        runtime::pause_hint(ms);
    }

    /// Free the pages of a prefetch, once it has allocated them.
    fn free_spare(&mut self) {
        if let Some(spare) = self.spare.take() {
            spawn(async move {
                if let Ok(pages) = spare.await {
                    raw_futures::discard(kvpages::dealloc_kvpages(0, &pages));
                }
            });
        }
    }

    fn check_side_calls(&mut self) -> Result<(), String> {
        if self.side_calls.is_empty() {
            return Ok(());
        }
        let done = raw_futures::poll(&self.side_calls);
        self.side_calls.retain(|h| !done.contains(h));
        let mut result = Ok(());
        for handle in done {
            if let Err(message) = raw_futures::take_unit(handle) {
                result = result.and(Err(message));
            }
        }
        result
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        for handle in self.side_calls.drain(..) {
            raw_futures::discard(handle);
        }
        self.free_spare();
        let freed = self.pages.truncate(0);
        if !freed.is_empty() {
            raw_futures::discard(kvpages::dealloc_kvpages(self.queue.id(), &freed));
        }
        // The queue is destroyed next, as the field is dropped.
    }
}
