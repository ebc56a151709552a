//! [`Stop`]: when generation ends — a token budget, the model's end tokens, stop strings.

use crate::model;

/// Generation ends at the first condition met: `max_tokens` new tokens, one of the model's
/// end-of-sequence / end-of-turn tokens (unless [`Stop::without_eos`]) or of the extra stop
/// tokens, or a stop string in the detokenized output. A stop token is kept in the generated
/// tokens; [`crate::Context::generate`]'s text leaves stop tokens out and is cut before the earliest
/// stop string. Like the Python SDK's `Stop(max_tokens=256, eos=True, strings=(), tokens=())`.
#[derive(Clone, Debug)]
pub struct Stop {
    max_tokens: usize,
    eos: bool,
    token_ids: Vec<u32>,
    strings: Vec<String>,
}

impl Default for Stop {
    /// 256 tokens or an end token.
    fn default() -> Self {
        Stop::max_tokens(256)
    }
}

impl Stop {
    /// At most `max_tokens` new tokens, or an end token of the model.
    pub fn max_tokens(max_tokens: usize) -> Self {
        Stop { max_tokens, eos: true, token_ids: Vec::new(), strings: Vec::new() }
    }

    /// Stop at the model's end tokens (the default).
    pub fn with_eos(mut self) -> Self {
        self.eos = true;
        self
    }

    /// Do not stop at the model's end tokens.
    pub fn without_eos(mut self) -> Self {
        self.eos = false;
        self
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

    pub fn eos(&self) -> bool {
        self.eos
    }

    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// The extra stop tokens (not the model's end tokens).
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    /// Every stop token: the extra ones, and the model's end tokens if `eos` (a host call).
    pub fn stop_token_ids(&self) -> Vec<u32> {
        let mut ids = self.token_ids.clone();
        if self.eos {
            ids.extend(model::stop_tokens());
        }
        ids
    }

    /// How many of the newest tokens a stop string that has just appeared lies within (a token is
    /// at least one character): the longest stop string's length in characters, plus one.
    pub fn tail_tokens(&self) -> usize {
        self.strings.iter().map(|s| s.chars().count()).max().unwrap_or(0) + 1
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
        let stop = Stop::max_tokens(8).without_eos().with_tokens(&[2, 3]).with_string("\n\n").with_string("END");
        assert_eq!(stop.max_new_tokens(), 8);
        assert!(!stop.eos());
        assert_eq!(stop.token_ids(), &[2, 3]);
        assert_eq!(stop.tail_tokens(), 4);
        assert_eq!(stop.with_string("").strings().len(), 2);
        assert!(Stop::default().eos() && Stop::default().max_new_tokens() == 256);
        assert_eq!(Stop::max_tokens(1).with_string("né").tail_tokens(), 3); // characters, not bytes
    }

    #[test]
    fn the_earliest_stop_string_wins() {
        let stop = Stop::max_tokens(8).with_string("\n\n").with_string("END");
        assert_eq!(stop.find_string("abc END x\n\n"), Some(4));
        assert_eq!(stop.find_string("abc"), None);
    }
}
