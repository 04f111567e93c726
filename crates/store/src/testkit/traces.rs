//! The shared conformance traces (`testdata/conformance/*.jsonl`), compiled in and replayed
//! against a store: every request at its explicit instant, every expected field compared.

use std::sync::Arc;

use tollgate_core::ManualClock;
pub use tollgate_core::trace::{Expect, Request, Trace};

use crate::Store;

/// The trace files, by name.
const FILES: [(&str, &str); 10] = [
    ("fixed-window-10pers", include_str!("../../../../testdata/conformance/fixed-window-10pers.jsonl")),
    (
        "fixed-window-3perday-berlin-dst",
        include_str!("../../../../testdata/conformance/fixed-window-3perday-berlin-dst.jsonl"),
    ),
    (
        "sliding-window-4permonth-utc-leap",
        include_str!("../../../../testdata/conformance/sliding-window-4permonth-utc-leap.jsonl"),
    ),
    ("gcra-10pers-burst10", include_str!("../../../../testdata/conformance/gcra-10pers-burst10.jsonl")),
    ("gcra-7pers-burst3", include_str!("../../../../testdata/conformance/gcra-7pers-burst3.jsonl")),
    ("leaky-bucket-10pers-burst4", include_str!("../../../../testdata/conformance/leaky-bucket-10pers-burst4.jsonl")),
    ("sliding-log-10pers", include_str!("../../../../testdata/conformance/sliding-log-10pers.jsonl")),
    ("sliding-window-10pers", include_str!("../../../../testdata/conformance/sliding-window-10pers.jsonl")),
    ("sub-window-10pers-slices10", include_str!("../../../../testdata/conformance/sub-window-10pers-slices10.jsonl")),
    ("token-bucket-10pers-burst10", include_str!("../../../../testdata/conformance/token-bucket-10pers-burst10.jsonl")),
];

/// Every shared trace, parsed.
#[must_use]
pub fn all() -> Vec<Trace> {
    FILES.iter().map(|&(name, text)| Trace::parse(name, text).unwrap_or_else(|e| panic!("{e}"))).collect()
}

/// Replays every trace against a fresh store from `make`.
pub async fn run_all<S: Store>(make: &impl Fn(Arc<ManualClock>) -> S) {
    for trace in all() {
        let clock = Arc::new(ManualClock::new(0));
        let store = make(clock.clone());
        replay(&store, &clock, &trace, &trace.name).await;
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
        let at = format!("{} request {} ({request:?}): got {got:?}", trace.name, i + 1);
        let want = request.expect.as_ref().unwrap_or_else(|| panic!("no expect, {at}"));
        let mismatches = want.mismatches(&got);
        assert!(mismatches.is_empty(), "{}, {at}", mismatches.join(", "));
    }
}
