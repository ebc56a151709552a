//! Pipelined generation: the server draws each token (`forward-sample`), and the next step is
//! issued with that token's future as its input before the token is known, so the device need not
//! wait for this inferlet between two steps (xLLM's asynchronous schedule).
//!
//! It gives what the step-by-step loop gives, token for token, and leaves the context as that loop
//! does: the server runs the SDK's own sampler on the distribution the inferlet would have got
//! (sdk/README.md "Seeded sampling"), from the generator state the sampler would have, and every
//! host call of the step-by-step loop (page reservations, prefetches, side-call checks) is made at
//! the same point. A step is issued ahead only when it needs no page reservation; otherwise it
//! waits for the token, as that loop does. When the token a step ahead feeds on ends generation,
//! the step is dropped (its future discarded) and the context forgets the token it fed, which
//! stays pending. The K/V that step wrote lies past the context's end, in the slot where the next
//! forward of that pending token writes the very same values. `sdk/python/inferlet/pipelined.py`
//! is the same loop.
//!
//! A [`Shape`] makes every step `forward-sample-shaped` (take-sampled): its grammar and penalties
//! live in a decoder on the server, made before the loop and dropped after it, which each drawn
//! token advances in order, so the loop stays pipelined; the log-probabilities it asks for are
//! recorded as each step's token is taken (a step dropped ahead is never taken).

use oven_raw::forward::{self, SamplerKind};
use oven_raw::futures::Sampled;

use super::Context;
use crate::model::{detokenize, vocab_size};
use crate::sampling::GAMMA;
use crate::shaping::WitShaping;
use crate::{HostFuture, Sampler, Shape, Stop};

/// What the server needs to draw as a built-in sampler would.
pub(super) struct Draw {
    kind: SamplerKind,
    temperature: f64,
    param: f64,
    top_k: u32,
    first_state: u64,
    /// What one draw adds to the generator's state: 0 for Greedy, which draws nothing.
    per_draw: u64,
    /// For a shaped generation: the shaping of every step, and whether to keep the log-probabilities.
    pub(super) shaping: Option<(WitShaping, bool)>,
}

impl Draw {
    /// The server's version of `sampler`, if it has one.
    pub(super) fn of<S: Sampler + ?Sized>(sampler: &mut S) -> Option<Draw> {
        let top_k = sampler.top_k();
        let spec = sampler.server_spec()?;
        let (first_state, per_draw) = spec.rng.map_or((0, 0), |rng| (rng.state(), GAMMA));
        Some(Draw { kind: spec.kind, temperature: spec.temperature, param: spec.param, top_k, first_state, per_draw, shaping: None })
    }

    /// The generator's state before draw `index` (counted from the start of this generation).
    fn state(&self, index: usize) -> u64 {
        self.first_state.wrapping_add(self.per_draw.wrapping_mul(index as u64))
    }
}

impl Context {
    pub(super) async fn decode_pipelined(&mut self, draw: &Draw, stop: &Stop, generated: &mut Vec<u32>) -> Result<(), String> {
        let max = stop.max_new_tokens();
        if max == 0 {
            return Ok(());
        }
        // Pages the server discarded while the inferlet waited are rewritten first (recompute.rs):
        // a step that failed on one could not be retried once the next is issued on its token.
        self.recompute_discarded().await?;
        let stop_token_ids = stop.stop_token_ids();
        let tail = stop.tail_tokens();
        self.feed_last_again()?;
        let mut pending = self.num_pending();
        let mut step_start = self.num_committed;
        let upto = self.token_ids.len();
        self.reserve(upto).await?;
        let mut step = self.issue_sample(upto, None, draw, 0);
        loop {
            let step_end = step_start + pending;
            // The next step, fed by this one's token before it is known, unless it needs pages first.
            let ahead = if generated.len() + 1 < max && !self.needs_pages(self.token_ids.len() + 1) {
                self.token_ids.push(0); // the token `step` will hold
                Some(self.issue_sample(self.token_ids.len(), Some(step.handle()), draw, generated.len() + 1))
            } else {
                None
            };
            let result = step.await;
            let side_calls = self.check_side_calls();
            let token = match result.and_then(|sampled| side_calls.map(|()| sampled)) {
                Ok(sampled) => self.take_logprobs(draw, sampled),
                Err(message) => {
                    drop(ahead); // as after a failed forward: the step's tokens are pending again
                    self.token_ids.truncate(step_end);
                    self.num_committed = step_start;
                    return Err(message);
                }
            };
            if pending == 1 {
                self.prefetch_pages_at(step_end); // as the step-by-step loop does after a decode step
            }
            generated.push(token);
            let stopping = generated.len() >= max
                || stop_token_ids.contains(&token)
                || (!stop.strings().is_empty()
                    && stop.find_string(&detokenize(&generated[generated.len().saturating_sub(tail)..])).is_some());
            match ahead {
                Some(next) => {
                    *self.token_ids.last_mut().expect("the placeholder pushed above") = token;
                    if stopping {
                        drop(next); // its future is discarded; the token it fed is pending again
                        self.num_committed -= 1;
                        return Ok(());
                    }
                    step = next;
                    step_start = step_end;
                }
                None => {
                    self.token_ids.push(token);
                    if stopping {
                        return Ok(());
                    }
                    let upto = self.token_ids.len();
                    self.reserve(upto).await?;
                    step = self.issue_sample(upto, None, draw, generated.len());
                    step_start = step_end;
                }
            }
            pending = 1;
        }
    }

    /// The `forward-sample` call over the pending tokens up to `upto` (pages reserved), or, given
    /// `feeds`, over the one token that future will hold (a placeholder in `token_ids`).
    fn issue_sample(&mut self, upto: usize, feeds: Option<u32>, draw: &Draw, index: usize) -> HostFuture<Sampled> {
        let first = self.num_committed;
        let ps = self.page_size;
        let num_pages = (upto + ps - 1) / ps;
        let last_page_len = (upto - (num_pages - 1) * ps) as u32;
        let positions: Vec<u32> = (first as u32..upto as u32).collect();
        let inputs: Vec<u32> = feeds.into_iter().collect();
        let (queue, tokens, pages) = (self.queue.id(), &self.token_ids[first..upto], &self.pages.handles()[..num_pages]);
        let step = match &draw.shaping {
            None => HostFuture::token_as_sampled(forward::forward_sample(
                queue, tokens, &inputs, &positions, pages, last_page_len, draw.top_k, self.adapter, draw.kind,
                draw.temperature, draw.param, draw.state(index),
            )),
            Some((shaping, _)) => HostFuture::sampled(forward::forward_sample_shaped(
                queue, tokens, &inputs, &positions, pages, last_page_len, draw.top_k, self.adapter, draw.kind,
                draw.temperature, draw.param, draw.state(index), &shaping.raw(),
            )),
        };
        self.num_committed = upto;
        step
    }

    /// A step's token; its log-probabilities go to `self.logprobs` if the shape asked for them
    /// (steps complete in order).
    fn take_logprobs(&mut self, draw: &Draw, sampled: Sampled) -> u32 {
        let token = sampled.token;
        if let Some((_, true)) = draw.shaping {
            self.logprobs.push(sampled.into());
        }
        token
    }

    /// One step that the server draws under `shape`, for a decoder of one's own that changes the
    /// allowed set or the biases from step to step (a grammar and penalties need a decoder, which
    /// [`Context::generate_shaped`] keeps): the token is appended (pending), as
    /// [`Context::decode_step`] does, and its log-probabilities, if `shape` asks for them, to
    /// [`Context::logprobs`]. The sampler must be a built-in one; its generator moves on by one draw.
    pub async fn shaped_step<S: Sampler + ?Sized>(&mut self, shape: &Shape, sampler: &mut S) -> Result<u32, String> {
        let mut draw = match Draw::of(sampler) {
            Some(draw) if !shape.needs_decoder() => draw,
            _ => return Err("shaped_step takes a built-in sampler and a Shape without grammar or penalties".to_string()),
        };
        draw.shaping = Some((WitShaping::of(shape, None, vocab_size())?, shape.logprobs() >= 0));
        self.recompute_discarded().await?;
        self.feed_last_again()?;
        let pending = self.num_pending();
        let step_start = self.num_committed;
        let upto = self.token_ids.len();
        self.reserve(upto).await?;
        let result = self.issue_sample(upto, None, &draw, 0).await;
        let side_calls = self.check_side_calls();
        let token = match result.and_then(|sampled| side_calls.map(|()| sampled)) {
            Ok(sampled) => self.take_logprobs(&draw, sampled),
            Err(message) => {
                self.num_committed = step_start; // as after a failed forward: the tokens are pending again
                return Err(message);
            }
        };
        if pending == 1 {
            self.prefetch_pages_at(upto); // as after a decode step
        }
        if let Some(rng) = sampler.server_spec().and_then(|spec| spec.rng) {
            rng.skip(1); // the draw the server made
        }
        self.token_ids.push(token);
        Ok(token)
    }
}
