//! A single-threaded executor driven by the host's `start`/`resume` exports.
//!
//! Tasks are boxed futures in a slab. A [`crate::HostFuture`] that is not ready registers its
//! handle with the waker of the task polling it; `resume(ready)` wakes those tasks and runs every
//! woken task until none is left, then returns the handles still awaited. The instance ends once
//! `main` completes: tasks still running are dropped (their destructors may issue host calls, e.g.
//! a [`crate::Context`] freeing its pages), and `main`'s result becomes the exit code.
//!
//! Wakers carry the task's slot number; waking pushes it onto a run queue kept apart from the
//! slab, so a task may wake another while it is being polled. A stale waker of a finished task may
//! wake whatever reuses its slot: a spurious poll, which every future here tolerates.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, RawWaker, RawWakerVTable, Waker};

use oven_raw::{messaging, runtime};

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// What `main` may return: its value becomes the exit code.
pub trait IntoExitCode {
    /// `Ok(code)` to exit with `code`; `Err(message)` to fail (exit code 1) after sending "error: message",
    /// which the host reports as the reason.
    fn into_exit_code(self) -> Result<i32, String>;
}

impl IntoExitCode for Result<i32, String> {
    fn into_exit_code(self) -> Result<i32, String> {
        self
    }
}

impl IntoExitCode for Result<(), String> {
    fn into_exit_code(self) -> Result<i32, String> {
        self.map(|()| 0)
    }
}

impl IntoExitCode for i32 {
    fn into_exit_code(self) -> Result<i32, String> {
        Ok(self)
    }
}

impl IntoExitCode for () {
    fn into_exit_code(self) -> Result<i32, String> {
        Ok(0)
    }
}

#[derive(Default)]
struct Executor {
    tasks: Vec<Option<Task>>,
    free_slots: Vec<usize>,
    /// Host handles awaited by a pending [`crate::HostFuture`], with the waker to call.
    awaited: Vec<(u32, Waker)>,
    /// Handles the host reported complete whose future has not been polled since.
    completed: Vec<u32>,
    exit: Option<Result<i32, String>>,
}

thread_local! {
    static EXECUTOR: RefCell<Executor> = RefCell::new(Executor::default());
    static RUN_QUEUE: RefCell<VecDeque<usize>> = RefCell::new(VecDeque::new());
}

/// A spawned task's result, awaited through its [`JoinHandle`].
struct JoinState<T> {
    result: Option<T>,
    waker: Option<Waker>,
}

/// Completes with the value of a task started with [`spawn`]. Dropping it detaches the task.
pub struct JoinHandle<T> {
    state: Rc<RefCell<JoinState<T>>>,
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<T> {
        let mut state = self.state.borrow_mut();
        match state.result.take() {
            Some(value) => Poll::Ready(value),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Run `future` as a task of its own, concurrently with the caller; it starts at the caller's
/// next `await` that suspends (or once the current slice's other tasks have run).
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let state = Rc::new(RefCell::new(JoinState { result: None, waker: None }));
    let shared = Rc::clone(&state);
    add_task(Box::pin(async move {
        let value = future.await;
        let waker = {
            let mut s = shared.borrow_mut();
            s.result = Some(value);
            s.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }));
    JoinHandle { state }
}

fn add_task(task: Task) {
    let slot = EXECUTOR.with(|e| {
        let mut e = e.borrow_mut();
        match e.free_slots.pop() {
            Some(slot) => {
                e.tasks[slot] = Some(task);
                slot
            }
            None => {
                e.tasks.push(Some(task));
                e.tasks.len() - 1
            }
        }
    });
    wake_slot(slot);
}

fn wake_slot(slot: usize) {
    RUN_QUEUE.with(|q| q.borrow_mut().push_back(slot));
}

// The waker's data pointer is the task's slot number, not a real pointer.
const VTABLE: RawWakerVTable = RawWakerVTable::new(clone_waker, wake_waker, wake_waker, drop_waker);

fn raw_waker(slot: usize) -> RawWaker {
    RawWaker::new(slot as *const (), &VTABLE)
}

unsafe fn clone_waker(data: *const ()) -> RawWaker {
    raw_waker(data as usize)
}

unsafe fn wake_waker(data: *const ()) {
    wake_slot(data as usize)
}

unsafe fn drop_waker(_data: *const ()) {}

fn waker_for(slot: usize) -> Waker {
    // Safety: the vtable's functions only copy the slot number and push it onto the run queue.
    unsafe { Waker::from_raw(raw_waker(slot)) }
}

/// Called by a pending host future: `handle` is awaited by the task of `waker`.
pub(crate) fn await_handle(handle: u32, waker: &Waker) {
    EXECUTOR.with(|e| {
        let mut e = e.borrow_mut();
        match e.awaited.iter_mut().find(|(h, _)| *h == handle) {
            Some(entry) => entry.1 = waker.clone(),
            None => e.awaited.push((handle, waker.clone())),
        }
    })
}

/// True (once) if the host has reported `handle` complete; the future then takes its value.
pub(crate) fn take_completed(handle: u32) -> bool {
    EXECUTOR.with(|e| {
        let mut e = e.borrow_mut();
        match e.completed.iter().position(|h| *h == handle) {
            Some(i) => {
                e.completed.swap_remove(i);
                true
            }
            None => false,
        }
    })
}

/// A host future is dropped before its value was taken: forget every trace of its handle.
pub(crate) fn forget_handle(handle: u32) {
    EXECUTOR.with(|e| {
        let mut e = e.borrow_mut();
        e.awaited.retain(|(h, _)| *h != handle);
        e.completed.retain(|h| *h != handle);
    })
}

/// The `start` export's body: run `main(arguments)` until it first waits on the host.
pub fn start<M, F>(main: M) -> Vec<u32>
where
    M: FnOnce(Vec<String>) -> F,
    F: Future + 'static,
    F::Output: IntoExitCode,
{
    std::panic::set_hook(Box::new(|info| {
        // The abort that follows reaches the host as an anonymous trap: say why first.
        messaging::send(&format!("error: {}", info));
    }));
    let program = main(runtime::arguments());
    add_task(Box::pin(async move {
        let exit = program.await.into_exit_code();
        EXECUTOR.with(|e| e.borrow_mut().exit = Some(exit));
    }));
    run_slice()
}

/// The `resume` export's body: wake the tasks awaiting `ready`, run, return what is awaited next.
pub fn resume(ready: Vec<u32>) -> Vec<u32> {
    let wakers: Vec<Waker> = EXECUTOR.with(|e| {
        let mut e = e.borrow_mut();
        let mut wakers = Vec::with_capacity(ready.len());
        for handle in ready {
            if let Some(i) = e.awaited.iter().position(|(h, _)| *h == handle) {
                let waker = e.awaited.swap_remove(i).1;
                e.completed.push(handle);
                if !wakers.iter().any(|w: &Waker| w.will_wake(&waker)) {
                    wakers.push(waker); // a task awaiting several of them runs once
                }
            }
        }
        wakers
    });
    for waker in wakers {
        waker.wake();
    }
    run_slice()
}

fn run_slice() -> Vec<u32> {
    run_tasks();
    let (exit, awaited) = EXECUTOR.with(|e| {
        let e = e.borrow();
        (e.exit.is_some(), e.awaited.iter().map(|(h, _)| *h).collect::<Vec<u32>>())
    });
    if exit {
        finish();
        return Vec::new();
    }
    if awaited.is_empty() {
        EXECUTOR.with(|e| {
            e.borrow_mut().exit = Some(Err("deadlock: every task waits, and on no host call".to_string()))
        });
        finish();
    }
    awaited
}

/// Poll woken tasks until none is left or `main` has returned.
pub(crate) fn run_tasks() {
    loop {
        let slot = match RUN_QUEUE.with(|q| q.borrow_mut().pop_front()) {
            Some(slot) => slot,
            None => return,
        };
        let task = EXECUTOR.with(|e| e.borrow_mut().tasks.get_mut(slot).and_then(Option::take));
        let mut task = match task {
            Some(task) => task, // None: a stale or repeated wake of a finished or running task
            None => continue,
        };
        let waker = waker_for(slot);
        let finished = match task.as_mut().poll(&mut TaskContext::from_waker(&waker)) {
            Poll::Ready(()) => Some(task),
            Poll::Pending => {
                EXECUTOR.with(|e| e.borrow_mut().tasks[slot] = Some(task));
                None
            }
        };
        if finished.is_some() {
            drop(finished); // outside any borrow of the executor
            EXECUTOR.with(|e| e.borrow_mut().free_slots.push(slot));
        }
        let main_returned = EXECUTOR.with(|e| e.borrow().exit.is_some());
        if main_returned {
            return;
        }
    }
}

/// `main` returned: drop the other tasks, report the exit code.
fn finish() {
    let (tasks, exit) = EXECUTOR.with(|e| {
        let mut e = e.borrow_mut();
        e.free_slots.clear();
        (std::mem::take(&mut e.tasks), e.exit.clone())
    });
    drop(tasks); // outside the borrow: their destructors call back into the executor
    RUN_QUEUE.with(|q| q.borrow_mut().clear());
    match exit {
        Some(Ok(code)) => runtime::set_exit_code(code),
        Some(Err(message)) => {
            // As a Python inferlet's exception does: the instance fails, and the host names the message
            // (the last "error: " line a trapping slice sent) as the reason.
            messaging::send(&format!("error: {}", message));
            std::process::abort();
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Completes on its second poll, waking its task the first time (a yield point).
    struct YieldOnce(bool);

    impl Future for YieldOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn spawned_tasks_interleave_and_join() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let result = Rc::new(Cell::new(0));
        let (log2, result2) = (Rc::clone(&log), Rc::clone(&result));
        add_task(Box::pin(async move {
            let mut handles = Vec::new();
            for i in 0..3 {
                let log = Rc::clone(&log2);
                handles.push(spawn(async move {
                    log.borrow_mut().push(i);
                    YieldOnce(false).await;
                    log.borrow_mut().push(10 + i);
                    i * 2
                }));
            }
            let mut sum = 0;
            for handle in handles {
                sum += handle.await;
            }
            result2.set(sum);
        }));
        run_tasks();
        assert_eq!(result.get(), 6);
        assert_eq!(*log.borrow(), vec![0, 1, 2, 10, 11, 12]);
        EXECUTOR.with(|e| assert!(e.borrow().tasks.iter().all(Option::is_none)));
    }
}
