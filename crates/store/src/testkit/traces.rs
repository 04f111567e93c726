//! The shared conformance traces (`testdata/conformance/*.jsonl`), compiled in and replayed
//! against a store: every request at its explicit instant, every expected field compared.

use std::sync::Arc;

use serde::Deserialize;
use tollgate_core::{Limit, ManualClock};

use crate::Store;

/// The trace files, by name.
const FILES: [(&str, &str); 8] = [
    ("fixed-window-10pers", include_str!("../../../../testdata/conformance/fixed-window-10pers.jsonl")),
    ("gcra-10pers-burst10", include_str!("../../../../testdata/conformance/gcra-10pers-burst10.jsonl")),
    ("gcra-7pers-burst3", include_str!("../../../../testdata/conformance/gcra-7pers-burst3.jsonl")),
    ("leaky-bucket-10pers-burst4", include_str!("../../../../testdata/conformance/leaky-bucket-10pers-burst4.jsonl")),
    ("sliding-log-10pers", include_str!("../../../../testdata/conformance/sliding-log-10pers.jsonl")),
    ("sliding-window-10pers", include_str!("../../../../testdata/conformance/sliding-window-10pers.jsonl")),
    ("sub-window-10pers-slices10", include_str!("../../../../testdata/conformance/sub-window-10pers-slices10.jsonl")),
    ("token-bucket-10pers-burst10", include_str!("../../../../testdata/conformance/token-bucket-10pers-burst10.jsonl")),
];

/// One trace: a limit and requests with their expected decisions.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The file's name without extension.
    pub name: &'static str,
    /// The limit every request is checked under.
    pub limit: Limit,
    /// The requests, in order.
    pub requests: Vec<Request>,
}

/// One request of a trace and what it must get.
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    /// ns since the Unix epoch.
    pub t: u64,
    /// The key.
    pub key: String,
    /// The cost.
    pub cost: u64,
    /// The expected decision.
    pub expect: Expect,
}

/// An expected decision; absent durations are not compared.
#[derive(Debug, Clone, Deserialize)]
#[allow(missing_docs)]
pub struct Expect {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ns: Option<u64>,
    pub reset_after_ns: Option<u64>,
}

#[derive(Deserialize)]
struct Header {
    params: Params,
}

#[derive(Deserialize)]
struct Params {
    algorithm: String,
    limit: String,
    burst: Option<u64>,
    slices: Option<u64>,
}

/// Every shared trace, parsed.
#[must_use]
pub fn all() -> Vec<Trace> {
    FILES.iter().map(|&(name, text)| parse(name, text)).collect()
}

fn parse(name: &'static str, text: &str) -> Trace {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Header = serde_json::from_str(lines.next().expect("a params line")).expect("params");
    let Params { algorithm, limit, burst, slices } = header.params;
    let limit = Limit::from_parts(&limit, Some(&algorithm), burst, slices).expect("valid params");
    let requests = lines.map(|l| serde_json::from_str(l).expect("request line")).collect();
    Trace { name, limit, requests }
}

/// Replays every trace against a fresh store from `make`.
pub async fn run_all<S: Store>(make: &impl Fn(Arc<ManualClock>) -> S) {
    for trace in all() {
        let clock = Arc::new(ManualClock::new(0));
        let store = make(clock.clone());
        replay(&store, &clock, &trace, trace.name).await;
    }
}

/// Replays `trace` against `store`, setting `clock` to each request's instant; keys are
/// prefixed with `namespace` so that traces can share a store.
pub async fn replay<S: Store>(store: &S, clock: &ManualClock, trace: &Trace, namespace: &str) {
    for (i, request) in trace.requests.iter().enumerate() {
        clock.set(request.t);
        let key = format!("{namespace}:{}", request.key);
        let got = store
            .check(key.as_bytes(), &trace.limit, request.cost)
            .await
            .unwrap_or_else(|e| panic!("{} request {}: {e}", trace.name, i + 1));
        let want = &request.expect;
        let at = format!("{} request {} ({request:?}): got {got:?}", trace.name, i + 1);
        assert_eq!(got.allowed, want.allowed, "allowed, {at}");
        assert_eq!(got.limit, want.limit, "limit, {at}");
        assert_eq!(got.remaining, want.remaining, "remaining, {at}");
        if let Some(retry) = want.retry_after_ns {
            assert_eq!(got.retry_after_ns, retry, "retry_after_ns, {at}");
        }
        if let Some(reset) = want.reset_after_ns {
            assert_eq!(got.reset_after_ns, reset, "reset_after_ns, {at}");
        }
    }
}
