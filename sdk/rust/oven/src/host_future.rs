//! [`HostFuture`]: a host call already issued, awaited through the executor.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use oven_raw::futures::{self as raw, ChildExit, Distribution, HttpResponse, Sampled};

use crate::executor;

/// The value of one host call (a `pending` handle of the WIT world). The call is issued when the
/// `HostFuture` is made; awaiting it suspends the task until the host reports the handle complete,
/// then takes the value with the matching `take-*`. Dropping it unawaited discards the value
/// (the call itself still runs).
pub struct HostFuture<T> {
    handle: u32,
    take: fn(u32) -> Result<T, String>,
    /// Ask the host with `poll` on the first poll instead of waiting to be told: for a handle
    /// issued long before it is awaited, which has likely completed unreported.
    check_first: bool,
    taken: bool,
}

impl<T> HostFuture<T> {
    fn new(handle: u32, take: fn(u32) -> Result<T, String>) -> Self {
        HostFuture { handle, take, check_first: false, taken: false }
    }

    /// The WIT `pending` handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Check with the host whether the call completed before waiting for it to say so.
    pub(crate) fn checking_first(mut self) -> Self {
        self.check_first = true;
        self
    }
}

impl HostFuture<()> {
    /// A call with no value (forward, copy, mask, dealloc, sleep, synchronize, ...).
    pub fn unit(handle: u32) -> Self {
        Self::new(handle, raw::take_unit)
    }
}

impl HostFuture<Vec<u32>> {
    /// `alloc-kvpages` / `alloc-embeds`: the new handles.
    pub fn handles(handle: u32) -> Self {
        Self::new(handle, raw::take_handles)
    }
}

impl HostFuture<Vec<Distribution>> {
    /// `get-next-dist` / `forward-text`: one distribution per output.
    pub fn dists(handle: u32) -> Self {
        Self::new(handle, raw::take_dists)
    }
}

impl HostFuture<u32> {
    /// `forward-sample`: the token the server drew.
    pub fn token(handle: u32) -> Self {
        Self::new(handle, raw::take_token)
    }
}

impl HostFuture<Sampled> {
    /// `forward-sample-shaped`: the token the server drew, with its log-probabilities if they were
    /// asked for.
    pub fn sampled(handle: u32) -> Self {
        Self::new(handle, raw::take_sampled)
    }

    /// `forward-sample`'s token (take-token) as a [`Sampled`] without log-probabilities.
    pub(crate) fn token_as_sampled(handle: u32) -> Self {
        Self::new(handle, |handle| {
            raw::take_token(handle).map(|token| Sampled { token, logprob: f32::NAN, top_ids: Vec::new(), top_logprobs: Vec::new() })
        })
    }
}

impl HostFuture<String> {
    /// `receive` / `subscribe`: a message.
    pub fn text(handle: u32) -> Self {
        Self::new(handle, raw::take_text)
    }
}

impl HostFuture<HttpResponse> {
    /// `fetch`: the response.
    pub fn http(handle: u32) -> Self {
        Self::new(handle, raw::take_http)
    }
}

impl HostFuture<ChildExit> {
    /// `wait-child`: how the child ended.
    pub fn exit(handle: u32) -> Self {
        Self::new(handle, raw::take_exit)
    }
}

impl<T> Unpin for HostFuture<T> {}

impl<T> Future for HostFuture<T> {
    type Output = Result<T, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        assert!(!self.taken, "HostFuture polled after it completed");
        let done = if self.check_first {
            self.check_first = false;
            !raw::poll(&[self.handle]).is_empty()
        } else {
            executor::take_completed(self.handle)
        };
        if !done {
            executor::await_handle(self.handle, cx.waker());
            return Poll::Pending;
        }
        self.taken = true;
        Poll::Ready((self.take)(self.handle))
    }
}

impl<T> Drop for HostFuture<T> {
    fn drop(&mut self) {
        if !self.taken {
            executor::forget_handle(self.handle);
            raw::discard(self.handle);
        }
    }
}
