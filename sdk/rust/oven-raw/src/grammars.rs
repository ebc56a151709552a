//! `oven:inferlet/grammars`: grammars and decoders for constrained generation (llguidance on the
//! server).

use crate::abi::RetArea;

#[link(wasm_import_module = "oven:inferlet/grammars@0.2.0")]
extern "C" {
    // The enum goes as its case index; result<u32, string> through a return area.
    #[link_name = "create-grammar"]
    fn raw_create_grammar(kind: i32, spec_ptr: *const u8, spec_len: usize, ret: *mut u8);
    #[link_name = "drop-grammar"]
    fn raw_drop_grammar(grammar: u32);
    #[link_name = "create-decoder"]
    fn raw_create_decoder(grammar: u32, presence_penalty: f32, frequency_penalty: f32, repetition_penalty: f32, ret: *mut u8);
    #[link_name = "drop-decoder"]
    fn raw_drop_decoder(decoder: u32);
}

/// What a grammar's spec is (WIT `grammar-kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum GrammarKind {
    JsonSchema = 0,
    Regex = 1,
    Lark = 2,
    /// A JSON array of strings, one of which is generated verbatim.
    Choice = 3,
}

/// Check and compile `spec` for the served tokenizer; its handle, or what is wrong with it (line
/// and column for Lark). At most 64 grammars at once.
pub fn create_grammar(kind: GrammarKind, spec: &str) -> Result<u32, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_create_grammar(kind as i32, spec.as_ptr(), spec.len(), ret.ptr());
        ret.take_result(|r| r.u32_at(4))
    }
}

pub fn drop_grammar(grammar: u32) {
    unsafe { raw_drop_grammar(grammar) }
}

/// A decoder: the state the server keeps across one generation's steps: `grammar` (0 = none)
/// matched against every token drawn under it, and the presence and frequency penalties (in
/// [-2, 2]) and the repetition penalty (> 0; 1 = none). At most 256 at once.
pub fn create_decoder(grammar: u32, presence_penalty: f32, frequency_penalty: f32, repetition_penalty: f32) -> Result<u32, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_create_decoder(grammar, presence_penalty, frequency_penalty, repetition_penalty, ret.ptr());
        ret.take_result(|r| r.u32_at(4))
    }
}

pub fn drop_decoder(decoder: u32) {
    unsafe { raw_drop_decoder(decoder) }
}
