//! hello-rust: greedy generation on the raw oven API, the twin of `inferlets/hello-python`.
//!
//! Arguments: PROMPT [MAX_NEW_TOKENS=32] [--chat] [--fused]. Sends the generated token ids to the client as
//! one message ("1 2 3"). Unlike hello-python it prints nothing: it is built for
//! wasm32-unknown-unknown, which has no stdout, so that it imports only `oven:inferlet/*`.
//!
//! The host drives the inferlet through `start`/`resume`. Stable Rust 1.63 has no generators, so
//! the program is an explicit state machine: each state names the futures it waits on, and
//! [`Driver`] resumes it only once all of them have completed (the host resumes on any one).
//! Every decode step issues embed-text, forward and get-next-dist back to back on queue 0 and
//! waits only for the last: the queue keeps them in order. With --fused a step is one
//! forward-text call instead (the fast path: one batch and one round trip per token).
//!
//! An error (a failed future, bad arguments) ends the instance with exit code 1 after sending
//! "error: ..." to the client; hello-python traps instead, but a Rust panic would reach the host
//! only as an anonymous `unreachable` trap.

use std::cell::RefCell;

use oven_raw::{embeds, forward, futures, kvpages, messaging, runtime, tokenize};

const QUEUE: u32 = 0;
/// The `adapter` argument of the forward calls: no LoRA adapter.
const BASE_MODEL: u32 = 0;
const DEFAULT_MAX_NEW_TOKENS: usize = 32;

/// What stays fixed, and what grows, over the decode loop.
struct Generation {
    stop_tokens: Vec<u32>,
    max_new_tokens: usize,
    page_size: usize,
    pages: Vec<u32>,
    slots: Vec<u32>, // input embeds; the last one also receives the output hidden state
    generated: Vec<u32>,
    num_context_tokens: usize,
    fused: bool,
}

/// No future: the handle a fused step has in place of embed-text's and forward's.
const NO_FUTURE: u32 = 0;

enum State {
    /// Waiting for the KV pages and embeds.
    Allocating { prompt_tokens: Vec<u32>, gen: Generation, want_pages: u32, want_embeds: u32 },
    /// Waiting for one decode step's distribution (its embed and forward completed before it).
    Decoding { gen: Generation, embedded: u32, forwarded: u32, dist: u32 },
}

/// A state and the futures it waits on; `None` means finished.
type Next = Option<(State, Vec<u32>)>;

fn begin() -> Result<Next, String> {
    let args = runtime::arguments();
    if args.is_empty() {
        return Err("usage: hello-rust PROMPT [MAX_NEW_TOKENS] [--chat]".to_string());
    }
    let max_new_tokens = match args.get(1) {
        Some(a) if !a.is_empty() && a.bytes().all(|b| b.is_ascii_digit()) => {
            a.parse().map_err(|_| format!("MAX_NEW_TOKENS {} is too large", a))?
        }
        _ => DEFAULT_MAX_NEW_TOKENS,
    };
    let prompt = if args.iter().any(|a| a == "--chat") {
        tokenize::render_chat(&["user"], &[args[0].as_str()], true)
    } else {
        args[0].clone()
    };
    let prompt_tokens = tokenize::tokenize(&prompt);
    if prompt_tokens.is_empty() {
        return Err("the prompt tokenizes to no tokens".to_string());
    }
    let page_size = runtime::page_size() as usize;
    let num_pages = (prompt_tokens.len() + max_new_tokens + page_size - 1) / page_size;
    let want_pages = kvpages::alloc_kvpages(QUEUE, num_pages as u32);
    let want_embeds = embeds::alloc_embeds(QUEUE, prompt_tokens.len() as u32 + 1);
    let gen = Generation {
        stop_tokens: tokenize::stop_tokens(),
        max_new_tokens,
        page_size,
        pages: Vec::new(),
        slots: Vec::new(),
        generated: Vec::new(),
        num_context_tokens: 0,
        fused: args.iter().any(|a| a == "--fused"),
    };
    Ok(Some((State::Allocating { prompt_tokens, gen, want_pages, want_embeds }, vec![want_pages, want_embeds])))
}

/// Advance once every future the state waits on has completed.
fn advance(state: State) -> Result<Next, String> {
    match state {
        State::Allocating { prompt_tokens, mut gen, want_pages, want_embeds } => {
            gen.pages = futures::take_handles(want_pages)?;
            gen.slots = futures::take_handles(want_embeds)?;
            Ok(step_or_finish(gen, prompt_tokens))
        }
        State::Decoding { mut gen, embedded, forwarded, dist } => {
            if embedded != NO_FUTURE {
                futures::take_unit(embedded)?;
                futures::take_unit(forwarded)?;
            }
            let dists = futures::take_dists(dist)?;
            let token = *dists
                .first()
                .and_then(|d| d.token_ids.first())
                .ok_or("get-next-dist returned an empty distribution")?;
            gen.generated.push(token);
            if gen.stop_tokens.contains(&token) {
                return Ok(finish(gen));
            }
            Ok(step_or_finish(gen, vec![token]))
        }
    }
}

/// Issue one decode step over `step_tokens`, or finish once `max_new_tokens` are generated.
fn step_or_finish(mut gen: Generation, step_tokens: Vec<u32>) -> Next {
    if gen.generated.len() >= gen.max_new_tokens {
        return finish(gen);
    }
    let inputs = &gen.slots[..step_tokens.len()];
    let output = *gen.slots.last().expect("alloc-embeds returned the embeds asked for");
    let first = gen.num_context_tokens as u32;
    let positions: Vec<u32> = (first..first + step_tokens.len() as u32).collect();
    gen.num_context_tokens += step_tokens.len();
    let used = &gen.pages[..(gen.num_context_tokens + gen.page_size - 1) / gen.page_size];
    let last_page_len = (gen.num_context_tokens - (used.len() - 1) * gen.page_size) as u32;
    let last_input = inputs.len() as u32 - 1;
    if gen.fused {
        let dist =
            forward::forward_text(QUEUE, &step_tokens, &positions, used, last_page_len, &[last_input], 1, BASE_MODEL);
        return Some((State::Decoding { gen, embedded: NO_FUTURE, forwarded: NO_FUTURE, dist }, vec![dist]));
    }
    let embedded = embeds::embed_text(QUEUE, &step_tokens, &positions, inputs);
    let forwarded = forward::forward(QUEUE, used, last_page_len, inputs, &[last_input], &[output], &[], BASE_MODEL);
    let dist = forward::get_next_dist(QUEUE, output, 1);
    Some((State::Decoding { gen, embedded, forwarded, dist }, vec![dist]))
}

fn finish(gen: Generation) -> Next {
    let ids: Vec<String> = gen.generated.iter().map(|t| t.to_string()).collect();
    messaging::send(&ids.join(" "));
    None
}

/// Holds the state between slices and turns "resume on any" into "advance when all are done".
struct Driver {
    state: Option<State>,
    waiting: Vec<u32>,
}

thread_local! {
    static DRIVER: RefCell<Driver> = const { RefCell::new(Driver { state: None, waiting: Vec::new() }) };
}

impl Driver {
    fn settle(&mut self, next: Result<Next, String>) -> Vec<u32> {
        let (state, waiting) = match next {
            Ok(Some((state, waiting))) => (Some(state), waiting),
            Ok(None) => (None, Vec::new()),
            Err(message) => {
                runtime::set_exit_code(1);
                messaging::send(&format!("error: {}", message));
                (None, Vec::new())
            }
        };
        self.state = state;
        self.waiting = waiting;
        self.waiting.clone()
    }
}

fn start() -> Vec<u32> {
    DRIVER.with(|d| d.borrow_mut().settle(begin()))
}

fn resume(ready: Vec<u32>) -> Vec<u32> {
    DRIVER.with(|d| {
        let mut driver = d.borrow_mut();
        driver.waiting.retain(|f| !ready.contains(f));
        if !driver.waiting.is_empty() {
            return driver.waiting.clone();
        }
        match driver.state.take() {
            Some(state) => driver.settle(advance(state)),
            None => Vec::new(),
        }
    })
}

oven_raw::export_inferlet!(start, resume);
