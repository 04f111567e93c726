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

/// Every conformance trace, its params turned into flags and its requests piped in without the
/// header: every output line matches its expectation, compared here rather than by `--check`.
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
        if let Some(zone) = params["tz"].as_str() {
            args.extend(["--tz".to_string(), zone.to_string()]);
        }
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

/// A scratch directory of this test process, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tollgate-simulate-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The files as they are, header included, with no limit flags: every decision matches.
#[test]
fn every_conformance_file_replays_with_check() {
    for file in conformance_files() {
        let output = tollgate(&["simulate", "--trace", arg(&file), "--check"], "");
        assert_eq!(output.status.code(), Some(0), "{}: {}", file.display(), stderr(&output));
        let requests = std::fs::read_to_string(&file).unwrap().lines().skip(1).filter(|l| !l.trim().is_empty()).count();
        assert_eq!(stdout(&output).lines().count(), requests, "{}: one decision per request", file.display());
        assert_eq!(
            stderr(&output),
            format!("checked {requests} decisions against their expect fields: all match\n"),
            "{}",
            file.display()
        );
    }
}

#[test]
fn an_altered_expect_fails_naming_its_line() {
    let scratch = Scratch::new("altered");
    let original = conformance_files().into_iter().find(|f| f.ends_with("gcra-10pers-burst10.jsonl")).unwrap();
    let text = std::fs::read_to_string(original).unwrap();
    // Line 5 is the fourth request of the burst: 6 remain, not 5.
    let line5 = text.lines().nth(4).unwrap();
    assert!(line5.contains("\"remaining\": 6"), "{line5}");
    let altered = text.replacen(line5, &line5.replace("\"remaining\": 6", "\"remaining\": 5"), 1);
    let trace = scratch.path("altered.jsonl");
    std::fs::write(&trace, altered).unwrap();

    let output = tollgate(&["simulate", "--trace", arg(&trace), "--check"], "");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.starts_with("line 5: expected remaining 5, got 6\n"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("line ")).count(), 1, "only line 5 mismatches: {err}");
    assert!(err.contains("1 of 47 decisions checked did not match their expect fields"), "{err}");
    assert_eq!(stdout(&output).lines().count(), 47, "every decision is still printed");
}

#[test]
fn the_params_header_and_the_flags_never_silently_disagree() {
    let scratch = Scratch::new("header");
    let trace = scratch.path("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"params\": {\"algorithm\": \"gcra\", \"limit\": \"10/s\", \"burst\": 2}}\n{\"t\": 0, \"key\": \"a\"}\n",
    )
    .unwrap();
    let path = arg(&trace);

    // The header alone sets the limit.
    let output = tollgate(&["simulate", "--trace", path], "");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("{\"allowed\":true,\"limit\":2,\"remaining\":1,"), "{}", stdout(&output));

    // Flags describing the same limit are accepted; any other flags are an error naming both.
    let same = tollgate(&["simulate", "--algorithm", "gcra", "--limit", "10/1s", "--burst", "2", "--trace", path], "");
    assert!(same.status.success(), "{}", stderr(&same));
    for flags in [
        &["--algorithm", "gcra", "--limit", "10/s"][..],
        &["--algorithm", "fixed-window", "--limit", "10/s"],
        &["--burst", "3"],
    ] {
        let mut args = vec!["simulate", "--trace", path];
        args.extend(flags);
        let output = tollgate(&args, "");
        assert_eq!(output.status.code(), Some(1), "{flags:?}");
        let err = stderr(&output);
        assert!(err.contains("line 1: the trace's params header sets gcra 10/1s burst 2"), "{flags:?}: {err}");
        assert!(err.contains(&format!("the command line sets {}", flags.join(" "))), "{flags:?}: {err}");
        assert!(stdout(&output).is_empty(), "nothing is decided under an ambiguous limit");
    }

    // No limit anywhere, a header after the first request, a misspelt field, a bad header.
    for (input, flags, wanted) in [
        ("{\"t\": 0, \"key\": \"a\"}\n", &[][..], "give --algorithm and --limit"),
        (
            "{\"t\": 0, \"key\": \"a\"}\n{\"params\": {\"algorithm\": \"gcra\", \"limit\": \"1/s\"}}\n",
            &["--algorithm", "gcra", "--limit", "10/s"][..],
            "line 2: a params header must be the trace's first line",
        ),
        (
            "{\"t\": 0, \"key\": \"a\", \"cots\": 3}\n",
            &["--algorithm", "gcra", "--limit", "10/s"][..],
            "line 1: unknown field `cots`",
        ),
        (
            "{\"params\": {\"algorithm\": \"gcra\", \"limit\": \"10/s\", \"brust\": 2}}\n",
            &[][..],
            "line 1: unknown field `brust`",
        ),
        ("{\"params\": {\"limit\": \"10/s\"}}\n", &[][..], "line 1: missing field `algorithm`"),
        (
            "{\"params\": {\"algorithm\": \"fixed-window\", \"limit\": \"10/s\", \"burst\": 2}}\n",
            &[][..],
            "burst applies to",
        ),
        (
            "{\"t\": 0, \"key\": \"a\", \"expect\": {\"remianing\": 9}}\n",
            &["--algorithm", "gcra", "--limit", "10/s"][..],
            "unknown field `remianing`",
        ),
    ] {
        let mut args = vec!["simulate", "--trace", "-"];
        args.extend(flags);
        let output = tollgate(&args, input);
        assert_eq!(output.status.code(), Some(1), "{input}");
        assert!(stderr(&output).contains(wanted), "{input}: {}", stderr(&output));
    }
}

#[test]
fn check_counts_requests_without_expect() {
    let flags = ["simulate", "--algorithm", "gcra", "--limit", "10/s", "--trace", "-", "--check"];
    let output =
        tollgate(&flags, "{\"t\": 0, \"key\": \"a\", \"expect\": {\"remaining\": 9}}\n{\"t\": 0, \"key\": \"a\"}\n");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        "checked 1 decision against their expect fields: all match; 1 request without expect was not checked\n"
    );

    let output = tollgate(&flags, "{\"t\": 0, \"key\": \"a\"}\n");
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("no request in the trace has an expect field"), "{}", stderr(&output));
}

#[test]
fn plot_format_follows_the_extension() {
    let scratch = Scratch::new("plot");
    let svg = scratch.path("grants.svg");
    let output = tollgate(&["simulate", "over-grant", "--plot", arg(&svg)], "");
    assert!(output.status.success(), "{}", stderr(&output));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("sliding-window"));

    // PNG is refused (not built in), as is any other extension: before the experiment runs.
    for name in ["grants.png", "grants.txt", "grants"] {
        let file = scratch.path(name);
        let output = tollgate(&["simulate", "over-grant", "--plot", arg(&file)], "");
        assert!(!output.status.success(), "{name} accepted");
        assert!(stderr(&output).contains("supported: .svg"), "{name}: {}", stderr(&output));
        assert!(stdout(&output).is_empty(), "{name}: the experiment ran anyway");
        assert!(!file.exists(), "{name} was written");
    }
}

#[test]
fn over_grant_figures_use_one_sign_convention() {
    let output = tollgate(&["simulate", "over-grant"], "");
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let row = |start: &str| -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no {start} row"));
        line.split_whitespace().map(str::to_string).collect()
    };
    assert!(text.contains("(admitted - allowed) / allowed: + is an over-grant, - an under-grant"), "{text}");
    // TestOverGrant: every algorithm admits 40 over the run but the sliding window counter's 34;
    // within its busiest second it admits 15 of 10.
    for algorithm in ["gcra ", "token-bucket ", "leaky-bucket ", "sliding-log ", "sub-window "] {
        assert_eq!(row(algorithm)[1..4], ["40", "40", "+0.0%"], "{algorithm}");
    }
    assert_eq!(row("fixed-window ")[1..7], ["40", "40", "+0.0%", "20", "10", "+100.0%"]);
    assert_eq!(row("sliding-window ")[1..7], ["34", "40", "-15.0%", "15", "10", "+50.0%"]);
    // The same 34 in the sliding window section: the same figures.
    assert_eq!(row("synchronized:")[5..12], ["34", "40", "-15.0%", "5", "15", "10", "+50.0%"]);
    // One format and one sign for every percentage printed.
    let percentages: Vec<&str> = text.split_whitespace().filter(|w| w.contains('%')).collect();
    assert!(percentages.len() > 20, "{percentages:?}");
    for p in &percentages {
        let p = p.trim_matches(['(', ',', ')', ';', ':', '.']);
        let number = p.strip_suffix('%').unwrap_or_else(|| panic!("{p}"));
        assert!(number.starts_with(['+', '-']) && number.contains('.'), "{p} is not a signed percentage");
    }
    assert!(!text.contains("+13.3%"), "{text}");
}
