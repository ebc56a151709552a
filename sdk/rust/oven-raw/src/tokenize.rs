//! `oven:inferlet/tokenize`: the default model's tokenizer, answered without the GPU.

use crate::abi::{borrow_str, RawList, RetArea};

#[link(wasm_import_module = "oven:inferlet/tokenize@0.2.0")]
extern "C" {
    #[link_name = "tokenize"]
    fn raw_tokenize(text_ptr: *const u8, text_len: usize, ret: *mut u8);
    #[link_name = "detokenize"]
    fn raw_detokenize(tokens_ptr: *const u32, tokens_len: usize, ret: *mut u8);
    #[link_name = "vocab-size"]
    fn raw_vocab_size() -> u32;
    #[link_name = "stop-tokens"]
    fn raw_stop_tokens(ret: *mut u8);
    #[link_name = "render-chat"]
    fn raw_render_chat(
        roles_ptr: *const RawList<u8>,
        roles_len: usize,
        contents_ptr: *const RawList<u8>,
        contents_len: usize,
        add_generation_prompt: i32,
        ret: *mut u8,
    );
}

pub fn tokenize(text: &str) -> Vec<u32> {
    let mut ret = RetArea::new();
    unsafe {
        raw_tokenize(text.as_ptr(), text.len(), ret.ptr());
        ret.take_list(0)
    }
}

pub fn detokenize(tokens: &[u32]) -> String {
    let mut ret = RetArea::new();
    unsafe {
        raw_detokenize(tokens.as_ptr(), tokens.len(), ret.ptr());
        ret.take_string(0)
    }
}

pub fn vocab_size() -> u32 {
    unsafe { raw_vocab_size() }
}

/// End-of-sequence and end-of-turn tokens.
pub fn stop_tokens() -> Vec<u32> {
    let mut ret = RetArea::new();
    unsafe {
        raw_stop_tokens(ret.ptr());
        ret.take_list(0)
    }
}

/// The model's chat template over messages given as parallel role/content lists.
pub fn render_chat(roles: &[&str], contents: &[&str], add_generation_prompt: bool) -> String {
    let roles: Vec<RawList<u8>> = roles.iter().map(|s| borrow_str(s)).collect();
    let contents: Vec<RawList<u8>> = contents.iter().map(|s| borrow_str(s)).collect();
    let mut ret = RetArea::new();
    unsafe {
        raw_render_chat(
            roles.as_ptr(),
            roles.len(),
            contents.as_ptr(),
            contents.len(),
            add_generation_prompt as i32,
            ret.ptr(),
        );
        ret.take_string(0)
    }
}
