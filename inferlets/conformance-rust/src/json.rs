//! Just enough JSON writing for the scenario reports (the crate has no dependencies).

use std::fmt::Display;

use oven::Distribution;

/// `s` as a JSON string.
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Numbers as a JSON array.
pub fn ints<T: Display>(values: &[T]) -> String {
    list(values.iter().map(|v| v.to_string()))
}

/// JSON values as a JSON array.
pub fn list<I: Iterator<Item = String>>(items: I) -> String {
    format!("[{}]", items.collect::<Vec<_>>().join(","))
}

/// Named JSON values as a JSON object.
pub fn object(fields: &[(&str, String)]) -> String {
    let fields: Vec<String> = fields.iter().map(|(name, value)| format!("{}:{}", text(name), value)).collect();
    format!("{{{}}}", fields.join(","))
}

/// A distribution as `{"token_ids": [...], "probs": [...]}` (each f32 written as the f64 it equals).
pub fn dist(d: &Distribution) -> String {
    let probs: Vec<f64> = d.probs.iter().map(|p| *p as f64).collect();
    object(&[("token_ids", ints(&d.token_ids)), ("probs", ints(&probs))])
}
