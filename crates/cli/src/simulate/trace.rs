//! The lines of a `tollgate simulate --trace` file: an optional params header, then one request
//! per line, each optionally with the decision it expects.
//!
//! ```text
//! {"params": {"algorithm": "gcra", "limit": "10/s", "burst": 10}}
//! {"t": 1700000000000000000, "key": "a", "cost": 1, "expect": {"allowed": true, "remaining": 9}}
//! ```
//!
//! Every field is known: a misspelt one (`"cots": 3`, `"remianing"`) is an error naming it, never
//! a default silently applied or an expectation silently left unchecked.

use anyhow::Context;
use serde::Deserialize;
use tollgate_core::{Decision, Limit};

/// The header line: the limit every request of the trace is decided under.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    params: Params,
}

/// A limit as a conformance file spells it; `algorithm` is required, as `--algorithm` is.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    algorithm: String,
    limit: String,
    burst: Option<u64>,
    slices: Option<u64>,
}

/// One request of a trace.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Request {
    pub(crate) t: u64,
    pub(crate) key: String,
    #[serde(default = "unit_cost")]
    pub(crate) cost: u64,
    pub(crate) expect: Option<Expect>,
}

fn unit_cost() -> u64 {
    1
}

/// The decision a request must get; only the fields given are compared (the conformance files
/// give only `allowed`, `limit` and `remaining` for the sliding window and sub-window counters).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Expect {
    allowed: Option<bool>,
    limit: Option<u64>,
    remaining: Option<u64>,
    retry_after_ns: Option<u64>,
    reset_after_ns: Option<u64>,
}

impl Expect {
    /// True when no field is given: nothing to compare.
    pub(crate) fn is_empty(&self) -> bool {
        let Expect { allowed, limit, remaining, retry_after_ns, reset_after_ns } = self;
        allowed.is_none()
            && limit.is_none()
            && remaining.is_none()
            && retry_after_ns.is_none()
            && reset_after_ns.is_none()
    }

    /// `expected FIELD WANTED, got ACTUAL` for every given field the decision differs in.
    pub(crate) fn mismatches(&self, got: &Decision) -> Vec<String> {
        let mut out = Vec::new();
        let mut compare = |field: &str, wanted: Option<String>, actual: String| {
            if let Some(wanted) = wanted.filter(|w| *w != actual) {
                out.push(format!("expected {field} {wanted}, got {actual}"));
            }
        };
        let text = |v: Option<u64>| v.map(|v| v.to_string());
        compare("allowed", self.allowed.map(|v| v.to_string()), got.allowed.to_string());
        compare("limit", text(self.limit), got.limit.to_string());
        compare("remaining", text(self.remaining), got.remaining.to_string());
        compare("retry_after_ns", text(self.retry_after_ns), got.retry_after_ns.to_string());
        compare("reset_after_ns", text(self.reset_after_ns), got.reset_after_ns.to_string());
        out
    }
}

/// Whether `line` is a params header: a JSON object with a `params` field.
pub(crate) fn is_header(line: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line).is_ok_and(|o| o.contains_key("params"))
}

/// The limit a header line sets.
pub(crate) fn parse_header(line: &str) -> anyhow::Result<Limit> {
    let Header { params } = parse(line)?;
    let Params { algorithm, limit, burst, slices } = params;
    Limit::from_parts(&limit, Some(&algorithm), burst, slices)
        .with_context(|| format!("params header: invalid limit {algorithm} {limit}"))
}

/// One request line.
pub(crate) fn parse_request(line: &str) -> anyhow::Result<Request> {
    parse(line)
}

/// Parses one line, with serde's message minus its "at line 1 column N" (always line 1 here).
fn parse<T: serde::de::DeserializeOwned>(line: &str) -> anyhow::Result<T> {
    serde_json::from_str(line).map_err(|error| {
        let message = error.to_string();
        let message = message.split(" at line ").next().unwrap_or(&message);
        anyhow::anyhow!("{message} (column {})", error.column())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_sets_a_validated_limit() {
        let line = r#"{"params": {"algorithm": "sub-window", "limit": "10/s", "slices": 10}}"#;
        assert!(is_header(line));
        assert_eq!(parse_header(line).unwrap().to_string(), "sub-window 10/1s slices 10");
        assert!(!is_header(r#"{"t": 1, "key": "params"}"#));
        assert!(!is_header("not json"));
        let bad = parse_header(r#"{"params": {"algorithm": "gcra", "limit": "0/s"}}"#).unwrap_err();
        assert_eq!(
            format!("{bad:#}"),
            "params header: invalid limit gcra 0/s: count must be at least 1, got 0 (a limit that admits nothing is a block rule, not a rate)"
        );
    }

    #[test]
    fn expectations_compare_only_the_fields_given() {
        let got = Decision { allowed: false, limit: 10, remaining: 0, retry_after_ns: 5, reset_after_ns: 7 };
        let expect: Expect = serde_json::from_str(r#"{"allowed": true, "remaining": 0, "reset_after_ns": 8}"#).unwrap();
        assert_eq!(expect.mismatches(&got), ["expected allowed true, got false", "expected reset_after_ns 8, got 7"]);
        assert!(Expect::default().is_empty() && Expect::default().mismatches(&got).is_empty());
    }

    #[test]
    fn unknown_fields_are_named() {
        let error = parse_request(r#"{"t": 1, "key": "a", "cots": 2}"#).unwrap_err().to_string();
        assert!(error.starts_with("unknown field `cots`, expected one of `t`, `key`, `cost`, `expect`"), "{error}");
    }
}
