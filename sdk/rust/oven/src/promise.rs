//! [`Promise`]: a value one task sets and any number of tasks await (the Python SDK's `Future`),
//! e.g. an event another task signals, or a result handed from a callback to a waiting task.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

struct PromiseState<T> {
    value: Option<T>,
    wakers: Vec<Waker>,
}

/// A value set once with [`Promise::set`]; awaiting the promise (or a clone: clones share the
/// value) gives a copy of it once set. A failure is a value too: use `Promise<Result<T, String>>`.
pub struct Promise<T> {
    state: Rc<RefCell<PromiseState<T>>>,
}

impl<T> Clone for Promise<T> {
    fn clone(&self) -> Self {
        Promise { state: Rc::clone(&self.state) }
    }
}

impl<T> Default for Promise<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Promise<T> {
    pub fn new() -> Self {
        Promise { state: Rc::new(RefCell::new(PromiseState { value: None, wakers: Vec::new() })) }
    }

    /// Set the value and wake every task awaiting it. Panics if it was set already.
    pub fn set(&self, value: T) {
        let wakers = {
            let mut state = self.state.borrow_mut();
            assert!(state.value.is_none(), "the promise has already been set");
            state.value = Some(value);
            std::mem::take(&mut state.wakers)
        };
        wakers.into_iter().for_each(Waker::wake); // outside the borrow
    }

    pub fn is_done(&self) -> bool {
        self.state.borrow().value.is_some()
    }
}

impl<T> Unpin for Promise<T> {}

impl<T: Clone> Future for Promise<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<T> {
        let mut state = self.state.borrow_mut();
        match &state.value {
            Some(value) => Poll::Ready(value.clone()),
            None => {
                if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    state.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join;
    use crate::spawn;

    #[test]
    fn every_waiter_gets_the_value_once_it_is_set() {
        let promise: Promise<u32> = Promise::new();
        let results = Rc::new(RefCell::new(Vec::new()));
        for _ in 0..2 {
            let (promise, results) = (promise.clone(), Rc::clone(&results));
            spawn(async move {
                let value = promise.await;
                results.borrow_mut().push(value);
            });
        }
        let setter = promise.clone();
        spawn(async move {
            let (a, b) = join(async { 1 }, async { 2 }).await;
            setter.set(a + b + 39);
        });
        crate::executor::run_tasks();
        assert!(promise.is_done());
        assert_eq!(*results.borrow(), vec![42, 42]);
    }

    #[test]
    #[should_panic(expected = "the promise has already been set")]
    fn setting_twice_panics() {
        let promise = Promise::new();
        promise.set(1);
        promise.set(2);
    }
}
