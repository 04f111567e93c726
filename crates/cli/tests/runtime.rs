//! `tollgate serve --runtime per-core|shared --workers N`: every front end answers on either
//! model, decisions counted exactly across the workers' connections (each worker decides its
//! connections' requests on the same store), SIGHUP reloads the rules, and SIGTERM still lets the
//! server finish and exit cleanly.

mod support;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::{Tollgate, temporary_dir};

/// Runs `tollgate bench ARGS --json FILE -q` and returns the JSON report.
fn bench(args: &[&str], dir: &Path) -> Value {
    let json = dir.join("report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("bench")
        .args(args)
        .args(["-q", "--json"])
        .arg(&json)
        .output()
        .expect("tollgate runs");
    assert!(output.status.success(), "bench {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report")).expect("JSON")
}

/// The limit `TG.LIMIT api KEY` answers under (its reply's second field), on a new connection.
fn capacity(server: &Tollgate, key: &str) -> i64 {
    let mut stream = TcpStream::connect(server.resp()).expect("connect");
    let mut command = Vec::new();
    tollgate_resp::command::encode(&["TG.LIMIT", "api", key], &mut command);
    stream.write_all(&command).expect("write");
    let reply = tollgate_resp::value::read(&mut BufReader::new(stream)).expect("reply");
    reply.integers().unwrap_or_else(|| panic!("not a decision: {reply:?}"))[1]
}

fn counts(report: &Value) -> [u64; 4] {
    ["requests", "errors", "allowed", "denied"].map(|f| report[f].as_u64().unwrap_or_else(|| panic!("{f} in {report}")))
}

/// Serves with `runtime` flags and checks RESP, HTTP and gRPC decisions are counted exactly (8
/// connections each, handed to the workers in turn), a SIGHUP reload, and a clean SIGTERM.
fn every_front_end_answers_exactly(name: &str, runtime: &[&str]) {
    let dir = temporary_dir(name);
    let envoy = dir.join("ratelimit.yaml");
    std::fs::write(
        &envoy,
        "domain: rt\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 40\n",
    )
    .expect("envoy config");
    let rules = dir.join("rules.toml");
    std::fs::write(&rules, "[limits.api]\nlimit = \"2/1h\"\n").expect("rules");
    let mut args = vec!["--log-level", "info", "--envoy-config", envoy.to_str().expect("utf-8"), "--rules"];
    args.push(rules.to_str().expect("utf-8"));
    args.extend_from_slice(runtime);
    let serve = Tollgate::serve(&args);

    // 30 an hour on 5 keys, 1,000 requests from 8 connections: exactly 150 admitted, whichever
    // worker each connection is on.
    let resp = serve.resp().to_string();
    let command = "CL.THROTTLE {key} 29 30 3600";
    let report = bench(&["resp", "--addr", &resp, "--command", command, "--keys", "5", "-n", "1000", "-c", "8"], &dir);
    assert_eq!(counts(&report), [1000, 0, 150, 850], "RESP {runtime:?}: {report}");

    let url = format!("http://{}/v1/check", serve.http());
    let body = r#"{"key":"http-{key}","limit":"30/h"}"#;
    let http = ["http", "--url", &url, "--method", "POST", "--body", body, "--keys", "4", "-n", "1000", "-c", "8"];
    let report = bench(&http, &dir);
    assert_eq!(counts(&report), [1000, 0, 120, 880], "HTTP {runtime:?}: {report}");

    // A fixed hour window of 40 per user on 3 users (a run crossing the hour sees two windows).
    let grpc = serve.grpc().to_string();
    let report = bench(
        &[
            "grpc",
            "--addr",
            &grpc,
            "--domain",
            "rt",
            "--descriptor",
            "user={key}",
            "--keys",
            "3",
            "-n",
            "600",
            "-c",
            "4",
        ],
        &dir,
    );
    let [requests, errors, allowed, denied] = counts(&report);
    assert_eq!((requests, errors, allowed + denied), (600, 0, 600), "gRPC {runtime:?}: {report}");
    assert!((120..=240).contains(&allowed), "gRPC {runtime:?}: {report}");

    // SIGHUP reloads the rules file (handled on the first runtime, seen by every worker).
    assert_eq!(capacity(&serve, "before"), 2);
    std::fs::write(&rules, "[limits.api]\nlimit = \"7/1h\"\n").expect("rules");
    serve.signal("HUP");
    let mut fresh = 0;
    support::eventually("the reloaded limit", support::DEADLINE, || {
        fresh += 1;
        match capacity(&serve, &format!("after-{fresh}")) {
            7 => Ok(()),
            other => Err(format!("limit {other}")),
        }
    });

    serve.signal("TERM");
    serve.wait_for("shutdown", |line| line.contains("shutting down"));
    let status = serve.exit(support::DEADLINE);
    assert!(status.success(), "{runtime:?}: exited {status}");
}

#[test]
fn per_core_runtime_serves_every_front_end() {
    every_front_end_answers_exactly("runtime-per-core", &["--runtime", "per-core", "--workers", "3"]);
}

#[test]
fn shared_runtime_serves_every_front_end() {
    every_front_end_answers_exactly("runtime-shared", &["--runtime", "shared", "--workers", "2"]);
}

#[test]
fn an_unknown_runtime_or_no_worker_is_refused() {
    for (flag, value, says) in [("--runtime", "fibers", "per-core"), ("--workers", "0", "--workers")] {
        let output =
            Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["serve", flag, value]).output().expect("tollgate runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(says), "{flag} {value}: {stderr}");
    }
}

/// A worker count no machine has cores for is refused naming the flag, before anything starts:
/// `--workers 1000000` started single-threaded runtimes (each a few file descriptors and a
/// thread) until the process ran out of descriptors, then said only `cannot start the runtime:
/// Too many open files` (and `--workers 3000` ran 3000 threads, silently).
#[test]
fn a_worker_count_beyond_reason_is_refused_naming_the_flag() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--workers", "1000000", "--resp", "127.0.0.1:0", "--http", "127.0.0.1:0", "--grpc"])
        .arg("127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tollgate runs");
    let started = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > support::DEADLINE {
            let _ = child.kill();
            panic!("`serve --workers 1000000` still running after {:?}", support::DEADLINE);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--workers"), "{stderr}");
}
