//! Reserve → settle on the HTTP API (`POST /v1/reserve`, `/v1/settle`, driven by curl) and on
//! RESP (`TG.RESERVE`, `TG.SETTLE`, driven by redis-cli), each on the memory store and on a real
//! Redis: the estimate charged, the settle correcting it once (above: charged past the limit;
//! below: refunded), a second settle, one after the deadline and an unknown id refused with their
//! own status or error code, a reservation made on one front end settled on the other, and the
//! reservations' metrics.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Server, T0};
use tollgate_core::ManualClock;
use tollgate_rules::Rules;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

// A fixed window of 50 days: no test meets a window's end on Redis's own clock.
const RULES: &str =
    "[[rules]]\nname = \"tokens\"\nlimit = \"100/50d\"\nalgorithm = \"fixed-window\"\nkey = [\"key\"]\n";

/// Where the server keeps its state, and how a reservation is made to pass its deadline.
enum Backing {
    Memory(Arc<ManualClock>),
    /// Kept running for the test's length.
    Redis {
        _server: Box<RedisServer>,
    },
}

impl Backing {
    async fn start(redis: bool) -> (Server, Backing) {
        let clock = Arc::new(ManualClock::new(T0));
        let rules = Rules::parse(RULES, "reservations").unwrap();
        let (store, backing) = if redis {
            let server = RedisServer::start();
            (StoreConfig::redis(&server.url()), Backing::Redis { _server: Box::new(server) })
        } else {
            (StoreConfig::parse("memory").unwrap(), Backing::Memory(clock.clone()))
        };
        let server = Server::start(Config { rules, store, clock, ..Config::default() }).await;
        (server, backing)
    }

    /// Past a reservation of 1 ms's deadline.
    async fn pass_deadline(&self) {
        match self {
            Backing::Memory(clock) => clock.advance(Duration::from_secs(1)),
            Backing::Redis { .. } => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn post(server: &Server, path: &str, body: &str) -> (u16, String) {
    let out = server.curl(&["-H", "content-type: application/json", "-d", body, &format!("HTTP{path}")]);
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = out.rsplit("\r\n\r\n").next().unwrap_or_default().to_string();
    (status, body)
}

fn field(body: &str, name: &str) -> serde_json::Value {
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    json[name].clone()
}

async fn over_http(server: &Server, backing: &Backing) {
    let (status, body) = post(server, "/v1/reserve", r#"{"key":"acct","limit_name":"tokens","estimate":40}"#);
    assert_eq!((status, field(&body, "remaining")), (200, 60.into()), "{body}");
    let id = field(&body, "id").as_str().unwrap().to_string();
    assert!(field(&body, "deadline_ms").as_u64().unwrap() > 0);
    let settle = format!(r#"{{"id":"{id}","actual":55}}"#);
    let (status, body) = post(server, "/v1/settle", &settle);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (field(&body, "settled"), field(&body, "estimate"), field(&body, "actual")),
        (true.into(), 40.into(), 55.into())
    );
    let (status, body) = post(server, "/v1/settle", &settle);
    assert_eq!((status, field(&body, "error")), (409, format!("reservation {id} was settled already").into()));

    // 45 left: 50 is denied, nothing charged, no id.
    let (status, body) = post(server, "/v1/reserve", r#"{"key":"acct","limit_name":"tokens","estimate":50}"#);
    assert_eq!((status, field(&body, "remaining"), field(&body, "id")), (429, 45.into(), serde_json::Value::Null));

    let unknown = format!(r#"{{"id":"{}.99999999999999","actual":1}}"#, "0".repeat(32));
    assert_eq!(post(server, "/v1/settle", &unknown).0, 404);
    let (status, body) = post(server, "/v1/settle", r#"{"id":"bogus","actual":1}"#);
    assert_eq!(status, 400, "{body}");
    assert!(field(&body, "error").as_str().unwrap().starts_with("malformed reservation id"), "{body}");
    let (status, body) = post(server, "/v1/reserve", r#"{"key":"acct","estimate":1}"#);
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        post(server, "/v1/reserve", r#"{"key":"acct","limit_name":"tokens","estimate":1,"ttl_ms":3600001}"#);
    assert_eq!(status, 400, "{body}");

    // Past its deadline: refused, and it stays charged at its estimate (5).
    let (_, body) = post(server, "/v1/reserve", r#"{"key":"acct","limit_name":"tokens","estimate":5,"ttl_ms":1}"#);
    let id = field(&body, "id").as_str().unwrap().to_string();
    backing.pass_deadline().await;
    let (status, body) = post(server, "/v1/settle", &format!(r#"{{"id":"{id}","actual":0}}"#));
    assert_eq!(status, 410, "{body}");
    let (_, body) = post(server, "/v1/check", r#"{"key":"acct","limit_name":"tokens","cost":0}"#);
    assert_eq!(field(&body, "remaining"), 40, "{body}");

    // An inline limit beside the named one, all or nothing, settled lower: refunded on both.
    let both = r#"{"key":"acct","limit_names":["tokens"],"limit":"1000/50d","algorithm":"fixed-window","estimate":30}"#;
    let (status, body) = post(server, "/v1/reserve", both);
    assert_eq!((status, field(&body, "remaining")), (200, 10.into()), "{body}");
    let id = field(&body, "id").as_str().unwrap().to_string();
    assert_eq!(post(server, "/v1/settle", &format!(r#"{{"id":"{id}","actual":10}}"#)).0, 200);
    let (_, body) = post(server, "/v1/check", r#"{"key":"acct","limit_name":"tokens","cost":0}"#);
    assert_eq!(field(&body, "remaining"), 30, "{body}");
}

/// redis-cli's reply lines.
fn cli(server: &Server, args: &[&str]) -> Vec<String> {
    server.cli(args).lines().map(str::to_string).collect()
}

/// redis-cli's error line (it prints an empty line after).
fn cli_error(server: &Server, args: &[&str]) -> String {
    cli(server, args).swap_remove(0)
}

async fn over_resp(server: &Server, backing: &Backing) {
    let reply = cli(server, &["TG.RESERVE", "user", "40", "60000", "tokens"]);
    assert_eq!(reply[..3], ["1", "100", "60"], "{reply:?}");
    let id = reply[5].clone();
    assert!(reply[6].parse::<u64>().unwrap() > 0, "{reply:?}");
    assert_eq!(cli(server, &["TG.SETTLE", &id, "120"]), ["40", "120"]);
    assert_eq!(cli_error(server, &["TG.SETTLE", &id, "120"]), format!("SETTLED reservation {id} was settled already"));
    // Charged past the limit: the next request pays.
    let denied = cli(server, &["TG.RESERVE", "user", "1", "60000", "tokens"]);
    assert_eq!((denied[0].as_str(), denied[2].as_str(), denied[5].as_str(), denied[6].as_str()), ("0", "0", "", "0"));
    let unknown = format!("{}.99999999999999", "0".repeat(32));
    assert_eq!(
        cli_error(server, &["TG.SETTLE", &unknown, "1"]),
        format!("NORESERVATION no open reservation {unknown}")
    );
    assert_eq!(cli_error(server, &["TG.SETTLE", "x"]), "ERR Usage: TG.SETTLE <id> <actual>");
    let reply = cli(server, &["TG.RESERVE", "user", "1", "60000", "nope"]);
    assert!(reply[0].starts_with("ERR no rule or limit named \"nope\""), "{reply:?}");

    // Reserved over RESP, settled over HTTP (one engine); then expired.
    let reply = cli(server, &["TG.RESERVE", "other", "10", "60000", "tokens"]);
    let (status, _) = post(server, "/v1/settle", &format!(r#"{{"id":"{}","actual":3}}"#, reply[5]));
    assert_eq!(status, 200);
    let reply = cli(server, &["TG.RESERVE", "other", "10", "1", "tokens"]);
    backing.pass_deadline().await;
    let late = cli(server, &["TG.SETTLE", &reply[5], "0"]);
    assert!(late[0].starts_with("EXPIRED reservation"), "{late:?}");
    assert_eq!(cli(server, &["TG.LIMIT", "tokens", "other", "COST", "0"])[2], "87");
}

async fn metrics(server: &Server) -> String {
    server.curl(&["HTTP/metrics"])
}

async fn every_front_end(redis: bool) {
    let (server, backing) = Backing::start(redis).await;
    over_http(&server, &backing).await;
    over_resp(&server, &backing).await;
    let text = metrics(&server).await;
    for line in [
        "tollgate_reservations_total{event=\"opened\"} 6",
        "tollgate_reservations_total{event=\"denied\"} 2",
        "tollgate_reservations_total{event=\"settled\"} 4",
        "tollgate_reservations_total{event=\"settled_already\"} 2",
        "tollgate_reservations_total{event=\"expired\"} 2",
        "tollgate_reservations_total{event=\"unknown\"} 3",
        "tollgate_reservation_settles_total{estimate=\"under\"} 2",
        "tollgate_reservation_settles_total{estimate=\"over\"} 2",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_and_settle_on_every_front_end_in_memory() {
    every_front_end(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_and_settle_on_every_front_end_on_redis() {
    every_front_end(true).await;
}

/// A reserve names at most 16 limits on every front end: `TG.RESERVE` refuses a 17th; so must
/// `POST /v1/reserve` (each named limit is a check decided, charged and kept in the reservation's
/// record: a body of 5,000 names is 5,000 checks and a record of 5,000 lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reserve_names_at_most_16_limits_as_resp_does() {
    let (server, _backing) = Backing::start(false).await;
    let names = vec!["tokens"; 17];
    let body = serde_json::json!({ "key": "many", "limit_names": names, "estimate": 1 }).to_string();
    let (status, answer) = post(&server, "/v1/reserve", &body);
    assert_eq!(status, 400, "a reserve of 17 limits: {status} {answer}");
    assert_eq!(field(&answer, "error"), "a reserve names at most 16 limits, got 17");
    let mut args = vec!["TG.RESERVE", "many", "1", "1000"];
    args.extend(names);
    assert_eq!(cli_error(&server, &args), "ERR TG.RESERVE names at most 16 limits, got 17");
}
