//! `oven:inferlet/embeds`: token embeddings (input) and hidden states (output), one per handle.

#[link(wasm_import_module = "oven:inferlet/embeds@0.2.0")]
extern "C" {
    #[link_name = "alloc-embeds"]
    fn raw_alloc_embeds(q: u32, count: u32) -> u32;
    #[link_name = "dealloc-embeds"]
    fn raw_dealloc_embeds(q: u32, embeds_ptr: *const u32, embeds_len: usize) -> u32;
    #[link_name = "embed-text"]
    fn raw_embed_text(
        q: u32,
        tokens_ptr: *const u32,
        tokens_len: usize,
        positions_ptr: *const u32,
        positions_len: usize,
        embeds_ptr: *const u32,
        embeds_len: usize,
    ) -> u32;
}

/// A future for `count` new embeds (take-handles).
pub fn alloc_embeds(q: u32, count: u32) -> u32 {
    unsafe { raw_alloc_embeds(q, count) }
}

/// Frees embeds once the calls issued on `q` before it are done (take-unit).
pub fn dealloc_embeds(q: u32, embeds: &[u32]) -> u32 {
    unsafe { raw_dealloc_embeds(q, embeds.as_ptr(), embeds.len()) }
}

/// Embed `tokens[i]` at `positions[i]` into `embeds[i]` (take-unit).
pub fn embed_text(q: u32, tokens: &[u32], positions: &[u32], embeds: &[u32]) -> u32 {
    unsafe {
        raw_embed_text(
            q,
            tokens.as_ptr(),
            tokens.len(),
            positions.as_ptr(),
            positions.len(),
            embeds.as_ptr(),
            embeds.len(),
        )
    }
}
