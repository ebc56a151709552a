//! The served model: its tokenizer, chat template and capabilities (answered by the control
//! layer, no GPU involved).

use oven_raw::{runtime, tokenize as raw};

pub fn tokenize(text: &str) -> Vec<u32> {
    raw::tokenize(text)
}

pub fn detokenize(token_ids: &[u32]) -> String {
    raw::detokenize(token_ids)
}

/// End-of-sequence and end-of-turn tokens.
pub fn stop_tokens() -> Vec<u32> {
    raw::stop_tokens()
}

pub fn vocab_size() -> u32 {
    raw::vocab_size()
}

/// The model's chat template over messages given as parallel role/content lists.
pub fn render_chat(roles: &[&str], contents: &[&str], add_generation_prompt: bool) -> String {
    raw::render_chat(roles, contents, add_generation_prompt)
}

/// Names of the served models; the first is the default (the one this API drives).
pub fn models() -> Vec<String> {
    runtime::models()
}

/// Traits of the default model, e.g. "forward-text", "kvpage-host-tier".
pub fn available_traits() -> Vec<String> {
    runtime::available_traits()
}

/// Tokens per KvPage.
pub fn page_size() -> u32 {
    runtime::page_size()
}

/// The id of the server's LoRA adapter `name`, for [`Context::with_adapter`](crate::Context::with_adapter)
/// (0 is the base model), or why it cannot be used: an unknown name, a model without the
/// "lora-adapters" trait.
pub fn open_adapter(name: &str) -> Result<u32, String> {
    oven_raw::adapters::open_adapter(name)
}
