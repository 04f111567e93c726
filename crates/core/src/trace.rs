//! The conformance trace format (feature `trace`): JSON lines, a params header, then one request
//! per line, each with the decision it expects. The shared traces in `testdata/conformance`,
//! core's and the stores' conformance tests and `tollgate simulate --trace` all read it here.
//!
//! ```text
//! {"params": {"algorithm": "gcra", "limit": "10/s", "burst": 10}}
//! {"t": 1700000000000000000, "key": "a", "cost": 1, "expect": {"allowed": true, "remaining": 9}}
//! ```
//!
//! Every field is known: a misspelt one (`"cots": 3`, `"remianing"`) is an error naming it, never
//! a default silently applied or an expectation silently left unchecked. A request's `cost` is 1
//! when absent; only the expected fields given are compared.

use serde::Deserialize;

use crate::{Decision, Limit, LimitSpec};

/// Why a line or a trace cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TraceError(String);

/// A trace: its limit and its requests.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Its name (a file's, without extension).
    pub name: String,
    /// The limit every request is decided under.
    pub limit: Limit,
    /// The requests, in order.
    pub requests: Vec<Request>,
}

impl Trace {
    /// A whole trace: the header on the first non-blank line, then requests (an error names the
    /// line).
    pub fn parse(name: &str, text: &str) -> Result<Trace, TraceError> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let at = |number: usize, e: TraceError| TraceError(format!("{name} line {}: {e}", number + 1));
        let (number, header) = lines.next().ok_or_else(|| TraceError(format!("{name}: no params header")))?;
        let limit = parse_header(header).map_err(|e| at(number, e))?;
        let requests =
            lines.map(|(number, line)| parse_request(line).map_err(|e| at(number, e))).collect::<Result<_, _>>()?;
        Ok(Trace { name: name.to_string(), limit, requests })
    }
}

/// The header line: the limit every request of the trace is decided under.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    params: LimitSpec,
}

/// One request of a trace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// ns since the Unix epoch.
    pub t: u64,
    /// The key.
    pub key: String,
    /// The cost (1 when absent).
    #[serde(default = "unit_cost")]
    pub cost: u64,
    /// The decision it must get, if the trace says.
    pub expect: Option<Expect>,
}

fn unit_cost() -> u64 {
    1
}

/// The decision a request must get; only the fields given are compared (the shared traces give
/// only `allowed`, `limit` and `remaining` for the sliding window and sub-window counters).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Admitted or not.
    pub allowed: Option<bool>,
    /// The decision's limit.
    pub limit: Option<u64>,
    /// What is left.
    pub remaining: Option<u64>,
    /// When to retry, in ns.
    pub retry_after_ns: Option<u64>,
    /// When the key is whole again, in ns.
    pub reset_after_ns: Option<u64>,
}

impl Expect {
    /// True when no field is given: nothing to compare.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        let Expect { allowed, limit, remaining, retry_after_ns, reset_after_ns } = self;
        allowed.is_none()
            && limit.is_none()
            && remaining.is_none()
            && retry_after_ns.is_none()
            && reset_after_ns.is_none()
    }

    /// `expected FIELD WANTED, got ACTUAL` for every given field the decision differs in.
    #[must_use]
    pub fn mismatches(&self, got: &Decision) -> Vec<String> {
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
#[must_use]
pub fn is_header(line: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line).is_ok_and(|o| o.contains_key("params"))
}

/// The limit a header line sets; its algorithm is required (as `--algorithm` is).
pub fn parse_header(line: &str) -> Result<Limit, TraceError> {
    let Header { params } = parse(line)?;
    if params.algorithm.is_none() {
        return Err(TraceError(
            "missing field `algorithm` (a params header names the algorithm, e.g. \"gcra\")".into(),
        ));
    }
    params.build().map_err(|e| TraceError(format!("params header: invalid limit {params}: {e}")))
}

/// One request line.
pub fn parse_request(line: &str) -> Result<Request, TraceError> {
    parse(line)
}

/// Parses one line, with serde's message minus its "at line 1 column N" (always line 1 here).
fn parse<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, TraceError> {
    serde_json::from_str(line).map_err(|error| {
        let message = error.to_string();
        let message = message.split(" at line ").next().unwrap_or(&message);
        TraceError(format!("{message} (column {})", error.column()))
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
            bad.to_string(),
            "params header: invalid limit gcra 0/s: count must be at least 1, got 0 (a limit that admits nothing is a block rule, not a rate)"
        );
        let unnamed = parse_header(r#"{"params": {"limit": "1/s"}}"#).unwrap_err().to_string();
        assert!(unnamed.starts_with("missing field `algorithm`"), "{unnamed}");
        let unknown = parse_header(r#"{"params": {"algorithm": "lottery", "limit": "1/s"}}"#).unwrap_err().to_string();
        assert!(unknown.starts_with("algorithm \"lottery\": use gcra, "), "{unknown}");
    }

    #[test]
    fn expectations_compare_only_the_fields_given() {
        let got = Decision { allowed: false, limit: 10, remaining: 0, retry_after_ns: 5, reset_after_ns: 7 };
        let expect: Expect = serde_json::from_str(r#"{"allowed": true, "remaining": 0, "reset_after_ns": 8}"#).unwrap();
        assert_eq!(expect.mismatches(&got), ["expected allowed true, got false", "expected reset_after_ns 8, got 7"]);
        assert!(Expect::default().is_empty() && Expect::default().mismatches(&got).is_empty());
    }

    #[test]
    fn unknown_fields_are_named_with_their_line() {
        let error = parse_request(r#"{"t": 1, "key": "a", "cots": 2}"#).unwrap_err().to_string();
        assert!(error.starts_with("unknown field `cots`, expected one of `t`, `key`, `cost`, `expect`"), "{error}");
        let trace =
            "{\"params\": {\"algorithm\": \"gcra\", \"limit\": \"1/s\"}}\n\n{\"t\": 1, \"key\": \"a\", \"brust\": 1}";
        let error = Trace::parse("x", trace).unwrap_err().to_string();
        assert!(error.starts_with("x line 3: unknown field `brust`"), "{error}");
        assert_eq!(Trace::parse("x", trace.split('\n').next().unwrap()).unwrap().requests.len(), 0);
    }
}
