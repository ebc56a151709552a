//! `oven:inferlet/forward`: the forward pass, next-token distributions, the fused path.

use crate::abi::RawList;

#[link(wasm_import_module = "oven:inferlet/forward@0.2.0")]
extern "C" {
    #[link_name = "forward"]
    fn raw_forward(
        q: u32,
        pages_ptr: *const u32,
        pages_len: usize,
        last_page_len: u32,
        inputs_ptr: *const u32,
        inputs_len: usize,
        output_indices_ptr: *const u32,
        output_indices_len: usize,
        outputs_ptr: *const u32,
        outputs_len: usize,
        mask_ptr: *const RawList<u8>,
        mask_len: usize,
        adapter: u32,
    ) -> u32;
    #[link_name = "get-next-dist"]
    fn raw_get_next_dist(q: u32, embed: u32, top_k: u32) -> u32;
    #[link_name = "forward-text"]
    fn raw_forward_text(
        q: u32,
        tokens_ptr: *const u32,
        tokens_len: usize,
        positions_ptr: *const u32,
        positions_len: usize,
        pages_ptr: *const u32,
        pages_len: usize,
        last_page_len: u32,
        output_indices_ptr: *const u32,
        output_indices_len: usize,
        top_k: u32,
        adapter: u32,
    ) -> u32;
}

/// Run `inputs` as the last tokens of the context in `pages` (`last_page_len` valid tokens in the
/// last page, inputs included); the hidden state of input `output_indices[j]` goes to
/// `outputs[j]`. `mask` is empty or one packed-bits row per input; `adapter` is 0 (the base
/// model) or an id from [`crate::adapters::open_adapter`] (take-unit).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    q: u32,
    pages: &[u32],
    last_page_len: u32,
    inputs: &[u32],
    output_indices: &[u32],
    outputs: &[u32],
    mask: &[Vec<u8>],
    adapter: u32,
) -> u32 {
    // list<list<u8>>: an array of (ptr, len) pairs pointing at the borrowed rows.
    let rows: Vec<RawList<u8>> = mask.iter().map(|row| RawList::borrow(row.as_slice())).collect();
    unsafe {
        raw_forward(
            q,
            pages.as_ptr(),
            pages.len(),
            last_page_len,
            inputs.as_ptr(),
            inputs.len(),
            output_indices.as_ptr(),
            output_indices.len(),
            outputs.as_ptr(),
            outputs.len(),
            rows.as_ptr(),
            rows.len(),
            adapter,
        )
    }
}

/// Top-`top_k` next-token distribution of an output embed; 0 = the server's default (take-dists).
pub fn get_next_dist(q: u32, embed: u32, top_k: u32) -> u32 {
    unsafe { raw_get_next_dist(q, embed, top_k) }
}

/// Fused fast path: tokens in, one distribution per output index out; `adapter` as for
/// [`forward`] (take-dists).
#[allow(clippy::too_many_arguments)]
pub fn forward_text(
    q: u32,
    tokens: &[u32],
    positions: &[u32],
    pages: &[u32],
    last_page_len: u32,
    output_indices: &[u32],
    top_k: u32,
    adapter: u32,
) -> u32 {
    unsafe {
        raw_forward_text(
            q,
            tokens.as_ptr(),
            tokens.len(),
            positions.as_ptr(),
            positions.len(),
            pages.as_ptr(),
            pages.len(),
            last_page_len,
            output_indices.as_ptr(),
            output_indices.len(),
            top_k,
            adapter,
        )
    }
}
