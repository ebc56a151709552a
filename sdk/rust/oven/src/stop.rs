//! [`Stop`]: when generation ends — a token budget, stop tokens (the model's end-of-sequence and
//! end-of-turn tokens with [`Stop::with_eos`]) and stop strings.

use crate::model;

/// Generation ends at the first condition met. A stop token is kept in the generated tokens; a
/// stop string ends generation once the detokenized output contains it (the text is cut before
/// it by [`crate::Context::generate`]).
#[derive(Clone, Debug)]
pub struct Stop {
    max_tokens: usize,
    token_ids: Vec<u32>,
    strings: Vec<String>,
}

impl Stop {
    /// At most `max_tokens` new tokens, no other condition.
    pub fn max_tokens(max_tokens: usize) -> Self {
        Stop { max_tokens, token_ids: Vec::new(), strings: Vec::new() }
    }

    /// Also stop at the model's end-of-sequence and end-of-turn tokens (`tokenize.stop-tokens`).
    pub fn with_eos(self) -> Self {
        let eos = model::stop_tokens();
        self.with_tokens(&eos)
    }

    /// Also stop at any of `token_ids`.
    pub fn with_tokens(mut self, token_ids: &[u32]) -> Self {
        self.token_ids.extend_from_slice(token_ids);
        self
    }

    /// Also stop once the output contains `text` (ignored if empty).
    pub fn with_string(mut self, text: &str) -> Self {
        if !text.is_empty() {
            self.strings.push(text.to_string());
        }
        self
    }

    pub fn max_new_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// True if `token` is a stop token.
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.token_ids.contains(&token)
    }

    /// The byte offset in `text` where the earliest stop string begins, if any.
    pub fn find_string(&self, text: &str) -> Option<usize> {
        self.strings.iter().filter_map(|s| text.find(s.as_str())).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_accumulate() {
        let stop = Stop::max_tokens(8).with_tokens(&[2, 3]).with_string("\n\n").with_string("END").with_string("");
        assert_eq!(stop.max_new_tokens(), 8);
        assert!(stop.is_stop_token(3) && !stop.is_stop_token(4));
        assert_eq!(stop.strings().len(), 2);
        assert_eq!(stop.find_string("abc END x\n\n"), Some(4));
        assert_eq!(stop.find_string("abc"), None);
    }
}
