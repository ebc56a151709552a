//! `oven:inferlet/adapters`: LoRA adapters the server offers by name.

use crate::abi::RetArea;

#[link(wasm_import_module = "oven:inferlet/adapters@0.2.0")]
extern "C" {
    #[link_name = "open-adapter"]
    fn raw_open_adapter(name_ptr: *const u8, name_len: usize, ret: *mut u8);
}

/// The id of adapter `name` for the `adapter` argument of the forward calls (0 is the base
/// model), or why it cannot be used.
pub fn open_adapter(name: &str) -> Result<u32, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_open_adapter(name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|r| r.u32_at(4))
    }
}
