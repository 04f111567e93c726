//! Costs known only from the response (LLM tokens): a rule whose `cost` names where the response
//! says what the request cost, and the `estimate` it reserves meanwhile.
//!
//! ```toml
//! [[rules]]
//! name = "output-tokens"
//! limit = "100000/1m"
//! key = ["header:authorization"]
//! cost = "response.usage.completion_tokens"  # or response.header.NAME
//! estimate = 1000                            # reserved when the request is admitted
//! ```
//!
//! - `response.usage.FIELD`: the field `FIELD` (letters, digits, `_`) of the response's `usage`
//!   object: of a JSON body, its top-level `usage` (OpenAI chat completions:
//!   `prompt_tokens`, `completion_tokens`, `total_tokens`; Anthropic messages: `input_tokens`,
//!   `output_tokens`); of a `text/event-stream` body, the last value of `FIELD` among its events'
//!   `usage` (or `message.usage`, `response.usage`) objects: OpenAI's last chunk with
//!   `stream_options.include_usage`, Anthropic's `message_start` then its cumulative
//!   `message_delta`s, the Responses API's `response.completed`.
//! - `response.header.NAME`: a response header holding the cost as a decimal integer.
//!
//! The request reserves `estimate` (all or nothing with its other limits); the response settles
//! it: less is refunded, more charged even past the limit (the next requests pay for it).
//!
//! The estimate may be read from the request's JSON body instead:
//! `estimate = "request.json.max_tokens"` (a dotted path of object keys), with `estimate_default
//! = N` for a request that does not give it (no such field, not a positive integer, a body that
//! is not JSON, or a front end that does not read bodies). A value above the limit's capacity
//! reserves the capacity. The front end reads the body (bounded) and hands the values to the
//! rules as pseudo-header fields named [`RequestField::pseudo_header`] (a name no real header
//! can have: it starts with `:`); `tollgate proxy` does so.

/// Where a rule reads what a request cost, from its response.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ResponseCost {
    /// The field of the response's `usage` object (JSON body or the last event of a stream).
    Usage(String),
    /// A response header (lowercase name) holding the cost.
    Header(String),
}

impl ResponseCost {
    /// Parses `cost = "response.…"`; `None` if `text` does not start with `response.` (then it
    /// is not a response cost at all).
    pub(crate) fn parse(text: &str) -> Option<Result<ResponseCost, String>> {
        let rest = text.strip_prefix("response.")?;
        let hint = || {
            format!(
                "cost {text:?}: use a number, \"response.usage.FIELD\" (e.g. response.usage.total_tokens) or \"response.header.NAME\""
            )
        };
        let parsed = if let Some(field) = rest.strip_prefix("usage.") {
            let valid =
                !field.is_empty() && field.len() <= 64 && field.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if valid {
                Ok(ResponseCost::Usage(field.to_string()))
            } else {
                Err(format!("cost {text:?}: the usage field must be 1 to 64 letters, digits or '_' (no nested path)"))
            }
        } else if let Some(name) = rest.strip_prefix("header.") {
            let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if valid {
                Ok(ResponseCost::Header(name.to_ascii_lowercase()))
            } else {
                Err(format!("cost {text:?}: a header name (letters, digits and '-')"))
            }
        } else {
            Err(hint())
        };
        Some(parsed)
    }
}

impl std::fmt::Display for ResponseCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResponseCost::Usage(field) => write!(f, "response.usage.{field}"),
            ResponseCost::Header(name) => write!(f, "response.header.{name}"),
        }
    }
}

/// A field of the request's JSON body an estimate is read from (`request.json.a.b`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestField {
    /// The object keys down to it.
    pub path: Vec<String>,
    /// `:request.json.a.b`.
    pseudo: String,
}

/// The most keys a request field's path may have.
const MAX_PATH_KEYS: usize = 8;

impl RequestField {
    /// Parses `estimate = "request.json.…"`; `None` if `text` does not start with `request.`.
    pub(crate) fn parse(text: &str) -> Option<Result<RequestField, String>> {
        let rest = text.strip_prefix("request.")?;
        let Some(path) = rest.strip_prefix("json.") else {
            return Some(Err(format!(
                "estimate {text:?}: use a number or \"request.json.FIELD\" (e.g. request.json.max_tokens)"
            )));
        };
        let keys: Vec<String> = path.split('.').map(str::to_string).collect();
        let valid = keys.len() <= MAX_PATH_KEYS
            && keys.iter().all(|k| {
                !k.is_empty() && k.len() <= 64 && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            });
        if !valid {
            return Some(Err(format!(
                "estimate {text:?}: a path of 1 to {MAX_PATH_KEYS} object keys (letters, digits, '_', '-'), dot-separated"
            )));
        }
        Some(Ok(RequestField { pseudo: format!(":{text}"), path: keys }))
    }

    /// The name the front end gives the field's value among the request's header fields.
    #[must_use]
    pub fn pseudo_header(&self) -> &str {
        &self.pseudo
    }
}

#[cfg(test)]
mod tests {
    use super::ResponseCost;

    #[test]
    fn usage_fields_and_headers_parse_and_print_back() {
        for text in ["response.usage.total_tokens", "response.header.x-tokens-used"] {
            assert_eq!(ResponseCost::parse(text).unwrap().unwrap().to_string(), text);
        }
        assert_eq!(
            ResponseCost::parse("response.header.X-Tokens").unwrap().unwrap(),
            ResponseCost::Header("x-tokens".into())
        );
    }

    #[test]
    fn request_fields_parse_into_their_path() {
        let field = super::RequestField::parse("request.json.options.max_tokens").unwrap().unwrap();
        assert_eq!(field.pseudo_header(), ":request.json.options.max_tokens");
        assert_eq!(field.path, ["options", "max_tokens"]);
        assert!(super::RequestField::parse("request.header.x").unwrap().unwrap_err().contains("request.json.FIELD"));
        assert!(super::RequestField::parse("request.json.a..b").unwrap().unwrap_err().contains("dot-separated"));
        assert!(super::RequestField::parse("response.usage.x").is_none());
    }

    #[test]
    fn bad_paths_are_refused_precisely() {
        assert!(ResponseCost::parse("request.json.max_tokens").is_none(), "not a response cost");
        let refused = |text: &str| ResponseCost::parse(text).unwrap().unwrap_err();
        assert!(refused("response.usage.").contains("1 to 64 letters"), "{}", refused("response.usage."));
        assert!(refused("response.usage.a.b").contains("no nested path"));
        assert!(refused("response.header.a b").contains("header name"));
        assert!(refused("response.body.tokens").contains("response.usage.FIELD"));
    }
}
