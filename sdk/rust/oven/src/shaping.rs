//! Shaping what a generation may draw: grammars (JSON Schema, regex, Lark, a choice of strings),
//! allowed-token sets, logit biases, penalties, and the model's log-probabilities per token.
//!
//! The server applies a [`Shape`] before each draw (WIT `forward-sample-shaped`); a grammar and the
//! penalties live there in a *decoder* that every drawn token advances, so a shaped generation stays
//! pipelined (one step in flight ahead). Log-probabilities are the model's own, before shaping. As
//! the Python SDK's `sdk/python/inferlet/shaping.py`, call for call.

use std::rc::Rc;

use oven_raw::forward::Shaping;
use oven_raw::futures::Sampled;
use oven_raw::grammars::{self as raw, GrammarKind};

const KINDS: [(&str, GrammarKind); 4] = [
    ("json-schema", GrammarKind::JsonSchema),
    ("regex", GrammarKind::Regex),
    ("lark", GrammarKind::Lark),
    ("choice", GrammarKind::Choice),
];

/// A grammar handle, dropped on the server with its last holder.
#[derive(Debug)]
struct GrammarHandle(u32);

impl Drop for GrammarHandle {
    fn drop(&mut self) {
        raw::drop_grammar(self.0);
    }
}

/// A grammar the server checked and compiled for its tokenizer. The constructors return the reason
/// (line and column for Lark) when it cannot be used. Clones share it; the last one dropped frees
/// it on the server (an instance holds at most 64; Python: `drop()`).
#[derive(Clone, Debug)]
pub struct Grammar {
    handle: Rc<GrammarHandle>,
    kind: GrammarKind,
}

impl Grammar {
    /// A grammar of `kind` ("json-schema", "regex", "lark" or "choice": a JSON array of strings).
    pub fn new(kind: &str, spec: &str) -> Result<Grammar, String> {
        let found = KINDS.iter().find(|(name, _)| *name == kind);
        let kind = match found {
            Some((_, kind)) => *kind,
            None => {
                let names: Vec<&str> = KINDS.iter().map(|(name, _)| *name).collect();
                return Err(format!("unknown grammar kind '{}' (one of {})", kind, names.join(", ")));
            }
        };
        let handle = raw::create_grammar(kind, spec)?;
        Ok(Grammar { handle: Rc::new(GrammarHandle(handle)), kind })
    }

    /// JSON text that validates against `schema` (its JSON text).
    pub fn json_schema(schema: &str) -> Result<Grammar, String> {
        Self::new("json-schema", schema)
    }

    /// Any JSON object (OpenAI's `json_object`).
    pub fn json() -> Result<Grammar, String> {
        Self::json_schema("{\"type\": \"object\"}") // json.dumps({"type": "object"}), as Python sends it
    }

    pub fn regex(pattern: &str) -> Result<Grammar, String> {
        Self::new("regex", pattern)
    }

    pub fn lark(grammar: &str) -> Result<Grammar, String> {
        Self::new("lark", grammar)
    }

    /// Exactly one of `options`.
    pub fn choice<S: AsRef<str>>(options: &[S]) -> Result<Grammar, String> {
        let items: Vec<String> = options.iter().map(|o| json_string(o.as_ref())).collect();
        Self::new("choice", &format!("[{}]", items.join(", ")))
    }

    /// The server's handle.
    pub fn handle(&self) -> u32 {
        self.handle.0
    }

    pub fn kind(&self) -> GrammarKind {
        self.kind
    }
}

/// `s` as Python's `json.dumps` writes it (ASCII only: other characters as `\uXXXX`, UTF-16), so
/// both SDKs send the server the same spec.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
        }
    }
    out.push('"');
    out
}

/// How each step's logits are changed before the draw, in this order: the biases (token -> added
/// logit; `f32::NEG_INFINITY` bans it), the penalties (OpenAI's presence and frequency over the
/// tokens this generation drew, vLLM's repetition over its inputs and draws), tokens outside the
/// allowed set (none given: all) and outside the grammar removed. With [`Shape::with_logprobs`]`(n)`,
/// n >= 0, each drawn token's log-probability and the n most probable are recorded
/// ([`Context::logprobs`](crate::Context::logprobs)).
///
/// ```ignore
/// let shape = Shape::new().with_grammar(&Grammar::regex(r"\d{3}")?).with_logprobs(3);
/// ```
#[derive(Clone, Debug)]
pub struct Shape {
    grammar: Option<Grammar>,
    allowed: Option<Vec<u32>>,
    bias: Vec<(u32, f32)>,
    presence_penalty: f64,
    frequency_penalty: f64,
    repetition_penalty: f64,
    logprobs: i32,
}

impl Default for Shape {
    fn default() -> Self {
        Self::new()
    }
}

impl Shape {
    /// Nothing changed: no grammar, every token allowed, no bias, no penalty, no log-probabilities.
    pub fn new() -> Self {
        Shape {
            grammar: None,
            allowed: None,
            bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: -1,
        }
    }

    pub fn with_grammar(mut self, grammar: &Grammar) -> Self {
        self.grammar = Some(grammar.clone());
        self
    }

    /// Only these tokens may be drawn.
    pub fn with_allowed(mut self, tokens: &[u32]) -> Self {
        self.allowed = Some(tokens.to_vec());
        self
    }

    /// Add `value` to token `token`'s logit (`f32::NEG_INFINITY` bans it); a token given again
    /// keeps its place and takes the new value (as a Python dict).
    pub fn with_bias(mut self, token: u32, value: f32) -> Self {
        set_bias(&mut self.bias, token, value);
        self
    }

    /// OpenAI's presence penalty, in [-2, 2].
    pub fn with_presence_penalty(mut self, penalty: f64) -> Self {
        self.presence_penalty = penalty;
        self
    }

    /// OpenAI's frequency penalty, in [-2, 2].
    pub fn with_frequency_penalty(mut self, penalty: f64) -> Self {
        self.frequency_penalty = penalty;
        self
    }

    /// vLLM's repetition penalty, > 0 (1: none).
    pub fn with_repetition_penalty(mut self, penalty: f64) -> Self {
        self.repetition_penalty = penalty;
        self
    }

    /// -1: no log-probabilities; n >= 0: each drawn token's and the n most probable (at most 64).
    pub fn with_logprobs(mut self, n: i32) -> Self {
        self.logprobs = n;
        self
    }

    pub fn grammar(&self) -> Option<&Grammar> {
        self.grammar.as_ref()
    }

    pub fn allowed(&self) -> Option<&[u32]> {
        self.allowed.as_deref()
    }

    pub fn bias(&self) -> &[(u32, f32)] {
        &self.bias
    }

    pub fn logprobs(&self) -> i32 {
        self.logprobs
    }

    /// Whether the server keeps state for it across steps (a grammar or a penalty): a decoder.
    pub fn needs_decoder(&self) -> bool {
        self.grammar.is_some()
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}

fn set_bias(bias: &mut Vec<(u32, f32)>, token: u32, value: f32) {
    match bias.iter_mut().find(|(t, _)| *t == token) {
        Some(entry) => entry.1 = value,
        None => bias.push((token, value)),
    }
}

/// numpy.packbits of the boolean row over the vocabulary that is 1 at `tokens`: the first token is
/// the high bit of byte 0.
fn pack_allowed(tokens: &[u32], vocab_size: u32) -> Result<Vec<u8>, String> {
    let mut bits = vec![0u8; (vocab_size as usize + 7) / 8];
    for &token in tokens {
        if token >= vocab_size {
            return Err(format!("allowed token {} is outside the vocabulary of {}", token, vocab_size));
        }
        bits[(token >> 3) as usize] |= 0x80 >> (token & 7);
    }
    Ok(bits)
}

/// A drawn token's log-probability under the model, and the `top` most probable (id, logprob).
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl From<Sampled> for Logprobs {
    fn from(sampled: Sampled) -> Self {
        Logprobs { token: sampled.token, logprob: sampled.logprob, top: sampled.top_ids.into_iter().zip(sampled.top_logprobs).collect() }
    }
}

/// The server's state for one shaped generation (its grammar's matcher, its penalty counts),
/// dropped there when this is.
pub(crate) struct Decoder(u32);

impl Decoder {
    pub(crate) fn new(shape: &Shape) -> Result<Decoder, String> {
        let grammar = shape.grammar.as_ref().map_or(0, Grammar::handle);
        let handle = raw::create_decoder(
            grammar,
            shape.presence_penalty as f32,
            shape.frequency_penalty as f32,
            shape.repetition_penalty as f32,
        )?;
        Ok(Decoder(handle))
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        raw::drop_decoder(self.0);
    }
}

/// A [`Shape`] as `forward-sample-shaped` takes it (WIT `shaping`), owned.
pub(crate) struct WitShaping {
    decoder: u32,
    allowed: Vec<u8>,
    bias_tokens: Vec<u32>,
    bias_values: Vec<f32>,
    logprobs: i32,
}

impl WitShaping {
    pub(crate) fn of(shape: &Shape, decoder: Option<&Decoder>, vocab_size: u32) -> Result<WitShaping, String> {
        let allowed = match &shape.allowed {
            Some(tokens) => pack_allowed(tokens, vocab_size)?,
            None => Vec::new(), // every token
        };
        Ok(WitShaping {
            decoder: decoder.map_or(0, |d| d.0),
            allowed,
            bias_tokens: shape.bias.iter().map(|(t, _)| *t).collect(),
            bias_values: shape.bias.iter().map(|(_, v)| *v).collect(),
            logprobs: shape.logprobs,
        })
    }

    pub(crate) fn raw(&self) -> Shaping<'_> {
        Shaping {
            decoder: self.decoder,
            allowed: &self.allowed,
            bias_tokens: &self.bias_tokens,
            bias_values: &self.bias_values,
            logprobs: self.logprobs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_written_as_python_writes_them() {
        assert_eq!(json_string("yes"), "\"yes\"");
        assert_eq!(json_string("a \"b\"\\\n\t\u{1}\u{7f}"), "\"a \\\"b\\\"\\\\\\n\\t\\u0001\\u007f\"");
        assert_eq!(json_string("café 😀"), "\"caf\\u00e9 \\ud83d\\ude00\"");
    }

    // (Shapes and grammars are not made here: dropping one calls the host.)

    #[test]
    fn a_bias_given_again_keeps_its_place() {
        let mut bias = Vec::new();
        set_bias(&mut bias, 5, 1.0);
        set_bias(&mut bias, 2, f32::NEG_INFINITY);
        set_bias(&mut bias, 5, 3.0);
        assert_eq!(bias, vec![(5, 3.0), (2, f32::NEG_INFINITY)]);
    }

    #[test]
    fn the_allowed_set_is_packed_high_bit_first() {
        assert_eq!(pack_allowed(&[0, 9, 17], 18), Ok(vec![0x80, 0x40, 0x40]));
        assert_eq!(pack_allowed(&[18], 18), Err("allowed token 18 is outside the vocabulary of 18".to_string()));
    }
}
