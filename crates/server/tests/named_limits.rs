//! `TG.LIMIT name key` and HTTP `limit_name` decide through the engine's admission, as a request
//! the rules count does: the rule's mitigation `timeout` holds the key after it went over, a
//! `dry-run` rule never refuses, `when_rate_above` refuses a key measured too fast, and each
//! outcome is in the rule's metrics (before: `engine/src/direct.rs` checked the limit alone).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Server, T0};
use tollgate_core::ManualClock;
use tollgate_rules::Rules;
use tollgate_server::Config;

const RULES: &str = r#"
[[rules]]
name = "login"
limit = "2/1m"
key = ["key"]
[rules.mitigation]
timeout = "1h"

[[rules]]
name = "trial"
limit = "1/1m"
key = ["key"]
[rules.mitigation]
action = "dry-run"

[[rules]]
name = "burst"
limit = "1000/1m"
key = ["key"]
when_rate_above = "3/s"
"#;

async fn start() -> (Server, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let rules = Rules::parse(RULES, "named").unwrap();
    let server = Server::start(Config { rules, clock: clock.clone(), ..Config::default() }).await;
    (server, clock)
}

/// `TG.LIMIT`'s first reply line: 1 admitted, 0 denied.
fn limit(server: &Server, name: &str, key: &str) -> String {
    server.cli(&["TG.LIMIT", name, key]).lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mitigation_timeout_holds_the_key_on_every_front_end() {
    let (server, clock) = start().await;
    assert_eq!([limit(&server, "login", "u"), limit(&server, "login", "u")], ["1", "1"]);
    assert_eq!(limit(&server, "login", "u"), "0", "over");
    // Two minutes on the bucket has refilled: the timeout still holds the key (before: admitted).
    clock.advance(Duration::from_secs(120));
    assert_eq!(limit(&server, "login", "u"), "0", "held for the rule's timeout");
    let over = server.curl(&[
        "-H",
        "content-type: application/json",
        "-d",
        r#"{"key": "u", "limit_name": "login"}"#,
        "HTTP/v1/check",
    ]);
    assert!(over.starts_with("HTTP/1.1 429"), "{over}");
    assert!(over.contains("retry-after: 3480"), "the timeout's remaining 58 minutes: {over}");
    clock.advance(Duration::from_secs(3600));
    assert_eq!(limit(&server, "login", "u"), "1", "after the timeout");
    assert_eq!(limit(&server, "login", "other"), "1", "other keys were never held");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_never_refuses_and_a_fast_key_is_refused() {
    let (server, _clock) = start().await;
    for _ in 0..3 {
        assert_eq!(limit(&server, "trial", "u"), "1", "dry-run: admitted whatever the limit says");
    }
    let metrics = server.curl(&["HTTP/metrics"]);
    assert!(metrics.contains(r#"tollgate_rule_decisions_total{rule="trial",outcome="dry_run"} 2"#), "{metrics}");
    // The manual clock stands still: every call is at one instant, far above 3/s.
    let replies: Vec<String> = (0..8).map(|_| limit(&server, "burst", "u")).collect();
    assert!(replies.iter().any(|r| r == "0"), "when_rate_above refuses a key measured too fast: {replies:?}");
    server.stop().await;
}

/// Issue 36 item 4, through the RESP listener: `victim` over the enforced `login` rule (held
/// 2 minutes), then 110,000 keys over a dry-run rule held an hour, pipelined (more than the
/// 100,000 holds the table keeps). Before: the flood dropped `victim`'s hold, and `TG.LIMIT login
/// victim` was admitted (or denied for the limit's second only). On the system clock: each hold
/// ends at its own instant, as in production.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_flood_keeps_an_enforced_hold() {
    let rules = Rules::parse(
        "[[rules]]\nname = \"login\"\nlimit = \"1/1s\"\nkey = [\"key\"]\n[rules.mitigation]\ntimeout = \"2m\"\n\
         [[rules]]\nname = \"trial\"\nlimit = \"1/1h\"\nkey = [\"key\"]\n[rules.mitigation]\naction = \"dry-run\"\n\
         timeout = \"1h\"\n",
        "flood",
    )
    .unwrap();
    let server = Server::start(Config { rules, ..Config::default() }).await;
    assert_eq!([limit(&server, "login", "victim"), limit(&server, "login", "victim")], ["1", "0"]);
    let mut flood = Vec::with_capacity(8 << 20);
    for i in 0..110_000 {
        let command = format!("TG.LIMIT trial k{i}\r\n");
        flood.extend_from_slice(command.as_bytes());
        flood.extend_from_slice(command.as_bytes());
    }
    flood.extend_from_slice(b"PING\r\n");
    let at = server.resp;
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(at).unwrap();
        let mut reader = stream.try_clone().unwrap();
        let writer = std::thread::spawn(move || stream.write_all(&flood).unwrap());
        // Replies read as they come (the server holds at most its output limit), to the PONG.
        let (mut tail, mut buffer) = (Vec::new(), vec![0; 64 << 10]);
        while !tail.ends_with(b"+PONG\r\n") {
            let n = reader.read(&mut buffer).unwrap();
            assert!(n > 0, "the server closed the connection");
            tail.extend_from_slice(&buffer[..n]);
            tail.drain(..tail.len().saturating_sub(16));
        }
        writer.join().unwrap();
    })
    .await
    .unwrap();
    let metrics = server.curl(&["HTTP/metrics"]);
    let dropped = metrics.lines().find_map(|l| l.strip_prefix("tollgate_blocks_dropped_total "));
    assert!(dropped.and_then(|d| d.trim().parse::<u64>().ok()).unwrap_or(0) > 0, "the table was full: {dropped:?}");
    let reply = server.cli(&["TG.LIMIT", "login", "victim"]);
    let lines: Vec<&str> = reply.lines().collect();
    let retry_ms: u64 = lines.get(3).and_then(|l| l.parse().ok()).unwrap_or(0);
    assert!(lines.first() == Some(&"0") && retry_ms > 60_000, "held for the timeout's rest: {reply:?}");
    server.stop().await;
}
