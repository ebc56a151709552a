//! The instance and the outside world: arguments, clock, sleep, messages and HTTP.
//!
//! Calls that wait return a [`HostFuture`] issued at once: `receive().await`, or start several
//! and await them together with [`crate::join`] / [`crate::join_all`].

use oven_raw::futures::HttpResponse;
use oven_raw::{http, messaging, runtime};

use crate::HostFuture;

/// Arguments given at launch (also passed to `main`).
pub fn arguments() -> Vec<String> {
    runtime::arguments()
}

pub fn instance_id() -> String {
    runtime::instance_id()
}

/// Monotonic milliseconds.
pub fn now_ms() -> u64 {
    runtime::now_ms()
}

/// Completes after `ms` milliseconds.
pub fn sleep(ms: u64) -> HostFuture<()> {
    HostFuture::unit(runtime::sleep(ms))
}

/// To the client that launched the instance.
pub fn send(message: &str) {
    messaging::send(message)
}

/// The next message a client sends to this instance.
pub fn receive() -> HostFuture<String> {
    HostFuture::text(messaging::receive())
}

/// To every instance subscribed to `topic`.
pub fn broadcast(topic: &str, message: &str) {
    messaging::broadcast(topic, message)
}

/// The next message broadcast on `topic`.
pub fn subscribe(topic: &str) -> HostFuture<String> {
    HostFuture::text(messaging::subscribe(topic))
}

/// An HTTP request to a host on the server's allow-list; `headers` are "Name: value" lines.
/// Error statuses are responses; the future fails only when no response came.
pub fn fetch(method: &str, url: &str, headers: &[&str], body: &[u8]) -> HostFuture<HttpResponse> {
    HostFuture::http(http::fetch(method, url, headers, body))
}
