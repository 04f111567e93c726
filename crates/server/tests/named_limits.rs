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
    let over = server.curl(&["-d", r#"{"key": "u", "limit_name": "login"}"#, "HTTP/v1/check"]);
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
