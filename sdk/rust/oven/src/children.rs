//! Child instances (composition): [`launch`] another inferlet under this instance's client, await
//! how it ended with [`Child::wait`], or end it with [`Child::cancel`]. A child dies with its parent.

use oven_raw::children as raw;
pub use oven_raw::futures::ChildExit;

use crate::HostFuture;

/// A child instance this one launched; its handle is this instance's own.
#[derive(Debug)]
pub struct Child {
    handle: u32,
}

/// Launch `program` (its name or hash, as this instance's client would launch it: the client's own
/// upload, a shared program, a library inferlet) with `args`. `Err` names why not: an unknown
/// program, the client's or the server's cap on instances, the cap on nesting depth or on the
/// children one instance holds.
pub fn launch(program: &str, args: &[&str]) -> Result<Child, String> {
    raw::launch(program, args).map(|handle| Child { handle })
}

impl Child {
    /// The WIT handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Completes with how the child ended ([`ChildExit`]: its state, exit code, error and the
    /// messages it sent). The handle is released once it has; a second wait after that is an `Err`.
    pub fn wait(&self) -> HostFuture<ChildExit> {
        HostFuture::exit(raw::wait_child(self.handle))
    }

    /// End the child now (state "killed", error "cancelled by its parent"); one that has ended
    /// already is left as it ended. `wait` still gives its exit.
    pub fn cancel(&self) -> Result<(), String> {
        raw::cancel_child(self.handle)
    }
}
