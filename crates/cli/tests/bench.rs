//! `tollgate bench` against real servers: its throughput agrees with redis-benchmark's on the
//! same redis-server, and it counts every request exactly (redis-server's own `INCR` count, a
//! limit's exact admissions over RESP, HTTP and gRPC); `--json` and `--timeline` have the
//! documented shape; errors are counted, never lost; bad flags are refused with their reason.

mod support;

use std::path::Path;
use std::process::Command;

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde_json::Value;
use support::{Tollgate, free_port, temporary_dir};
use tollgate_store::testkit::redis_server::RedisServer;

/// Runs `tollgate bench ARGS --json FILE -q` and returns the JSON report and stdout.
/// The throughput comparison runs alone (write), the other tests of this file together (read):
/// their load on the machine's cores would otherwise be measured as the clients' difference.
static MACHINE: RwLock<()> = RwLock::new(());

fn alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(PoisonError::into_inner)
}

fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(PoisonError::into_inner)
}

fn bench(args: &[&str], dir: &Path) -> (Value, String) {
    let json = dir.join("report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("bench")
        .args(args)
        .args(["-q", "--json"])
        .arg(&json)
        .output()
        .expect("tollgate runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "bench {args:?} failed: {}{stdout}", String::from_utf8_lossy(&output.stderr));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report")).expect("JSON");
    (report, stdout)
}

fn refused(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("bench").args(args).output().expect("tollgate runs");
    assert!(!output.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn u64_field(report: &Value, field: &str) -> u64 {
    report[field].as_u64().unwrap_or_else(|| panic!("{field} in {report}"))
}

/// Percentiles present, positive and in order.
fn assert_sane_latency(report: &Value) {
    let latency = &report["latency_us"];
    let values: Vec<u64> = ["p50", "p90", "p99", "p999", "max"]
        .iter()
        .map(|p| latency[p].as_u64().unwrap_or_else(|| panic!("{p} in {report}")))
        .collect();
    assert!(values[0] > 0 && values.windows(2).all(|w| w[0] <= w[1]), "{report}");
}

/// The requests per second redis-benchmark reports for `-t incr` with these flags.
fn redis_benchmark_incr(port: u16, requests: u64, connections: u64, pipeline: u64) -> f64 {
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "incr", "-q"])
        .args(["-n", &requests.to_string(), "-c", &connections.to_string(), "-P", &pipeline.to_string()])
        .output()
        .expect("redis-benchmark runs (scripts/test.sh installs redis-tools)");
    let text = String::from_utf8_lossy(&output.stdout).replace('\r', "\n");
    text.lines()
        .filter_map(|l| l.strip_prefix("INCR: ")?.split(" requests per second").next()?.trim().parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no INCR figure in {text:?}"))
}

/// Pipelined (`-P 16`, 50 connections) so that redis-server, not either client, bounds the
/// throughput; the best of three to six alternating rounds each, with no other test of this file
/// running. Not a bound on time: a ratio between two clients of one server, measured in the same
/// run.
#[test]
fn throughput_agrees_with_redis_benchmark_on_redis_servers_incr_and_every_request_counts() {
    let _alone = alone();
    let redis = RedisServer::start();
    let dir = temporary_dir("bench-incr");
    let port = redis.port().to_string();
    let addr = format!("127.0.0.1:{port}");
    // The best of three alternating rounds each, or of up to six while the two are further apart
    // than the bound: a round one client loses to the machine (a writeback, another process)
    // says nothing about either.
    let requests = 300_000u64;
    let (mut ours, mut theirs, mut rounds) = (0f64, 0f64, 0u64);
    let apart = |ours: f64, theirs: f64| (ours - theirs).abs() / ours.max(theirs);
    while rounds < 3 || (rounds < 6 && apart(ours, theirs) > 0.25) {
        rounds += 1;
        let (report, stdout) =
            bench(&["resp", "--addr", &addr, "--command", "INCR {key}", "-n", "300000", "-c", "50", "-P", "16"], &dir);
        assert_eq!(u64_field(&report, "requests"), requests, "{stdout}");
        assert_eq!(u64_field(&report, "errors"), 0, "{stdout}");
        assert!(report["allowed"].is_null() && report["denied"].is_null(), "INCR is not a decision: {report}");
        assert_sane_latency(&report);
        ours = ours.max(report["throughput_per_s"].as_f64().expect("throughput"));
        theirs = theirs.max(redis_benchmark_incr(redis.port(), requests, 50, 16));
    }
    // Every request reached the server once: its own count says so.
    assert_eq!(redis.cli(&["GET", "key:0"]).trim(), (requests * rounds).to_string());
    let gap = apart(ours, theirs);
    eprintln!(
        "INCR -c 50 -P 16: tollgate bench {ours:.0}/s, redis-benchmark {theirs:.0}/s ({:.1}% apart)",
        gap * 100.0
    );
    assert!(gap <= 0.25, "tollgate bench {ours:.0}/s and redis-benchmark {theirs:.0}/s are {:.0}% apart", gap * 100.0);
}

/// `CL.THROTTLE k 15 30 60 1` on fresh keys admits 16 per key, then one per 2 s: the run's
/// admissions are exactly 16 per key plus at most the refills its duration allows.
#[test]
fn resp_decisions_are_counted_exactly_and_the_timeline_adds_up() {
    let _shared = shared();
    let serve = Tollgate::serve(&[]);
    let dir = temporary_dir("bench-resp");
    let timeline = dir.join("timeline.csv");
    let addr = serve.resp().to_string();
    let (report, _) = bench(
        &[
            "resp",
            "--addr",
            &addr,
            "--command",
            "CL.THROTTLE {key} 15 30 60 1",
            "--keys",
            "10",
            "-n",
            "5000",
            "-c",
            "8",
            "-P",
            "4",
            "--timeline",
            timeline.to_str().expect("utf-8 path"),
            "--plot",
            dir.join("run.svg").to_str().expect("utf-8 path"),
        ],
        &dir,
    );
    let (requests, allowed, denied) =
        (u64_field(&report, "requests"), u64_field(&report, "allowed"), u64_field(&report, "denied"));
    assert_eq!((requests, u64_field(&report, "errors")), (5000, 0));
    assert_eq!(allowed + denied, requests);
    let seconds = requests as f64 / report["throughput_per_s"].as_f64().expect("throughput");
    let refills = 10.0 * (seconds / 2.0).ceil();
    assert!(allowed >= 160 && allowed as f64 <= 160.0 + refills, "{allowed} admitted in {seconds:.1} s: {report}");
    // Key by key: each within its own limit (16 at once, then one per 2 s), adding up to the total.
    let per_key: Vec<u64> = report["allowed_per_key"]
        .as_array()
        .expect("allowed_per_key")
        .iter()
        .map(|v| v.as_u64().expect("a count"))
        .collect();
    assert_eq!((per_key.len(), per_key.iter().sum::<u64>()), (10, allowed), "{report}");
    let per_key_bound = 16.0 + (seconds / 2.0).ceil();
    assert!(per_key.iter().all(|&n| n >= 16 && n as f64 <= per_key_bound), "{per_key:?} in {seconds:.1} s");
    assert_sane_latency(&report);

    let csv = std::fs::read_to_string(&timeline).expect("timeline");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("second,requests,errors,allowed,denied,p50_us,p90_us,p99_us,p999_us,max_us"));
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(String::from).collect()).collect();
    assert!(!rows.is_empty());
    let column = |i: usize| rows.iter().map(|r| r[i].parse::<u64>().unwrap_or(0)).sum::<u64>();
    assert_eq!((column(1), column(2), column(3), column(4)), (requests, 0, allowed, denied));
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 10, "{row:?}");
        assert_eq!(row[0], (i + 1).to_string());
    }
    let svg = std::fs::read_to_string(dir.join("run.svg")).expect("the plot");
    assert!(svg.starts_with("<svg") && svg.contains("decisions per second"), "{}", &svg[..svg.len().min(200)]);
}

/// An open loop sends exactly rate × duration requests, whatever the server's speed.
#[test]
fn an_open_loop_sends_its_schedule() {
    let _shared = shared();
    let serve = Tollgate::serve(&[]);
    let dir = temporary_dir("bench-open");
    let addr = serve.resp().to_string();
    let (report, _) = bench(
        &[
            "resp",
            "--addr",
            &addr,
            "--command",
            "TG.CHECK {key} gcra 300 1000",
            "--rate",
            "400",
            "--duration",
            "2s",
            "-c",
            "4",
        ],
        &dir,
    );
    assert_eq!((u64_field(&report, "requests"), u64_field(&report, "errors")), (800, 0));
    // 300 a second, burst 300, from idle, over 2 s: at most 300 + 600 of 800, and the
    // first 300 at least.
    let allowed = u64_field(&report, "allowed");
    assert!((300..=800).contains(&allowed), "{report}");
    assert_sane_latency(&report);
}

/// HTTP `/v1/check` and Envoy's gRPC API: the same exact counting through other front ends.
#[test]
fn http_and_grpc_decisions_are_counted_exactly() {
    let _shared = shared();
    let dir = temporary_dir("bench-http-grpc");
    let config = dir.join("ratelimit.yaml");
    std::fs::write(
        &config,
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 40\n",
    )
    .expect("config");
    let serve = Tollgate::serve(&["--envoy-config", config.to_str().expect("utf-8 path")]);

    // 30 an hour from idle on 4 keys: 30 each, and 1,000 requests leave no room for a refill.
    let url = format!("http://{}/v1/check", serve.http());
    let (report, _) = bench(
        &[
            "http",
            "--url",
            &url,
            "--method",
            "POST",
            "--body",
            r#"{"key":"{key}","limit":"30/h"}"#,
            "--keys",
            "4",
            "-n",
            "1000",
            "-c",
            "8",
        ],
        &dir,
    );
    assert_eq!((u64_field(&report, "requests"), u64_field(&report, "errors")), (1000, 0));
    assert_eq!((u64_field(&report, "allowed"), u64_field(&report, "denied")), (120, 880), "{report}");

    // A fixed hour window of 40 per user on 3 users; a run crossing the hour sees two windows.
    let addr = serve.grpc().to_string();
    let (report, _) = bench(
        &[
            "grpc",
            "--addr",
            &addr,
            "--domain",
            "bench",
            "--descriptor",
            "user={key}",
            "--keys",
            "3",
            "-n",
            "600",
            "-c",
            "2",
            "-P",
            "4",
        ],
        &dir,
    );
    assert_eq!((u64_field(&report, "requests"), u64_field(&report, "errors")), (600, 0));
    let allowed = u64_field(&report, "allowed");
    assert!(allowed == 120 || (120..=240).contains(&allowed), "{report}");
    assert_eq!(allowed + u64_field(&report, "denied"), 600);
}

/// Error replies and a server that is not there are errors, counted and explained; nothing is
/// dropped from the count.
#[test]
fn errors_are_counted_and_named() {
    let _shared = shared();
    let serve = Tollgate::serve(&[]);
    let dir = temporary_dir("bench-errors");
    let addr = serve.resp().to_string();
    let (report, stdout) =
        bench(&["resp", "--addr", &addr, "--command", "CL.THROTTLE {key} x 30 60", "-n", "300", "-c", "3"], &dir);
    assert_eq!((u64_field(&report, "requests"), u64_field(&report, "errors")), (300, 300));
    assert!(stdout.contains("Couldn't parse as integer: x"), "{stdout}");

    // Nothing listens on a port just freed: refused before the run, naming the address.
    let free = format!("127.0.0.1:{}", free_port());
    let refusal = refused(&["resp", "--addr", &free, "--command", "PING"]);
    assert!(refusal.contains(&format!("cannot connect to {free}")), "{refusal}");
}

/// A server that dies mid-run: every request still counted, answered or failed, and the open
/// loop keeps its schedule.
#[test]
fn a_server_dying_mid_run_costs_no_request() {
    let _shared = shared();
    let serve = Tollgate::serve(&[]);
    let dir = temporary_dir("bench-dying");
    let json = dir.join("report.json");
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "resp", "--addr", &serve.resp().to_string(), "--command", "TG.CHECK {key} gcra 1000 1000"])
        .args(["--rate", "200", "--duration", "3s", "-c", "2", "-q", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("tollgate runs");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    drop(serve);
    let output = child.wait_with_output().expect("bench ends");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report")).expect("JSON");
    let (requests, errors) = (u64_field(&report, "requests"), u64_field(&report, "errors"));
    assert_eq!(requests, 600, "{stdout}");
    assert_eq!(u64_field(&report, "allowed") + u64_field(&report, "denied") + errors, requests, "{report}");
    assert!(errors > 0 && errors < requests, "some answered before, the rest failed after: {stdout}");
}

#[test]
fn bad_flags_are_refused_with_their_reason() {
    let _shared = shared();
    let resp = ["resp", "--addr", "127.0.0.1:1", "--command", "PING"];
    let with = |extra: &[&str]| refused(&[&resp[..], extra].concat());
    assert!(with(&["--rate", "0"]).contains("--rate must be above 0"));
    assert!(with(&["--rate", "nan"]).contains("--rate must be above 0"));
    assert!(with(&["--zipf", "-1"]).contains("--zipf must be a positive number"));
    assert!(with(&["-c", "0"]).contains("must be at least 1"));
    assert!(with(&["--timeout", "2m"]).contains("--timeout is at most 60s"));
    assert!(with(&["--duration", "2h"]).contains("--duration is at most 1h"));
    assert!(with(&["-n", "10", "--duration", "1s"]).contains("cannot be used with"));
    assert!(with(&["--plot", "x.png"]).contains("PNG is not built in"));
    assert!(refused(&["resp", "--addr", "127.0.0.1:1", "--command", "\"x"]).contains("unbalanced"));
    let http = refused(&["http", "--url", "http://127.0.0.1:1/", "-P", "2"]);
    assert!(http.contains("-P must be 1 for HTTP"), "{http}");
    assert!(refused(&["http", "--url", "https://127.0.0.1:1/"]).contains("https is not built into tollgate bench"));
    assert!(
        refused(&["grpc", "--addr", "127.0.0.1:1", "--domain", "d", "--descriptor", "novalue"]).contains("key=value")
    );
}
