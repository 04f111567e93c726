//! The shared conformance traces (`testdata/conformance/*.jsonl`) replayed through [`State`]:
//! every decision must match the trace's `expect` field for field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tollgate_core::{Algorithm, Limit, State};

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

#[derive(Deserialize)]
struct Request {
    t: u64,
    key: String,
    cost: u64,
    expect: Expect,
}

/// Absent fields are not checked (the window counters' files omit the two durations).
#[derive(Deserialize)]
struct Expect {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after_ns: Option<u64>,
    reset_after_ns: Option<u64>,
}

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/conformance")
}

fn limit_of(params: &Params) -> Limit {
    Limit::from_parts(&params.limit, Some(&params.algorithm), params.burst, params.slices).expect("valid params")
}

/// Replays one file; returns the number of requests checked.
fn replay(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Header = serde_json::from_str(lines.next().expect("params line")).unwrap();
    let limit = limit_of(&header.params);
    let mut states: HashMap<String, State> = HashMap::new();
    let mut checked = 0;
    for (index, line) in lines.enumerate() {
        let request: Request = serde_json::from_str(line).unwrap();
        let state = states.entry(request.key.clone()).or_insert_with(|| State::idle(&limit));
        let got = state.check(request.t, &limit, request.cost).unwrap();
        let want = &request.expect;
        let at = format!("{} request {} ({line})", path.display(), index + 1);
        assert_eq!(got.allowed, want.allowed, "allowed at {at}: got {got:?}");
        assert_eq!(got.limit, want.limit, "limit at {at}: got {got:?}");
        assert_eq!(got.remaining, want.remaining, "remaining at {at}: got {got:?}");
        if let Some(retry) = want.retry_after_ns {
            assert_eq!(got.retry_after_ns, retry, "retry_after_ns at {at}: got {got:?}");
        }
        if let Some(reset) = want.reset_after_ns {
            assert_eq!(got.reset_after_ns, reset, "reset_after_ns at {at}: got {got:?}");
        }
        checked += 1;
    }
    checked
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
    let mut covered = std::collections::BTreeSet::new();
    for file in &files {
        let header: Header =
            serde_json::from_str(std::fs::read_to_string(file).unwrap().lines().next().unwrap()).unwrap();
        covered.insert(header.params.algorithm.clone());
        assert!(replay(file) > 0, "{} has no requests", file.display());
    }
    for algorithm in Algorithm::ALL {
        assert!(covered.contains(algorithm.as_str()), "no conformance trace for {algorithm}");
    }
}
