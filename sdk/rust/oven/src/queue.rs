//! [`Queue`]: a command queue. Calls issued on one queue run in order; calls on different queues
//! may be batched together. Every [`crate::Context`] has one of its own.

use oven_raw::queues;

use crate::HostFuture;

/// A command queue of this instance, destroyed when dropped (its unfinished calls are cancelled).
/// As the Python SDK's `Queue`.
pub struct Queue {
    id: u32,
}

impl Queue {
    /// A new queue of `priority` (higher is dispatched first).
    pub fn new(priority: u32) -> Self {
        Queue { id: queues::create_queue(priority) }
    }

    /// The WIT `queue` handle, for calls through [`crate::raw`].
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn set_priority(&self, priority: u32) {
        queues::set_priority(self.id, priority);
    }

    /// Completes once every call issued on this queue before it has.
    pub fn synchronize(&self) -> HostFuture<()> {
        HostFuture::unit(queues::synchronize(self.id))
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        queues::destroy_queue(self.id);
    }
}
