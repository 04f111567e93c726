//! A `text/event-stream` body read event by event (the WHATWG server-sent events grammar): lines
//! end with CRLF, LF or CR, `:` starts a comment, an event's `data:` lines join with `\n`, and a
//! blank line dispatches it. Each event's data is read for its `usage` (see [`Usage::merge`]),
//! and for the stream's end: OpenAI's `data: [DONE]`, Anthropic's `message_stop`, the Responses
//! API's `response.completed` (or `.incomplete`, `.failed`).
//!
//! Bounded: a line or an event's data past [`MAX_EVENT_BYTES`] is not kept (that event is not
//! read; the rest of the stream is, but its counts are no longer final: the skipped event may
//! have said more). An event cut short by the end of the body is not dispatched
//! (as the grammar says).

use super::Usage;

/// The longest event data (or line) kept for reading: 64 KiB. Usage events are a few hundred
/// bytes; a longer event is passed on unread.
pub const MAX_EVENT_BYTES: usize = 64 << 10;

/// The state of a stream read so far.
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// The line being read.
    line: Vec<u8>,
    /// Whether it went past the bound (then it is dropped, and its event not read).
    line_over: bool,
    /// The event's data so far, its lines joined by `\n` (each followed by one).
    data: Vec<u8>,
    /// Whether the event went past the bound.
    data_over: bool,
    /// The last byte was a CR: a LF right after it ends no other line.
    after_cr: bool,
    /// The stream's last event was seen (`[DONE]`, `message_stop`).
    pub(crate) ended: bool,
    /// An event went past the bound unread: it may have said a count, so those read are not
    /// final.
    pub(crate) skipped: bool,
}

impl Events {
    /// Reads `bytes`, the next piece of the stream, into `usage`.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], usage: &mut Usage) {
        if self.after_cr && !bytes.is_empty() {
            self.after_cr = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..];
            }
        }
        while let Some(at) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.keep(&bytes[..at]);
            self.end_line(usage);
            let crlf = bytes[at] == b'\r';
            bytes = &bytes[at + 1..];
            if crlf {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.keep(bytes);
    }

    /// Adds `part` to the line, within the bound.
    fn keep(&mut self, part: &[u8]) {
        if self.line_over || self.line.len() + part.len() > MAX_EVENT_BYTES {
            self.line_over = true;
            self.line.clear();
        } else {
            self.line.extend_from_slice(part);
        }
    }

    fn end_line(&mut self, usage: &mut Usage) {
        let line = std::mem::take(&mut self.line);
        if std::mem::take(&mut self.line_over) {
            self.data_over = true;
        } else if line.is_empty() {
            self.dispatch(usage);
        } else if line[0] != b':' {
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(colon) => {
                    let value = &line[colon + 1..];
                    (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
                }
                None => (&line[..], &b""[..]),
            };
            if field == b"data" {
                if self.data_over || self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                    self.data_over = true;
                    self.data.clear();
                } else {
                    self.data.extend_from_slice(value);
                    self.data.push(b'\n');
                }
            }
        }
        // The line's buffer is kept for the next one.
        self.line = line;
        self.line.clear();
    }

    /// The event is whole: its data read (unless it went past the bound).
    fn dispatch(&mut self, usage: &mut Usage) {
        let data = std::mem::take(&mut self.data);
        if std::mem::take(&mut self.data_over) {
            self.skipped = true;
        } else if !data.is_empty() {
            let data = &data[..data.len() - 1];
            if data == b"[DONE]" {
                self.ended = true;
            } else if contains(data, b"\"usage\"") || contains(data, b"message_stop") {
                // Only events that may say something are parsed (a token chunk is not).
                if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
                    usage.merge(&value);
                    self.ended |= value.get("type").and_then(serde_json::Value::as_str).is_some_and(is_last_event);
                }
            }
        }
        self.data = data;
        self.data.clear();
    }
}

/// The types of a stream's last event: Anthropic's `message_stop`; the Responses API's
/// `response.completed`, `response.incomplete` (cut by a token limit) and `response.failed`, each
/// carrying the response with its final usage (the Responses API sends no `[DONE]`).
fn is_last_event(kind: &str) -> bool {
    matches!(kind, "message_stop" | "response.completed" | "response.incomplete" | "response.failed")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
