//! Asking an OpenAI stream for its usage on the client's behalf: a streamed chat completion says
//! its usage only when the request asks for it (`"stream_options": {"include_usage": true}`),
//! so a front end may ask for it ([`ask_for_stream_usage`]) and mark the response
//! ([`UsageAsked`]); the usage-only chunk the upstream adds then (`"choices": []` with `usage`)
//! is read as any other, and taken out of the stream the client gets ([`Unasked`]), which is
//! the stream it asked for.
//!
//! The stream is passed on event by event: an event is held until its blank line (a client acts
//! only on whole events anyway), up to [`MAX_EVENT_BYTES`]; a longer one is passed on as it
//! comes (it is not a usage chunk).

use super::MAX_EVENT_BYTES;

/// A response extension: the front end asked the upstream for the stream's usage the client did
/// not ask for; its usage-only chunk is taken out of what the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageAsked;

/// Whether a request to `path` may be asked for its stream's usage: OpenAI's chat completions and
/// (legacy) completions, as OpenAI-compatible servers (vLLM, LiteLLM, Azure's deployments)
/// serve them, at a path ending `/completions`. Other APIs refuse the option (Anthropic's
/// messages: "Extra inputs are not permitted"; OpenAI's Responses API: "Unknown parameter"), and
/// say their usage unasked.
#[must_use]
pub fn takes_stream_usage_option(path: &str) -> bool {
    path.trim_end_matches('/').ends_with("/completions")
}

/// `body`, a JSON request that asks for a stream (`"stream": true`) without its usage, with
/// `stream_options.include_usage` set (its other `stream_options` kept); `None` for any other
/// body (not JSON, not streamed, or asking for its usage already).
#[must_use]
pub fn ask_for_stream_usage(body: &[u8]) -> Option<Vec<u8>> {
    let mut request: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = request.as_object_mut()?;
    if object.get("stream") != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    let options = object.entry("stream_options").or_insert_with(|| serde_json::json!({}));
    if options.is_null() {
        *options = serde_json::json!({});
    }
    let options = options.as_object_mut()?;
    if options.get("include_usage") == Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&request).ok()
}

/// Takes the usage-only chunks out of a stream, event by event.
#[derive(Debug, Default)]
pub(crate) struct Unasked {
    /// The event being held (up to its blank line).
    held: Vec<u8>,
    /// The event went past the bound: passed on as it comes, to its blank line.
    passing: bool,
    /// The last byte ended a line (the stream's start counts as one).
    line_ended: bool,
    /// The last byte was a CR (a LF right after it ends no other line).
    after_cr: bool,
    /// The last whole event was taken out (the LF of its last CRLF goes with it).
    dropped: bool,
}

impl Unasked {
    pub(crate) fn new() -> Self {
        Unasked { line_ended: true, ..Unasked::default() }
    }

    /// What of `bytes`, the next piece of the stream, is passed on now.
    pub(crate) fn filter(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len());
        for &byte in bytes {
            let crlf = self.after_cr && byte == b'\n';
            self.after_cr = byte == b'\r';
            if crlf && self.held.is_empty() && !self.passing {
                // The end of the blank line of the event just passed on, or taken out.
                if !self.dropped {
                    out.push(byte);
                }
                continue;
            }
            if self.passing {
                out.push(byte);
            } else {
                self.held.push(byte);
            }
            if crlf {
                continue;
            }
            let ends_line = byte == b'\n' || byte == b'\r';
            if ends_line && self.line_ended {
                // A blank line: the event is whole.
                if self.passing {
                    self.passing = false;
                } else {
                    let event = std::mem::take(&mut self.held);
                    self.dropped = usage_only(&event);
                    if !self.dropped {
                        out.extend_from_slice(&event);
                    }
                }
            } else if !self.passing && self.held.len() > MAX_EVENT_BYTES {
                out.append(&mut self.held);
                self.passing = true;
            }
            self.line_ended = ends_line;
        }
        out
    }

    /// The stream ended: what is still held (an event cut short) is passed on.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

/// Whether `event` (its lines, up to its blank line) is a usage-only chunk: its data a JSON
/// object with `"choices": []` and a `usage` object.
fn usage_only(event: &[u8]) -> bool {
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        if let Some(value) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
        }
    }
    let Ok(chunk) = serde_json::from_slice::<serde_json::Value>(&data) else { return false };
    chunk.get("choices").and_then(serde_json::Value::as_array).is_some_and(Vec::is_empty)
        && chunk.get("usage").is_some_and(serde_json::Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_without_its_usage_is_asked_for_it() {
        let asked = ask_for_stream_usage(br#"{"model":"m","stream":true}"#).unwrap();
        let asked: serde_json::Value = serde_json::from_slice(&asked).unwrap();
        assert_eq!(asked, serde_json::json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}}));
        let kept = ask_for_stream_usage(br#"{"stream":true,"stream_options":{"x":1,"include_usage":false}}"#).unwrap();
        let kept: serde_json::Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(kept["stream_options"], serde_json::json!({"x": 1, "include_usage": true}));
        for body in [
            &br#"{"stream":true,"stream_options":{"include_usage":true}}"#[..],
            br#"{"stream":false}"#,
            br#"{"model":"m"}"#,
            br#"{"stream":true,"stream_options":3}"#,
            b"stream=true",
            br#"[{"stream":true}]"#,
        ] {
            assert_eq!(ask_for_stream_usage(body), None, "{}", String::from_utf8_lossy(body));
        }
    }

    /// What the client gets of `stream`, fed whole, split at every byte, and byte by byte: all
    /// the same.
    fn every_split(stream: &str) -> String {
        let run = |pieces: &[&[u8]]| {
            let mut unasked = Unasked::new();
            let mut out = Vec::new();
            for piece in pieces {
                out.extend(unasked.filter(piece));
            }
            out.extend(unasked.finish());
            String::from_utf8(out).unwrap()
        };
        let bytes = stream.as_bytes();
        let whole = run(&[bytes]);
        for at in 0..=bytes.len() {
            assert_eq!(run(&[&bytes[..at], &bytes[at..]]), whole, "split at byte {at}");
        }
        let pieces: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(run(&pieces), whole, "byte by byte");
        whole
    }

    #[test]
    fn the_usage_only_chunk_is_taken_out_and_nothing_else() {
        let chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        let usage = "data: {\"choices\":[],\"usage\":{\"total_tokens\":9}}\n\n";
        let done = "data: [DONE]\n\n";
        assert_eq!(every_split(&format!("{chunk}{usage}{done}")), format!("{chunk}{done}"));
        let crlf = format!("{chunk}{usage}{done}").replace('\n', "\r\n");
        assert_eq!(every_split(&crlf), format!("{chunk}{done}").replace('\n', "\r\n"));
        // A chunk with choices and usage, a comment, an event cut short: passed on.
        let kept = "data: {\"choices\":[{}],\"usage\":{\"total_tokens\":9}}\n\n: ping\n\ndata: {\"choices\":[],";
        assert_eq!(every_split(kept), kept);
    }

    #[test]
    fn an_event_over_the_bound_is_passed_on_as_it_comes() {
        let long = format!("data: {{\"choices\":[],\"usage\":{{}},\"pad\":\"{}\"}}\n\n", "x".repeat(MAX_EVENT_BYTES));
        let after = "data: [DONE]\n\n";
        let mut unasked = Unasked::new();
        let mut out = unasked.filter(long.as_bytes());
        assert_eq!(out.len(), long.len(), "passed on, not held");
        out.extend(unasked.filter(after.as_bytes()));
        assert_eq!(String::from_utf8(out).unwrap(), format!("{long}{after}"));
    }
}
