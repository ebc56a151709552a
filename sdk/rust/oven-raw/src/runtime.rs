//! `oven:inferlet/runtime`: the instance and its host.

use crate::abi::RetArea;

#[link(wasm_import_module = "oven:inferlet/runtime@0.2.0")]
extern "C" {
    #[link_name = "arguments"]
    fn raw_arguments(ret: *mut u8);
    #[link_name = "instance-id"]
    fn raw_instance_id(ret: *mut u8);
    #[link_name = "now-ms"]
    fn raw_now_ms() -> u64;
    #[link_name = "sleep"]
    fn raw_sleep(ms: u64) -> u32;
    #[link_name = "set-exit-code"]
    fn raw_set_exit_code(code: i32);
    #[link_name = "models"]
    fn raw_models(ret: *mut u8);
    #[link_name = "available-traits"]
    fn raw_available_traits(ret: *mut u8);
    #[link_name = "page-size"]
    fn raw_page_size() -> u32;
    #[link_name = "pause-hint"]
    fn raw_pause_hint(ms: u64);
}

/// Arguments given at launch.
pub fn arguments() -> Vec<String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_arguments(ret.ptr());
        ret.take_string_list(0)
    }
}

pub fn instance_id() -> String {
    let mut ret = RetArea::new();
    unsafe {
        raw_instance_id(ret.ptr());
        ret.take_string(0)
    }
}

/// Monotonic milliseconds.
pub fn now_ms() -> u64 {
    unsafe { raw_now_ms() }
}

/// A future that completes after `ms` milliseconds (take-unit).
pub fn sleep(ms: u64) -> u32 {
    unsafe { raw_sleep(ms) }
}

/// The status the instance exits with once `resume` returns no futures (default 0).
pub fn set_exit_code(code: i32) {
    unsafe { raw_set_exit_code(code) }
}

/// Names of the served models; the first is the default.
pub fn models() -> Vec<String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_models(ret.ptr());
        ret.take_string_list(0)
    }
}

/// Traits of the default model, e.g. "forward", "forward-text", "kvpage-host-tier".
pub fn available_traits() -> Vec<String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_available_traits(ret.ptr());
        ret.take_string_list(0)
    }
}

/// Tokens per KvPage.
pub fn page_size() -> u32 {
    unsafe { raw_page_size() }
}

/// The instance's next wait on I/O should last about `ms` milliseconds (the server's interception
/// policy weighs keeping, swapping or dropping its KV by it).
pub fn pause_hint(ms: u64) {
    unsafe { raw_pause_hint(ms) }
}
