//! `tollgate simulate` as a user runs it: the real binary, traces on stdin and in files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn tollgate(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tollgate runs");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn conformance_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
}

/// Every conformance trace, its params turned into flags and its requests (with their `expect`
/// fields, which the replay ignores) piped in: every output line matches its expectation.
#[test]
fn replays_every_conformance_trace_exactly() {
    for file in conformance_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let (header, requests) = text.split_once('\n').unwrap();
        let params: Value = serde_json::from_str(header).unwrap();
        let params = &params["params"];
        let mut args = vec![
            "simulate".to_string(),
            "--algorithm".into(),
            params["algorithm"].as_str().unwrap().into(),
            "--limit".into(),
            params["limit"].as_str().unwrap().into(),
            "--trace".into(),
            "-".into(),
        ];
        for flag in ["burst", "slices"] {
            if let Some(value) = params[flag].as_u64() {
                args.extend([format!("--{flag}"), value.to_string()]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = tollgate(&args, requests);
        assert!(output.status.success(), "{}: {}", file.display(), stderr(&output));
        let got = stdout(&output);
        let wanted: Vec<&str> = requests.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(got.lines().count(), wanted.len(), "{}: one line per request", file.display());
        for (line, (got, request)) in got.lines().zip(wanted).enumerate() {
            let got: Value = serde_json::from_str(got).unwrap();
            let expect = &serde_json::from_str::<Value>(request).unwrap()["expect"];
            for (field, value) in expect.as_object().unwrap() {
                assert_eq!(&got[field], value, "{} request {}: {field}", file.display(), line + 1);
            }
        }
    }
}

#[test]
fn output_is_exactly_the_documented_line() {
    let output = tollgate(
        &["simulate", "--algorithm", "gcra", "--limit", "10/s", "--trace", "-"],
        "{\"t\": 1700000000000000000, \"key\": \"a\"}\n",
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "{\"allowed\":true,\"limit\":10,\"remaining\":9,\"retry_after_ns\":0,\"reset_after_ns\":100000000}\n"
    );
}

#[test]
fn reads_a_trace_file() {
    let dir = std::env::temp_dir().join(format!("tollgate-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, "{\"t\":0,\"key\":\"k\",\"cost\":3}\n{\"t\":0,\"key\":\"k\",\"cost\":3}\n").unwrap();
    let output = tollgate(
        &["simulate", "--algorithm", "fixed-window", "--limit", "5/500ms", "--trace", trace.to_str().unwrap()],
        "",
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let lines: Vec<Value> = stdout(&output).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["remaining"], 2);
    assert_eq!(lines[1]["allowed"], false);
    assert_eq!(lines[1]["retry_after_ns"], 500_000_000);
}

#[test]
fn a_bad_line_is_an_error_naming_it_after_the_good_ones() {
    let output = tollgate(
        &["simulate", "--algorithm", "sliding-log", "--limit", "10/s", "--trace", "-"],
        "{\"t\":10,\"key\":\"a\"}\n{\"t\":20,\"key\":\"a\"}\n{\"t\":15,\"key\":\"a\"}\n{\"t\":30,\"key\":\"a\"}\n",
    );
    assert!(!output.status.success());
    assert_eq!(stdout(&output).lines().count(), 2, "decisions before the bad line are printed");
    assert!(stderr(&output).contains("line 3: t 15 is before the previous request's t 20"), "{}", stderr(&output));

    let output = tollgate(
        &["simulate", "--algorithm", "gcra", "--limit", "10/s", "--burst", "5", "--trace", "-"],
        "{\"t\":10,\"key\":\"a\",\"cost\":6}\n",
    );
    assert!(!output.status.success());
    assert!(stderr(&output).contains("line 1: cost 6 exceeds the capacity 5"), "{}", stderr(&output));
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, wanted) in [
        (&["simulate", "--algorithm", "gcra", "--trace", "-"][..], "--limit"),
        (&["simulate", "--algorithm", "nope", "--limit", "10/s", "--trace", "-"][..], "nope"),
        (&["simulate", "--algorithm", "gcra", "--limit", "10/fortnight", "--trace", "-"][..], "fortnight"),
        (
            &["simulate", "--algorithm", "gcra", "--limit", "10/s", "--burst", "0", "--trace", "-"][..],
            "burst must be at least 1",
        ),
        (
            &["simulate", "--algorithm", "fixed-window", "--limit", "10/s", "--burst", "3", "--trace", "-"][..],
            "burst applies to",
        ),
        (&["simulate", "--algorithm", "gcra", "--limit", "0/s", "--trace", "-"][..], "count must be at least 1"),
        (
            &["simulate", "--algorithm", "gcra", "--limit", "10/s", "--trace", "/nonexistent/trace"][..],
            "cannot open trace",
        ),
    ] {
        let output = tollgate(args, "");
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr(&output).contains(wanted), "{args:?}: {}", stderr(&output));
    }
}

#[test]
fn over_grant_prints_the_seeds_figures_and_plots() {
    let svg = std::env::temp_dir().join(format!("tollgate-over-grant-{}.svg", std::process::id()));
    let output = tollgate(&["simulate", "over-grant", "--plot", svg.to_str().unwrap()], "");
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let row = |name: &str| -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name} row"));
        line.split_whitespace().map(str::to_string).collect()
    };
    for algorithm in ["gcra", "token-bucket", "leaky-bucket", "fixed-window", "sliding-log", "sub-window"] {
        assert_eq!(row(algorithm)[1..4], ["40", "40", "+0.00%"], "{algorithm}");
    }
    assert_eq!(row("sliding-window")[1..3], ["34", "40"]);
    assert!(text.contains("34 admitted where 10/s over 3 s allows 30 (+13.3%)"), "{text}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_file(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("sliding-window"));
}
