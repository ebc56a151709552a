//! `oven:inferlet/children`: launch child instances, wait for them to end, cancel them.

use crate::abi::{borrow_str, RawList, RetArea};

#[link(wasm_import_module = "oven:inferlet/children@0.2.0")]
extern "C" {
    #[link_name = "launch"]
    fn raw_launch(program_ptr: *const u8, program_len: usize, args_ptr: *const RawList<u8>, args_len: usize,
                  ret: *mut u8);
    #[link_name = "wait-child"]
    fn raw_wait_child(child: u32) -> u32;
    #[link_name = "cancel-child"]
    fn raw_cancel_child(child: u32, ret: *mut u8);
}

/// Launch `program` (a name or a hash, as this instance's client would launch it) with `args`: the
/// child's handle, or why not.
pub fn launch(program: &str, args: &[&str]) -> Result<u32, String> {
    let args: Vec<RawList<u8>> = args.iter().map(|a| borrow_str(a)).collect();
    let mut ret = RetArea::new();
    unsafe {
        raw_launch(program.as_ptr(), program.len(), args.as_ptr(), args.len(), ret.ptr());
        ret.take_result(|r| r.u32_at(4))
    }
}

/// A future that completes when `child` has ended (take-exit).
pub fn wait_child(child: u32) -> u32 {
    unsafe { raw_wait_child(child) }
}

/// End `child` now; one that has ended already is left as it ended.
pub fn cancel_child(child: u32) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_cancel_child(child, ret.ptr());
        ret.take_result(|_| ())
    }
}
