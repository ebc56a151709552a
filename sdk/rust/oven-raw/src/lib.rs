//! Raw bindings to the `oven:inferlet@0.2.0` world (`proto/wit/oven.wit`), written by hand.
//!
//! wit-bindgen is not available offline, so this crate spells out the component-model canonical
//! ABI itself: one module per WIT interface, each an `extern "C"` block with the flattened core
//! signature plus a safe wrapper that owns the lowering and lifting. The rules used throughout:
//!
//! * `list<T>` / `string` parameters flatten to `(ptr, len)`; the guest keeps ownership.
//! * A result that flattens to more than one core value is written by the host to a return area
//!   whose pointer the guest passes as the last parameter ([`abi::RetArea`]).
//! * Lists and strings the host returns are copied into guest memory through [`cabi_realloc`];
//!   the guest then owns them and frees them with the same layout (see [`abi::RawList`]).
//! * `result<T, string>` in memory: a discriminant byte at 0 (0 = ok), the payload at offset 4
//!   (the payload's alignment is 4 for every result in this world).
//! * A function whose parameters flatten to more than 16 core values (MAX_FLAT_PARAMS) takes one
//!   pointer to them stored as a record in memory (`forward::forward_sample_shaped`).
//!
//! The module is built for `wasm32-unknown-unknown`, where pointers and `usize` are 32-bit and
//! so match the ABI's `i32`. It also compiles (but is meaningless) on other targets.
//!
//! An inferlet exports `start`/`resume` with [`export_inferlet!`].

pub mod abi;
pub mod adapters;
pub mod children;
pub mod embeds;
pub mod forward;
pub mod futures;
pub mod grammars;
pub mod http;
pub mod kvpages;
pub mod messaging;
pub mod queues;
pub mod runtime;
pub mod tokenize;

pub use abi::cabi_realloc;

/// Export the world's `start` and `resume` (plus their post-return hooks) from two functions:
/// `$start: fn() -> Vec<u32>` and `$resume: fn(Vec<u32>) -> Vec<u32>`, each returning the futures
/// to wait on next (empty: finished).
///
/// ```ignore
/// oven_raw::export_inferlet!(my_start, my_resume);
/// ```
#[macro_export]
macro_rules! export_inferlet {
    ($start:path, $resume:path) => {
        // export_name keeps the Rust names out of the caller's namespace, so the caller's own
        // functions may be called `start` and `resume`.
        #[export_name = "start"]
        pub extern "C" fn __oven_export_start() -> *mut u8 {
            let waiting: ::std::vec::Vec<u32> = $start();
            $crate::abi::return_list_u32(waiting)
        }

        #[export_name = "resume"]
        pub unsafe extern "C" fn __oven_export_resume(ready_ptr: *mut u32, ready_len: usize) -> *mut u8 {
            let ready = $crate::abi::RawList { ptr: ready_ptr, len: ready_len }.into_vec();
            let waiting: ::std::vec::Vec<u32> = $resume(ready);
            $crate::abi::return_list_u32(waiting)
        }

        #[export_name = "cabi_post_start"]
        pub unsafe extern "C" fn __oven_post_start(ret: *mut u8) {
            $crate::abi::free_returned_list_u32(ret)
        }

        #[export_name = "cabi_post_resume"]
        pub unsafe extern "C" fn __oven_post_resume(ret: *mut u8) {
            $crate::abi::free_returned_list_u32(ret)
        }
    };
}
