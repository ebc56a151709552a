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
    // forward-sample's sixteen flat parameters plus the shaping record's eight: past the canonical
    // ABI's MAX_FLAT_PARAMS (16), so the parameters go in memory, laid out as a record of them
    // ([`SampleShapedParams`]), and the call takes one pointer to it.
    #[link_name = "forward-sample-shaped"]
    fn raw_forward_sample_shaped(params: *const SampleShapedParams) -> u32;
}

/// `forward-sample-shaped`'s parameters as the canonical ABI stores them in memory: each field at
/// its natural alignment (lists are `(ptr, len)` pairs, align 4; the enum is one byte; f64 and u64
/// align 8), so on wasm32: q 0, tokens 4, input-futures 12, positions 20, pages 28, last-page-len
/// 36, top-k 40, adapter 44, sampler 48, temperature 56, param 64, rng-state 72, and the shaping
/// record at 80 (decoder 80, allowed 84, bias-tokens 92, bias-values 100, logprobs 108); 112
/// bytes, align 8.
#[repr(C)]
struct SampleShapedParams {
    q: u32,
    tokens: RawList<u32>,
    input_futures: RawList<u32>,
    positions: RawList<u32>,
    pages: RawList<u32>,
    last_page_len: u32,
    top_k: u32,
    adapter: u32,
    sampler: u8,
    temperature: f64,
    param: f64,
    rng_state: u64,
    shaping: RawShaping,
}

/// The `shaping` record in memory: 32 bytes, align 4.
#[repr(C)]
struct RawShaping {
    decoder: u32,
    allowed: RawList<u8>,
    bias_tokens: RawList<u32>,
    bias_values: RawList<f32>,
    logprobs: i32,
}

#[cfg(target_arch = "wasm32")]
const _: () = {
    assert!(std::mem::size_of::<RawShaping>() == 32);
    assert!(std::mem::size_of::<SampleShapedParams>() == 112);
    assert!(std::mem::align_of::<SampleShapedParams>() == 8);
};

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

/// How `forward-sample-shaped` changes the logits before its draw (WIT `shaping`), in this order:
/// `bias_values[i]` added to token `bias_tokens[i]` (-inf bans it), the decoder's penalties, tokens
/// outside `allowed` and outside the decoder's grammar removed.
#[derive(Clone, Copy, Debug)]
pub struct Shaping<'a> {
    /// 0 or a decoder from [`crate::grammars::create_decoder`], advanced by the token drawn.
    pub decoder: u32,
    /// Empty: every token; else numpy.packbits of a boolean row over the vocabulary (the first
    /// token is the high bit of byte 0), 1 = may be drawn.
    pub allowed: &'a [u8],
    pub bias_tokens: &'a [u32],
    pub bias_values: &'a [f32],
    /// -1: no log-probabilities; n >= 0: the drawn token's and the n most probable (at most 64).
    pub logprobs: i32,
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

/// [`forward_sample`] with `shaping` applied before the draw. Returns a token future: take it with
/// [`crate::futures::take_sampled`] (the token and its log-probabilities) or
/// [`crate::futures::take_token`]. Pipelined steps under one decoder see each other's tokens in
/// order.
#[allow(clippy::too_many_arguments)]
pub fn forward_sample_shaped(
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
    shaping: &Shaping<'_>,
) -> u32 {
    let params = SampleShapedParams {
        q,
        tokens: RawList::borrow(tokens),
        input_futures: RawList::borrow(input_futures),
        positions: RawList::borrow(positions),
        pages: RawList::borrow(pages),
        last_page_len,
        top_k,
        adapter,
        sampler: sampler as u8,
        temperature,
        param,
        rng_state,
        shaping: RawShaping {
            decoder: shaping.decoder,
            allowed: RawList::borrow(shaping.allowed),
            bias_tokens: RawList::borrow(shaping.bias_tokens),
            bias_values: RawList::borrow(shaping.bias_values),
            logprobs: shaping.logprobs,
        },
    };
    // The host reads the parameters (and the lists they point at) during the call only.
    unsafe { raw_forward_sample_shaped(&params) }
}
