//! `oven:inferlet/forward`: the forward pass, next-token distributions, the fused path, and the
//! decode step whose token the server draws (a token future).

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
    // Sixteen flat parameters: the canonical ABI's limit, so they are passed as they are. The enum
    // goes as its case index, f64 as f64, u64 as i64.
    #[link_name = "forward-sample"]
    fn raw_forward_sample(
        q: u32,
        tokens_ptr: *const u32,
        tokens_len: usize,
        input_futures_ptr: *const u32,
        input_futures_len: usize,
        positions_ptr: *const u32,
        positions_len: usize,
        pages_ptr: *const u32,
        pages_len: usize,
        last_page_len: u32,
        top_k: u32,
        adapter: u32,
        sampler: i32,
        temperature: f64,
        param: f64,
        rng_state: i64,
    ) -> u32;
}

/// The SDK samplers the server runs (WIT `sampler-kind`), bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SamplerKind {
    Greedy = 0,
    Temperature = 1,
    TopK = 2,
    TopP = 3,
    MinP = 4,
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

/// A decode step whose next token the server draws: `forward-text` with one output, the last
/// input, whose top-`top_k` distribution `sampler` draws from (`param`: top-k's k, top-p's or
/// min-p's p; `rng_state`: the sampler's SplitMix64 state before the draw). Returns a token future
/// (take-token). `input_futures` is empty or has one entry per token: 0 takes `tokens[i]`, else a
/// token future of this instance, pending or not, whose token replaces it.
#[allow(clippy::too_many_arguments)]
pub fn forward_sample(
    q: u32,
    tokens: &[u32],
    input_futures: &[u32],
    positions: &[u32],
    pages: &[u32],
    last_page_len: u32,
    top_k: u32,
    adapter: u32,
    sampler: SamplerKind,
    temperature: f64,
    param: f64,
    rng_state: u64,
) -> u32 {
    unsafe {
        raw_forward_sample(
            q,
            tokens.as_ptr(),
            tokens.len(),
            input_futures.as_ptr(),
            input_futures.len(),
            positions.as_ptr(),
            positions.len(),
            pages.as_ptr(),
            pages.len(),
            last_page_len,
            top_k,
            adapter,
            sampler as i32,
            temperature,
            param,
            rng_state as i64,
        )
    }
}
