//! The shared conformance traces (`testdata/conformance/*.jsonl`) replayed through [`State`]:
//! every decision must match the trace's `expect` field for field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tollgate_core::trace::Trace;
use tollgate_core::{Algorithm, State};

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/conformance")
}

/// Replays one file; returns the trace's limit and the number of requests checked.
fn replay(path: &Path) -> (tollgate_core::Limit, usize) {
    let text = std::fs::read_to_string(path).unwrap();
    let trace = Trace::parse(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
    let mut states: HashMap<String, State> = HashMap::new();
    for (index, request) in trace.requests.iter().enumerate() {
        let state = states.entry(request.key.clone()).or_insert_with(|| State::idle(&trace.limit));
        let got = state.check(request.t, &trace.limit, request.cost).unwrap();
        let at = format!("{} request {} ({request:?})", path.display(), index + 1);
        // Every shared trace says at least whether each request is admitted, its limit and what is
        // left (the window counters' files omit the two durations).
        let want = request.expect.as_ref().unwrap_or_else(|| panic!("no expect at {at}"));
        assert!(
            want.allowed.is_some() && want.limit.is_some() && want.remaining.is_some(),
            "incomplete expect at {at}"
        );
        let mismatches = want.mismatches(&got);
        assert!(mismatches.is_empty(), "{} at {at}", mismatches.join(", "));
    }
    (trace.limit, trace.requests.len())
}

#[test]
fn every_conformance_trace_is_reproduced_exactly() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(conformance_dir())
        .expect("testdata/conformance exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "expected the eight shared traces, found {}", files.len());
    let mut covered = std::collections::HashSet::new();
    for file in &files {
        let (limit, checked) = replay(file);
        covered.insert(limit.algorithm());
        assert!(checked > 0, "{} has no requests", file.display());
    }
    for algorithm in Algorithm::ALL {
        assert!(covered.contains(&algorithm), "no conformance trace for {algorithm}");
    }
}
