//! What `GET /metrics` shows, served in-process and read over loopback with curl: a fresh
//! `tollgate serve` has no decision series (they appear with their first decision, and only for
//! what happened), a Redis store's error and fallback counters exist from start-up at 0 and then
//! count, and `serve` and `proxy` answer the same OpenMetrics format. Every exposition is checked
//! for its structure (a `# TYPE` before each sample, unique series, `# EOF` last).

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use common::Server;
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::proxy::{ProxyConfig, run};
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

/// The body of an HTTP response curl printed with `-i`, and its `content-type`.
fn split(response: &str) -> (String, String) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    let content_type = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(name, _)| name.eq_ignore_ascii_case("content-type")))
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default();
    (body.to_string(), content_type)
}

/// serve's `/metrics`: the exposition (checked) and its content type.
fn scrape(server: &Server) -> (String, String) {
    let (body, content_type) = split(&server.curl(&["HTTP/metrics"]));
    check_exposition(&body);
    (body, content_type)
}

/// The OpenMetrics text format's structure, as a parser would reject it: every sample belongs to
/// the family whose `# TYPE` precedes it (with the suffixes its type allows), no family or series
/// twice, `# EOF` as the last line.
fn check_exposition(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition ends with # EOF:\n{text}");
    let (mut families, mut series) = (HashSet::new(), HashSet::new());
    let mut family: Option<(&str, &str)> = None;
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            assert!(families.insert(name), "family {name} declared twice:\n{text}");
            family = Some((name, kind));
        } else if !line.starts_with("# HELP ") && !line.starts_with("# UNIT ") {
            let (sample, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line:?}"));
            assert!(value.parse::<f64>().is_ok(), "bad value: {line:?}");
            let name = sample.split('{').next().unwrap();
            let (family, kind) = family.unwrap_or_else(|| panic!("{line:?} has no # TYPE before it:\n{text}"));
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "gauge" => &[""],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                other => panic!("unexpected type {other} in {text}"),
            };
            let suffix = name.strip_prefix(family).unwrap_or_else(|| panic!("{name} is not of {family}:\n{text}"));
            assert!(suffixes.contains(&suffix), "{name} is not a {kind} sample of {family}");
            assert!(series.insert(sample), "series {sample} twice:\n{text}");
        }
    }
}

/// The samples (name and labels) whose name starts with `prefix`, with their values, sorted.
fn samples<'t>(text: &'t str, prefix: &str) -> Vec<(&'t str, f64)> {
    let mut samples: Vec<(&str, f64)> = text
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(s, v)| (s, v.parse().unwrap()))
        .collect();
    // A family's series come in no particular order.
    samples.sort_by(|a, b| a.0.cmp(b.0));
    samples
}

/// The value of one series (`None` if it is not shown).
fn value(text: &str, series: &str) -> Option<f64> {
    samples(text, series).into_iter().find(|(s, _)| *s == series).map(|(_, v)| v)
}

fn rules(text: &str) -> Rules {
    Rules::parse(text, "test").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_serve_shows_no_decision_series_until_a_decision_makes_its_own() {
    let config = Config { rules: rules("[limits.api]\nlimit = \"1/1m\"\n"), ..common::manual_config() };
    let server = Server::start(config).await;
    let (fresh, _) = scrape(&server);
    for family in ["tollgate_decisions", "tollgate_rule_decisions", "tollgate_config_reloads"] {
        assert!(!fresh.contains(family), "no {family} before any decision or reload:\n{fresh}");
    }
    // The memory store cannot fail: no store error series to watch.
    assert!(!fresh.contains("tollgate_store_errors"), "{fresh}");
    let zeros: Vec<_> =
        samples(&fresh, "tollgate_").into_iter().filter(|(s, v)| *v == 0.0 && s.contains('{')).collect();
    assert_eq!(
        zeros,
        [
            ("tollgate_store_evictions_total{kind=\"idle\"}", 0.0),
            ("tollgate_store_evictions_total{kind=\"live\"}", 0.0)
        ],
        "the only labelled zeros are the memory store's evictions:\n{fresh}"
    );

    assert!(server.cli(&["CL.THROTTLE", "u", "15", "30", "60"]).starts_with('0'));
    assert!(server.cli(&["TG.CHECK", "u", "leaky-bucket", "1", "60000"]).starts_with('1'));
    assert!(server.cli(&["TG.CHECK", "u", "leaky-bucket", "1", "60000"]).starts_with('0'));
    assert!(server.cli(&["TG.PEEK", "u", "sliding-log", "1", "60000"]).starts_with('1'));
    assert!(server.cli(&["TG.LIMIT", "api", "u"]).starts_with('1'));
    let (after, _) = scrape(&server);
    assert_eq!(
        samples(&after, "tollgate_decisions_total"),
        [
            ("tollgate_decisions_total{outcome=\"allowed\",algorithm=\"gcra\",limit=\"cl.throttle\"}", 1.0),
            ("tollgate_decisions_total{outcome=\"allowed\",algorithm=\"leaky-bucket\",limit=\"tg.check\"}", 1.0),
            ("tollgate_decisions_total{outcome=\"denied\",algorithm=\"leaky-bucket\",limit=\"tg.check\"}", 1.0),
        ],
        "one series per thing that happened, a peek none:\n{after}"
    );
    assert_eq!(
        samples(&after, "tollgate_rule_decisions_total"),
        [("tollgate_rule_decisions_total{rule=\"api\",outcome=\"allowed\"}", 1.0)]
    );
    // Every decision timed, the peek included, under its front end; HTTP's appear with its first.
    let latency = "tollgate_decision_duration_seconds";
    assert_eq!(value(&after, &format!("{latency}_count{{frontend=\"resp\"}}")), Some(5.0), "{after}");
    assert!(!after.contains("frontend=\"http\""), "{after}");
    let body = r#"{"key": "h", "limit": "1/1m"}"#;
    assert!(
        server.curl(&["-H", "content-type: application/json", "-d", body, "HTTP/v1/check"]).starts_with("HTTP/1.1 200")
    );
    let named = r#"{"key": "u", "limit_name": "api"}"#;
    assert!(
        server
            .curl(&["-H", "content-type: application/json", "-d", named, "HTTP/v1/check"])
            .starts_with("HTTP/1.1 429")
    );
    let (http, _) = scrape(&server);
    assert_eq!(value(&http, &format!("{latency}_count{{frontend=\"http\"}}")), Some(2.0), "{http}");
    assert_eq!(value(&http, &format!("{latency}_bucket{{le=\"+Inf\",frontend=\"http\"}}")), Some(2.0), "{http}");
    // Timed by the engine's clock: this test's manual clock never moves.
    assert_eq!(value(&http, &format!("{latency}_sum{{frontend=\"http\"}}")), Some(0.0), "{http}");
    assert_eq!(value(&http, "tollgate_store_up"), Some(1.0), "memory is always up:\n{http}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_up_follows_the_probe_of_redis() {
    let mut redis = RedisServer::start();
    let server = serve_on_redis(redis.url()).await;
    let (fresh, _) = scrape(&server);
    assert!(fresh.contains("# TYPE tollgate_store_up gauge\n"), "{fresh}");
    assert_eq!(value(&fresh, "tollgate_store_up"), Some(1.0), "{fresh}");
    // Probed every second: wait for each change (no wall-clock assertion).
    redis.kill();
    store_up_becomes(&server, 0.0).await;
    redis.restart();
    store_up_becomes(&server, 1.0).await;
    server.stop().await;
}

/// Waits until `tollgate_store_up` is `up`, or fails after a generous deadline.
async fn store_up_becomes(server: &Server, up: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (text, _) = scrape(server);
        if value(&text, "tollgate_store_up") == Some(up) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "tollgate_store_up never became {up}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `serve` on the Redis at `url` (a real one, or a port nothing listens on), default policy `local`.
async fn serve_on_redis(url: String) -> Server {
    Server::start(Config { store: StoreConfig::redis(&url), ..common::manual_config() }).await
}

const STORE_COUNTERS: [&str; 4] = [
    "tollgate_store_fallbacks",
    "tollgate_store_backend_errors",
    "tollgate_store_breaker_opened",
    "tollgate_store_charges_paid",
];
const STORE_ERROR_KINDS: [&str; 4] = ["backend", "timeout", "bad_state", "request"];

fn store_errors(text: &str, kind: &str) -> Option<f64> {
    value(text, &format!("tollgate_store_errors_total{{kind=\"{kind}\"}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_counters_exist_from_start_up_and_count_what_they_say() {
    let mut redis = RedisServer::start();
    let server = serve_on_redis(redis.url()).await;
    let (fresh, _) = scrape(&server);
    for counter in STORE_COUNTERS {
        assert!(fresh.contains(&format!("# TYPE {counter} counter\n")), "{counter} is a counter:\n{fresh}");
        assert_eq!(value(&fresh, &format!("{counter}_total")), Some(0.0), "{counter} at 0:\n{fresh}");
    }
    assert!(fresh.contains("# TYPE tollgate_store_errors counter\n"), "{fresh}");
    for kind in STORE_ERROR_KINDS {
        assert_eq!(store_errors(&fresh, kind), Some(0.0), "store errors of kind {kind} at 0:\n{fresh}");
    }

    assert!(server.cli(&["CL.THROTTLE", "u", "15", "30", "60"]).starts_with('0'));
    redis.kill();
    // The default policy (`local`) answers while Redis is down: a fallback, not an error.
    assert!(server.cli(&["CL.THROTTLE", "u", "15", "30", "60"]).starts_with('0'));
    let (down, _) = scrape(&server);
    assert_eq!(value(&down, "tollgate_store_fallbacks_total"), Some(1.0), "{down}");
    // At least the call; the background flush of the local admission may have failed too.
    assert!(value(&down, "tollgate_store_backend_errors_total") >= Some(1.0), "{down}");
    assert_eq!(store_errors(&down, "backend"), Some(0.0), "absorbed by the policy:\n{down}");
    assert_eq!(
        value(&down, "tollgate_decisions_total{outcome=\"allowed\",algorithm=\"gcra\",limit=\"cl.throttle\"}"),
        Some(2.0)
    );
    // A reset has no fallback: its error reaches the caller and counts as a store error.
    assert!(server.cli(&["TG.RESET", "u", "gcra", "15", "60000"]).contains("ERR"));
    let (reset, _) = scrape(&server);
    let returned: f64 = ["backend", "timeout"].iter().filter_map(|k| store_errors(&reset, k)).sum();
    assert_eq!(returned, 1.0, "{reset}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answered_shows_the_same_counters_at_start_up() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", unused.local_addr().unwrap());
    drop(unused);
    let server = serve_on_redis(url).await;
    let (fresh, _) = scrape(&server);
    for counter in STORE_COUNTERS {
        assert_eq!(value(&fresh, &format!("{counter}_total")), Some(0.0), "{counter} at 0:\n{fresh}");
    }
    for kind in STORE_ERROR_KINDS {
        assert_eq!(store_errors(&fresh, kind), Some(0.0), "{kind}:\n{fresh}");
    }
    assert!(server.cli(&["TG.CHECK", "u", "gcra", "1", "60000"]).starts_with('1'));
    let (after, _) = scrape(&server);
    assert_eq!(value(&after, "tollgate_store_fallbacks_total"), Some(1.0), "{after}");
    assert!(value(&after, "tollgate_store_backend_errors_total") >= Some(1.0), "{after}");
    assert_eq!(STORE_ERROR_KINDS.iter().filter_map(|k| store_errors(&after, k)).sum::<f64>(), 0.0, "{after}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_and_serve_answer_the_same_openmetrics_content_type() {
    let server = Server::start(common::manual_config()).await;
    let (_, serve_type) = scrape(&server);
    server.stop().await;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_at = admin.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = ProxyConfig {
        upstream: "http://127.0.0.1:9".into(),
        rules: rules("[limits.api]\nlimit = \"1/1m\"\n"),
        rules_file: None,
        options: Default::default(),
        upstream_timeout: Duration::from_secs(1),
        tls: None,
        limits: Default::default(),
    };
    let config = common::manual_config();
    let task = tokio::spawn(async move {
        run(&config, proxy, listener, admin, async move {
            let _ = stopped.await;
        })
        .await
    });
    let response = tokio::task::spawn_blocking(move || {
        let url = format!("http://{admin_at}/metrics");
        Command::new("curl").args(["-s", "-i", "--max-time", "5", &url]).output().expect("curl")
    })
    .await
    .unwrap();
    let (body, proxy_type) = split(&String::from_utf8_lossy(&response.stdout));
    check_exposition(&body);
    assert!(!body.contains("tollgate_rule_decisions"), "no decision yet:\n{body}");
    drop(stop);
    task.await.unwrap().unwrap();

    assert_eq!(serve_type, tollgate_server::metrics::CONTENT_TYPE);
    assert_eq!(proxy_type, tollgate_server::metrics::CONTENT_TYPE);
}
