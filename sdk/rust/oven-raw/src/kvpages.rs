//! `oven:inferlet/kvpages`: the paged KV cache (handles are this instance's own).

use crate::abi::RetArea;

#[link(wasm_import_module = "oven:inferlet/kvpages@0.2.0")]
extern "C" {
    #[link_name = "alloc-kvpages"]
    fn raw_alloc_kvpages(q: u32, count: u32) -> u32;
    #[link_name = "dealloc-kvpages"]
    fn raw_dealloc_kvpages(q: u32, pages_ptr: *const u32, pages_len: usize) -> u32;
    #[link_name = "copy-kvpage"]
    fn raw_copy_kvpage(q: u32, src: u32, dst: u32, src_offset: u32, dst_offset: u32, count: u32) -> u32;
    #[link_name = "mask-kvpage"]
    fn raw_mask_kvpage(q: u32, page: u32, masked_ptr: *const bool, masked_len: usize) -> u32;
    #[link_name = "offload-kvpages"]
    fn raw_offload_kvpages(q: u32, pages_ptr: *const u32, pages_len: usize) -> u32;
    #[link_name = "restore-kvpages"]
    fn raw_restore_kvpages(q: u32, pages_ptr: *const u32, pages_len: usize) -> u32;
    #[link_name = "export-kvpages"]
    fn raw_export_kvpages(pages_ptr: *const u32, pages_len: usize, name_ptr: *const u8, name_len: usize, ret: *mut u8);
    #[link_name = "import-kvpages"]
    fn raw_import_kvpages(name_ptr: *const u8, name_len: usize, ret: *mut u8);
    #[link_name = "release-export"]
    fn raw_release_export(name_ptr: *const u8, name_len: usize, ret: *mut u8);
    #[link_name = "save-snapshot"]
    fn raw_save_snapshot(
        pages_ptr: *const u32,
        pages_len: usize,
        tokens_ptr: *const u32,
        tokens_len: usize,
        name_ptr: *const u8,
        name_len: usize,
        ret: *mut u8,
    );
    #[link_name = "open-snapshot"]
    fn raw_open_snapshot(name_ptr: *const u8, name_len: usize, ret: *mut u8);
    #[link_name = "snapshot-tokens"]
    fn raw_snapshot_tokens(name_ptr: *const u8, name_len: usize, ret: *mut u8);
    #[link_name = "match-snapshot"]
    fn raw_match_snapshot(tokens_ptr: *const u32, tokens_len: usize, ret: *mut u8);
    #[link_name = "drop-snapshot"]
    fn raw_drop_snapshot(name_ptr: *const u8, name_len: usize, ret: *mut u8);
    #[link_name = "set-recomputable"]
    fn raw_set_recomputable(pages_ptr: *const u32, pages_len: usize, recomputable: i32, ret: *mut u8);
    #[link_name = "restore-discarded"]
    fn raw_restore_discarded(pages_ptr: *const u32, pages_len: usize, ret: *mut u8);
}

/// A future for `count` new pages (take-handles).
pub fn alloc_kvpages(q: u32, count: u32) -> u32 {
    unsafe { raw_alloc_kvpages(q, count) }
}

/// Frees pages once the calls issued on `q` before it are done (take-unit).
pub fn dealloc_kvpages(q: u32, pages: &[u32]) -> u32 {
    unsafe { raw_dealloc_kvpages(q, pages.as_ptr(), pages.len()) }
}

/// Copy K/V and mask bits of `count` token slots (take-unit).
pub fn copy_kvpage(q: u32, src: u32, dst: u32, src_offset: u32, dst_offset: u32, count: u32) -> u32 {
    unsafe { raw_copy_kvpage(q, src, dst, src_offset, dst_offset, count) }
}

/// `masked[i]` hides token slot i of `page` from later forwards (take-unit).
/// A Rust `bool` is one byte holding 0 or 1: the ABI's `list<bool>` element exactly.
pub fn mask_kvpage(q: u32, page: u32, masked: &[bool]) -> u32 {
    unsafe { raw_mask_kvpage(q, page, masked.as_ptr(), masked.len()) }
}

/// Move pages to the host tier; their handles stay valid (take-unit).
pub fn offload_kvpages(q: u32, pages: &[u32]) -> u32 {
    unsafe { raw_offload_kvpages(q, pages.as_ptr(), pages.len()) }
}

/// Bring offloaded pages back (take-unit).
pub fn restore_kvpages(q: u32, pages: &[u32]) -> u32 {
    unsafe { raw_restore_kvpages(q, pages.as_ptr(), pages.len()) }
}

/// Share pages under a server-wide name; they live until released.
pub fn export_kvpages(pages: &[u32], name: &str) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_export_kvpages(pages.as_ptr(), pages.len(), name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|_| ())
    }
}

/// Handles in this instance for the pages exported under `name`.
pub fn import_kvpages(name: &str) -> Result<Vec<u32>, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_import_kvpages(name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|r| r.take_list(4))
    }
}

pub fn release_export(name: &str) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_release_export(name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|_| ())
    }
}

/// Keep `pages` holding `tokens` as this client's snapshot `name` (read-only from then on).
pub fn save_snapshot(pages: &[u32], tokens: &[u32], name: &str) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        let (pages_ptr, tokens_ptr, name_ptr) = (pages.as_ptr(), tokens.as_ptr(), name.as_ptr());
        raw_save_snapshot(pages_ptr, pages.len(), tokens_ptr, tokens.len(), name_ptr, name.len(), ret.ptr());
        ret.take_result(|_| ())
    }
}

/// Handles in this instance on the (read-only) pages of this client's snapshot `name`.
pub fn open_snapshot(name: &str) -> Result<Vec<u32>, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_open_snapshot(name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|r| r.take_list(4))
    }
}

/// The token ids this client's snapshot `name` holds.
pub fn snapshot_tokens(name: &str) -> Result<Vec<u32>, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_snapshot_tokens(name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|r| r.take_list(4))
    }
}

/// The name of this client's snapshot sharing the longest prefix with `tokens`, or "" for none.
pub fn match_snapshot(tokens: &[u32]) -> String {
    let mut ret = RetArea::new();
    unsafe {
        raw_match_snapshot(tokens.as_ptr(), tokens.len(), ret.ptr());
        ret.take_string(0)
    }
}

/// Drop this client's snapshot `name`; its pages are freed once no instance holds them.
pub fn drop_snapshot(name: &str) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_drop_snapshot(name.as_ptr(), name.len(), ret.ptr());
        ret.take_result(|_| ())
    }
}

/// Whether this instance can rewrite the K/V of `pages` from its own tokens (default: no); the
/// interception policy may discard the K/V of recomputable pages while the instance waits on I/O.
pub fn set_recomputable(pages: &[u32], recomputable: bool) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_set_recomputable(pages.as_ptr(), pages.len(), recomputable as i32, ret.ptr());
        ret.take_result(|_| ())
    }
}

/// This instance rewrites `pages` now: those among them whose K/V was discarded, which may be
/// forwarded into again.
pub fn restore_discarded(pages: &[u32]) -> Result<Vec<u32>, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_restore_discarded(pages.as_ptr(), pages.len(), ret.ptr());
        ret.take_result(|r| r.take_list(4))
    }
}
