//! `oven:inferlet/http`: outbound HTTP to allow-listed hosts.

use crate::abi::{borrow_str, RawList};

#[link(wasm_import_module = "oven:inferlet/http@0.2.0")]
extern "C" {
    #[link_name = "fetch"]
    fn raw_fetch(
        method_ptr: *const u8,
        method_len: usize,
        url_ptr: *const u8,
        url_len: usize,
        headers_ptr: *const RawList<u8>,
        headers_len: usize,
        body_ptr: *const u8,
        body_len: usize,
    ) -> u32;
}

/// `headers` are "Name: value" lines. A future for the response (take-http).
pub fn fetch(method: &str, url: &str, headers: &[&str], body: &[u8]) -> u32 {
    // list<string> is an array of (ptr, len) pairs pointing at the borrowed strings.
    let headers: Vec<RawList<u8>> = headers.iter().map(|h| borrow_str(h)).collect();
    unsafe {
        raw_fetch(
            method.as_ptr(),
            method.len(),
            url.as_ptr(),
            url.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
        )
    }
}
