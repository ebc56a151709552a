//! Waiting on several futures at once within one task: [`join`] (two) and [`join_all`] (gather).
//!
//! Host calls issued by the joined futures are in flight together, so the host can batch them
//! (e.g. one decode step of many contexts becomes one batch).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

/// A future, then its output once it has completed.
enum MaybeDone<F: Future> {
    Running(Pin<Box<F>>),
    Done(Option<F::Output>),
}

impl<F: Future> MaybeDone<F> {
    fn new(future: F) -> Self {
        MaybeDone::Running(Box::pin(future))
    }

    /// Poll if still running; true once done.
    fn poll_done(&mut self, cx: &mut TaskContext<'_>) -> bool {
        if let MaybeDone::Running(future) = self {
            match future.as_mut().poll(cx) {
                Poll::Ready(value) => *self = MaybeDone::Done(Some(value)),
                Poll::Pending => return false,
            }
        }
        true
    }

    fn take(&mut self) -> F::Output {
        match self {
            MaybeDone::Done(value) => value.take().expect("a joined output is taken once"),
            MaybeDone::Running(_) => unreachable!("taken before completion"),
        }
    }
}

/// The future of [`join`].
pub struct Join<A: Future, B: Future> {
    a: MaybeDone<A>,
    b: MaybeDone<B>,
}

/// Both outputs, once both futures have completed; they progress concurrently.
pub fn join<A: Future, B: Future>(a: A, b: B) -> Join<A, B> {
    Join { a: MaybeDone::new(a), b: MaybeDone::new(b) }
}

impl<A: Future, B: Future> Unpin for Join<A, B> {}

impl<A: Future, B: Future> Future for Join<A, B> {
    type Output = (A::Output, B::Output);

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let a_done = self.a.poll_done(cx);
        let b_done = self.b.poll_done(cx);
        if a_done && b_done {
            Poll::Ready((self.a.take(), self.b.take()))
        } else {
            Poll::Pending
        }
    }
}

/// The future of [`join_all`].
pub struct JoinAll<F: Future> {
    futures: Vec<MaybeDone<F>>,
}

/// Every output in the order given, once all futures have completed (Python's `gather`).
pub fn join_all<I>(futures: I) -> JoinAll<I::Item>
where
    I: IntoIterator,
    I::Item: Future,
{
    JoinAll { futures: futures.into_iter().map(MaybeDone::new).collect() }
}

impl<F: Future> Unpin for JoinAll<F> {}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut all_done = true;
        for future in self.futures.iter_mut() {
            all_done &= future.poll_done(cx);
        }
        if all_done {
            Poll::Ready(self.futures.iter_mut().map(MaybeDone::take).collect())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{RawWaker, RawWakerVTable, Waker};

    fn noop_waker() -> Waker {
        const VTABLE: RawWakerVTable = RawWakerVTable::new(|_| RawWaker::new(std::ptr::null(), &VTABLE), |_| {}, |_| {}, |_| {});
        unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
    }

    /// Ready with `value` after `polls_left` pending polls.
    struct After {
        polls_left: u32,
        value: u32,
    }

    impl Future for After {
        type Output = u32;
        fn poll(mut self: Pin<&mut Self>, _cx: &mut TaskContext<'_>) -> Poll<u32> {
            if self.polls_left == 0 {
                return Poll::Ready(self.value);
            }
            self.polls_left -= 1;
            Poll::Pending
        }
    }

    fn block_on<F: Future>(future: F) -> (F::Output, u32) {
        let waker = noop_waker();
        let mut cx = TaskContext::from_waker(&waker);
        let mut future = Box::pin(future);
        let mut polls = 1;
        loop {
            if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
                return (value, polls);
            }
            polls += 1;
        }
    }

    #[test]
    fn join_all_keeps_order_and_polls_concurrently() {
        let futures = (0..4).map(|i| After { polls_left: 3 - i, value: i * 10 });
        let (values, polls) = block_on(join_all(futures));
        assert_eq!(values, vec![0, 10, 20, 30]);
        assert_eq!(polls, 4); // the slowest one's polls, not the sum
    }

    #[test]
    fn join_pairs_different_types() {
        let (value, _) = block_on(join(After { polls_left: 2, value: 1 }, async { "two" }));
        assert_eq!(value, (1, "two"));
    }

    #[test]
    fn join_all_of_nothing_is_ready() {
        let (values, polls) = block_on(join_all(Vec::<After>::new()));
        assert!(values.is_empty());
        assert_eq!(polls, 1);
    }
}
