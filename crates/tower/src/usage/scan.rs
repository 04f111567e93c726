//! A JSON body read piece by piece for the value of its top-level `"usage"` key, without keeping
//! the body: a completion may be any length (many choices, logprobs), its `usage` is a few
//! hundred bytes. The scanner follows only the structure (nesting, strings and their escapes),
//! keeps the raw bytes of each top-level key (bounded, decoded as JSON when it ends) and of the
//! value that follows a key `usage` (bounded by [`MAX_USAGE_BYTES`]); the last such value wins,
//! as a JSON parser's map would have it. The value is parsed only once the top-level object has
//! closed.
//!
//! What is not an object at the top level, or closes more than it opened, is not read.

/// The longest `usage` value kept: 64 KiB (a usage object is a few hundred bytes).
pub const MAX_USAGE_BYTES: usize = 64 << 10;

/// The longest top-level key kept for comparing with `usage` (even spelled all in `\uXXXX`
/// escapes, `usage` is 30 bytes).
const MAX_KEY_BYTES: usize = 64;

/// The state of a JSON body scanned so far.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// How deep in objects and arrays the scanner is (1: in the top-level object).
    depth: usize,
    /// Inside a string, and right after a backslash in it.
    in_string: bool,
    escaped: bool,
    /// In the top-level object, the next string is a key.
    expect_key: bool,
    /// The raw bytes of the top-level key being read (one byte past the bound: too long).
    key: Option<Vec<u8>>,
    /// The last top-level key read was `usage`: its value comes after the `:`.
    usage_next: bool,
    /// The raw bytes of the `usage` value being read, and whether it went past the bound.
    value: Option<Vec<u8>>,
    value_over: bool,
    /// The last whole `usage` value.
    usage: Option<Vec<u8>>,
    /// The top-level object closed.
    pub(crate) closed: bool,
    /// Not a JSON object: nothing is read.
    pub(crate) broken: bool,
}

impl Scan {
    /// Reads `bytes`, the next piece of the body.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.broken {
                return;
            }
            self.byte(byte);
        }
    }

    fn byte(&mut self, byte: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
                if let Some(key) = self.key.take() {
                    self.usage_next = is_usage(&key);
                }
                self.keep(byte);
                return;
            }
            if let Some(key) = &mut self.key
                && key.len() <= MAX_KEY_BYTES
            {
                key.push(byte);
            }
            self.keep(byte);
            return;
        }
        if self.closed || self.depth == 0 {
            // Before the top-level object only whitespace, and after it too.
            match byte {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                b'{' if !self.closed => {
                    self.depth = 1;
                    self.expect_key = true;
                }
                _ => self.broken = true,
            }
            return;
        }
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key = Some(Vec::new());
                }
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' if self.depth == 1 => {
                self.end_value();
                self.depth = 0;
                self.closed = true;
                return;
            }
            b'}' | b']' => self.depth -= 1,
            b',' if self.depth == 1 => {
                self.end_value();
                self.expect_key = true;
                return;
            }
            b':' if self.depth == 1 => {
                self.expect_key = false;
                if std::mem::take(&mut self.usage_next) {
                    self.value = Some(Vec::new());
                    return;
                }
            }
            _ => {}
        }
        self.keep(byte);
    }

    /// Adds `byte` to the `usage` value being read, within the bound.
    fn keep(&mut self, byte: u8) {
        if let Some(value) = &mut self.value {
            if value.len() < MAX_USAGE_BYTES {
                value.push(byte);
            } else {
                self.value_over = true;
            }
        }
    }

    /// A top-level value ended: if it was `usage`'s (within the bound), it is the last one.
    fn end_value(&mut self) {
        if let Some(value) = self.value.take()
            && !std::mem::take(&mut self.value_over)
        {
            self.usage = Some(value);
        }
    }

    /// The top-level `usage` value, once the object has closed (and if it is JSON).
    pub(crate) fn usage(&self) -> Option<serde_json::Value> {
        if !self.closed || self.broken {
            return None;
        }
        serde_json::from_slice(self.usage.as_deref()?).ok()
    }
}

/// Whether `raw`, a key's bytes between its quotes, is `usage` once its escapes are read.
fn is_usage(raw: &[u8]) -> bool {
    if raw.len() > MAX_KEY_BYTES {
        return false;
    }
    if raw == b"usage" {
        return true;
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice::<String>(&quoted).is_ok_and(|key| key == "usage")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `usage` `body` says, fed whole, split in two at every byte, and byte by byte: all
    /// the same.
    fn every_split(body: &str) -> Option<serde_json::Value> {
        let scan = |pieces: &[&[u8]]| {
            let mut scan = Scan::default();
            for piece in pieces {
                scan.feed(piece);
            }
            scan.usage()
        };
        let bytes = body.as_bytes();
        let whole = scan(&[bytes]);
        for at in 0..=bytes.len() {
            assert_eq!(scan(&[&bytes[..at], &bytes[at..]]), whole, "split at byte {at}");
        }
        let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(scan(&pieces), whole, "byte by byte");
        whole
    }

    #[test]
    fn the_top_level_usage_is_read_wherever_it_is() {
        let body = r#" {"id":"c","usage":{"total_tokens":21},"choices":[{"usage":{"total_tokens":1}}]} "#;
        assert_eq!(every_split(body), Some(serde_json::json!({"total_tokens": 21})));
        let last = r#"{"choices":[],"usage" : {"a":[1,{"b":"}]"}]}, "x":1}"#;
        assert_eq!(every_split(last), Some(serde_json::json!({"a": [1, {"b": "}]"}]})));
    }

    #[test]
    fn strings_and_escapes_hide_nothing_and_fake_nothing() {
        // A content that spells a usage key is content.
        let body = r#"{"content":"\"usage\":{\"total_tokens\":1}, \\","usage":{"total_tokens":9}}"#;
        assert_eq!(every_split(body), Some(serde_json::json!({"total_tokens": 9})));
        let only_content = r#"{"content":"\",\"usage\":{\"total_tokens\":1}}"}"#;
        assert_eq!(every_split(only_content), None);
        // An escaped key is the key it decodes to.
        let escaped = r#"{"us\u0061ge":{"total_tokens":7}}"#;
        assert_eq!(every_split(escaped), Some(serde_json::json!({"total_tokens": 7})));
        // The last of two wins, as in a parsed map.
        let twice = r#"{"usage":{"total_tokens":1},"usage":{"total_tokens":2}}"#;
        assert_eq!(every_split(twice), Some(serde_json::json!({"total_tokens": 2})));
    }

    #[test]
    fn a_long_body_is_read_and_a_long_usage_is_not() {
        let content = "word ".repeat(400_000);
        let long = format!(r#"{{"choices":[{{"content":"{content}"}}],"usage":{{"total_tokens":900}}}}"#);
        let mut scan = Scan::default();
        for piece in long.as_bytes().chunks(8192) {
            scan.feed(piece);
        }
        assert_eq!(scan.usage(), Some(serde_json::json!({"total_tokens": 900})));
        let padded = format!(r#"{{"usage":{{"total_tokens":900,"pad":"{}"}}}}"#, "x".repeat(MAX_USAGE_BYTES));
        let mut scan = Scan::default();
        scan.feed(padded.as_bytes());
        assert_eq!((scan.usage(), scan.closed), (None, true));
    }

    #[test]
    fn what_is_not_an_object_or_not_closed_says_nothing() {
        for body in [
            r#"[{"usage":{"total_tokens":1}}]"#,
            r#"x{"usage":{"total_tokens":1}}"#,
            r#"{"usage":{"total_tokens":1}}}"#,
            r#"{"usage":{"total_tokens":1}} {"#,
            r#"{"usage":{"total_tokens":1}"#,
            r#"{"usage":{"total_tokens":1},"#,
            r#"{"usage":nope}"#,
        ] {
            assert_eq!(every_split(body), None, "{body}");
        }
    }
}
