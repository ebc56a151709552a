//! The oven inferlet SDK for Rust: the Rust twin of the Python SDK, over [`oven_raw`]. The two
//! offer the same features and issue the same host calls (`sdk/README.md` has the table of both;
//! `tests/test_sdk_conformance.py` holds them together).
//!
//! An inferlet is an `async fn main`, wired to the world's `start`/`resume` exports by
//! [`main!`]; a small single-threaded executor runs it and any tasks it [`spawn`]s. Awaiting a
//! host call suspends the task until the host reports its handle complete.
//!
//! ```ignore
//! use oven::{Context, Greedy, Stop};
//!
//! async fn main(args: Vec<String>) -> Result<i32, String> {
//!     let mut ctx = Context::new();
//!     ctx.fill(args.first().ok_or("usage: PROMPT")?);
//!     let text = ctx.generate(&mut Greedy, &Stop::max_tokens(32).with_eos()).await?;
//!     oven::send(&text);
//!     Ok(0)
//! }
//!
//! oven::main!(main);
//! ```
//!
//! * Tasks: [`spawn`], [`join`], [`join_all`] (gather), [`sleep`], [`Promise`] (a value another
//!   task sets).
//! * Messages and I/O: [`send`], [`receive`], [`broadcast`], [`subscribe`], [`fetch`].
//! * Composition: [`launch`] a child inferlet, [`Child::wait`] for how it ended, [`Child::cancel`].
//! * Generation: [`Context`] (fill, flush, next_dist, dists, decode_step, generate, fork,
//!   drop_range, truncate, offload/restore, evict, export/imported/release_export) on its own
//!   [`Queue`], samplers ([`Greedy`], [`Temperature`], [`TopK`], [`TopP`], [`MinP`], drawing from
//!   the seeded [`Rng`] with [`draw`], as the Python SDK does bit for bit) and [`Stop`].
//! * Shaped generation: [`Grammar`] (JSON Schema, regex, Lark, choice) and [`Shape`] (a grammar,
//!   an allowed set, biases, penalties, [`Logprobs`]) for `Context::generate_shaped` and
//!   `Context::shaped_step`; the server applies them where it draws.
//! * The model: [`tokenize`], [`detokenize`], [`render_chat`], [`stop_tokens`], ...
//!
//! Errors are `String`s, as in the raw API: a failed host call's message, or the SDK's own.
//! `main` returning `Err(message)` fails the instance (exit code 1, `oven ps` state `failed`, reason
//! `message`) after sending "error: message" to the client, as a Python inferlet's exception does; a
//! panic sends "error: panicked at ..." before the trap, and the host reports that as the reason.
//!
//! Builds with rustc 1.63 (Debian's, the only offline toolchain with a wasm32 std) and stable.

mod children;
mod context;
mod executor;
mod host_future;
mod io;
mod join;
mod model;
mod pages;
mod promise;
mod queue;
mod sampling;
mod shaping;
mod stop;

pub use children::{launch, Child, ChildExit};
pub use context::Context;
pub use executor::{spawn, IntoExitCode, JoinHandle};
pub use host_future::HostFuture;
pub use io::{arguments, broadcast, fetch, instance_id, now_ms, receive, send, sleep, subscribe};
pub use join::{join, join_all, Join, JoinAll};
pub use promise::Promise;
pub use queue::Queue;
pub use model::{
    available_traits, detokenize, models, open_adapter, page_size, render_chat, stop_tokens, tokenize, vocab_size,
};
pub use oven_raw::futures::{Distribution, HttpResponse};
pub use sampling::{draw, Greedy, MinP, Rng, Sampler, ServerSpec, Temperature, TopK, TopP};
pub use oven_raw::forward::SamplerKind;
pub use oven_raw::grammars::GrammarKind;
pub use shaping::{Grammar, Logprobs, Shape};
pub use stop::Stop;

/// The raw bindings, for calls the SDK does not wrap (embeds, release-export, ...).
pub use oven_raw as raw;

#[doc(hidden)]
pub mod __private {
    pub use crate::executor::{resume, start};
}

/// Export `start`/`resume` running `$main`, an `async fn(Vec<String>) -> R` where `R` is
/// `Result<i32, String>`, `Result<(), String>`, `i32` or `()` (see [`IntoExitCode`]).
#[macro_export]
macro_rules! main {
    ($main:path) => {
        fn __oven_start() -> ::std::vec::Vec<u32> {
            $crate::__private::start($main)
        }

        fn __oven_resume(ready: ::std::vec::Vec<u32>) -> ::std::vec::Vec<u32> {
            $crate::__private::resume(ready)
        }

        $crate::raw::export_inferlet!(__oven_start, __oven_resume);
    };
}
