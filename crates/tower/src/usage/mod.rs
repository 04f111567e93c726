//! What a response says its request cost (LLM tokens), for rules whose `cost` is read from the
//! response (`cost = "response.usage.total_tokens"`, `"response.header.NAME"`; see
//! `tollgate_rules::usage`).
//!
//! The response's body is passed on unchanged, piece by piece as it comes ([`Metered`]), and
//! read on the way:
//! - `application/json` (OpenAI chat completions, Anthropic messages, not streamed): the body's
//!   top-level `usage` object, once the body is whole. The body is not kept: it is scanned as it
//!   passes ([`scan`]), and only the `usage` value is kept (up to [`MAX_USAGE_BYTES`]), so a
//!   body of any length is read.
//! - `text/event-stream` (streamed; see [`events`]): the last value of each field among the
//!   events' `usage` objects (or `message.usage`): OpenAI's last chunk before `data: [DONE]`
//!   (with `stream_options.include_usage`), Anthropic's `message_start` (`input_tokens`) and its
//!   cumulative `message_delta`s (`output_tokens`), the `response.usage` of the Responses API's
//!   last event (`response.completed`). An event past [`MAX_EVENT_BYTES`] is unread.
//!
//! The estimate a request reserves may be read from its JSON body ([`RequestValues`]). A front
//! end may ask an OpenAI chat completions stream for the usage its client did not ask for
//! ([`takes_stream_usage_option`], [`ask_for_stream_usage`], [`UsageAsked`]): the usage-only chunk is then taken out of what the client gets (see `asked`).
//!
//! The request's reservations are settled when the body ends (before the end is passed on: a
//! client that read the whole response sees its cost counted), or when the body is dropped
//! before (the client left mid-stream). A response not read whole (a stream that ended without
//! its last event, or with an event skipped past the bound) settles as cut short: each usage
//! field then settles at the larger of the last
//! count the stream gave and the estimate (nothing refunded: the rest might have said more), and
//! a stream that gave none (an OpenAI stream's usage comes last) keeps the estimate. A response
//! that does not say (another content type, no such field, a body over the bound, a header that
//! is not a number) keeps the estimate too, unless it is an error (a status of 400 or more: the
//! upstream used nothing, the estimate is given back). An encoded body (`Content-Encoding`) is
//! not read, and says nothing, not even that it used nothing: at least the estimate stays.

mod asked;
mod body;
pub mod events;
mod scan;

pub use asked::{UsageAsked, ask_for_stream_usage, takes_stream_usage_option};
pub use body::{MAX_READ_ON, MAX_READ_ON_BYTES, Metered};
pub use events::MAX_EVENT_BYTES;
pub use scan::MAX_USAGE_BYTES;
use tollgate_rules::RequestField;

/// The longest request body parsed for the rules' estimates: 1 MiB.
pub const MAX_JSON_BYTES: usize = 1 << 20;

/// Values read from a request's JSON body for the rules' estimates (`estimate =
/// "request.json.max_tokens"`): a front end that reads request bodies inserts it as a request
/// extension, and the middleware hands each value to the rules as the field's pseudo-header
/// ([`RequestField::pseudo_header`]). `tollgate proxy` does so; without it, such a rule reserves
/// its `estimate_default`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestValues(Vec<(String, Vec<u8>)>);

impl RequestValues {
    /// Reads `fields` from `body`, a JSON document of at most [`MAX_JSON_BYTES`] (a longer one,
    /// or one that is not JSON, gives nothing); each a non-negative integer, else not given.
    #[must_use]
    pub fn read(fields: &[RequestField], body: &[u8]) -> Self {
        if fields.is_empty() || body.len() > MAX_JSON_BYTES {
            return RequestValues::default();
        }
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) else { return RequestValues::default() };
        let values = fields
            .iter()
            .filter_map(|field| {
                let value = field.path.iter().try_fold(&json, |value, key| value.get(key))?.as_u64()?;
                Some((field.pseudo_header().to_string(), value.to_string().into_bytes()))
            })
            .collect();
        RequestValues(values)
    }

    /// Each field's pseudo-header and value.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.0.iter().map(|(name, value)| (name.as_str(), value.as_slice()))
    }
}

/// A request extension the middleware inserts before passing on a request whose response is
/// read for its cost (a rule's `cost = "response.…"`): a front end that forwards it should ask
/// the upstream for an unencoded response (`Accept-Encoding: identity`), as an encoded one is
/// not read (see [`Reader::readable`]). `tollgate proxy` does so.
/// A streamed request under a rule reading `usage` may be asked for it
/// ([`ask_for_stream_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadsResponse {
    /// A rule reads the response's `usage` object.
    pub usage: bool,
}

/// The most `usage` fields kept per response (the known formats have under ten).
const MAX_FIELDS: usize = 32;

/// The last value of each integer field of the `usage` objects a response gave.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    fields: Vec<(String, u64)>,
}

impl Usage {
    /// The last value `field` was given, if any.
    #[must_use]
    pub fn get(&self, field: &str) -> Option<u64> {
        self.fields.iter().find(|(f, _)| f == field).map(|&(_, v)| v)
    }

    /// Takes the integer fields of `value`'s `usage` object, of its `message.usage` (Anthropic's
    /// `message_start`) and of its `response.usage` (OpenAI's Responses API events), over those
    /// seen before.
    pub(crate) fn merge(&mut self, value: &serde_json::Value) {
        let nested = |outer: &str| value.get(outer).and_then(|m| m.get("usage"));
        for usage in [nested("message"), nested("response"), value.get("usage")].into_iter().flatten() {
            self.merge_usage(usage);
        }
    }

    /// Takes the integer fields of `usage`, a `usage` object, over those seen before.
    fn merge_usage(&mut self, usage: &serde_json::Value) {
        let Some(usage) = usage.as_object() else { return };
        for (field, v) in usage {
            let Some(v) = v.as_u64() else { continue };
            match self.fields.iter().position(|(f, _)| f == field) {
                Some(at) => self.fields[at].1 = v,
                None if self.fields.len() < MAX_FIELDS => self.fields.push((field.clone(), v)),
                None => {}
            }
        }
    }
}

/// How a body is read, by its content type.
#[derive(Debug)]
enum Format {
    /// A JSON body, scanned for its top-level `usage`.
    Json(scan::Scan),
    /// A stream of server-sent events.
    Events(events::Events),
    /// Anything else: not read.
    Other,
}

/// Reads a response body, piece by piece, for its usage.
#[derive(Debug)]
pub struct Reader {
    format: Format,
    usage: Usage,
    /// The body is encoded (gzip, br…): not read.
    encoded: bool,
}

impl Reader {
    /// A reader for a body of `content_type` (`application/json` or `…+json`,
    /// `text/event-stream`; anything else is not read).
    #[must_use]
    pub fn new(content_type: Option<&[u8]>) -> Self {
        let essence = content_type
            .and_then(|t| std::str::from_utf8(t).ok())
            .map(|t| t.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .unwrap_or_default();
        let format = if essence == "text/event-stream" {
            Format::Events(events::Events::default())
        } else if essence == "application/json" || essence.ends_with("+json") {
            Format::Json(scan::Scan::default())
        } else {
            Format::Other
        };
        Reader { format, usage: Usage::default(), encoded: false }
    }

    /// A reader for a body of `content_type` encoded as `content_encoding` says: one encoded
    /// otherwise than `identity` is not read, and says nothing of its usage (not even that it has
    /// none; see [`readable`](Self::readable)).
    #[must_use]
    pub fn encoded_as(content_type: Option<&[u8]>, content_encoding: Option<&[u8]>) -> Self {
        let encoded = content_encoding.is_some_and(|coding| {
            coding
                .split(|&b| b == b',')
                .any(|c| !c.trim_ascii().is_empty() && !c.trim_ascii().eq_ignore_ascii_case(b"identity"))
        });
        if encoded {
            return Reader { format: Format::Other, usage: Usage::default(), encoded: true };
        }
        Reader::new(content_type)
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        match &mut self.format {
            Format::Json(scan) => scan.feed(bytes),
            Format::Events(events) => events.feed(bytes, &mut self.usage),
            Format::Other => {}
        }
    }

    /// The body ended, or was dropped: a JSON body is read now (if it is whole JSON).
    pub fn finish(&mut self) {
        if let Format::Json(scan) = &self.format
            && let Some(usage) = scan.usage()
        {
            self.usage.merge_usage(&usage);
        }
    }

    /// Whether the response was read whole: a JSON body that parsed, or a stream whose last
    /// event (`[DONE]`, `message_stop`) was seen.
    #[must_use]
    pub fn whole(&self) -> bool {
        match &self.format {
            Format::Json(scan) => scan.closed && !scan.broken,
            Format::Events(events) => events.ended && !events.skipped,
            Format::Other => false,
        }
    }

    /// Whether the body could say its usage: not one encoded (`Content-Encoding`), which is
    /// passed on unread (what it says is unknown, not nothing).
    #[must_use]
    pub fn readable(&self) -> bool {
        !self.encoded
    }

    /// Whether the body is a stream of server-sent events.
    pub(crate) fn is_stream(&self) -> bool {
        matches!(self.format, Format::Events(_))
    }

    /// Whether reading more of the body may still tell its usage: a JSON body within its bound
    /// (a stream's events, or an unread body, tell nothing more once cut).
    pub(crate) fn reading(&self) -> bool {
        matches!(&self.format, Format::Json(scan) if !scan.closed && !scan.broken)
    }

    /// Whether the body is read only once whole (JSON, not streamed): one whose client left is
    /// worth reading on (see [`Metered`]).
    pub(crate) fn reads_whole_body(&self) -> bool {
        self.reading()
    }

    /// What the body said so far.
    #[must_use]
    pub fn usage(&self) -> &Usage {
        &self.usage
    }
}

#[cfg(test)]
mod tests;
