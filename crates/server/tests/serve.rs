//! `tollgate serve` in-process on port 0, driven by real clients: the `redis` crate, redis-cli,
//! redis-benchmark and curl; malformed input; the connection limit; graceful shutdown.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::Server;
use tollgate_server::{Config, RespBounds, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

fn config_with_limits() -> Config {
    let rules = tollgate_rules::Rules::parse(
        "[limits.api]\nlimit = \"2/1m\"\n[limits.login]\nalgorithm = \"sliding-log\"\nlimit = \"1/1h\"\n",
        "test",
    )
    .unwrap();
    Config { rules, ..common::manual_config() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_answers_like_redis_cell_over_the_redis_crate() {
    let server = Server::start(common::manual_config()).await;
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    let throttle = |quantity: i64| {
        let mut cmd = redis::cmd("CL.THROTTLE");
        cmd.arg("user123").arg(15).arg(30).arg(60).arg(quantity);
        cmd
    };
    // redis-cell's README example: allowed, limit 16, 15 remaining, no retry, reset in 2 s.
    let reply: Vec<i64> = throttle(1).query_async(&mut con).await.unwrap();
    assert_eq!(reply, [0, 16, 15, -1, 2]);
    // A quantity above the capacity: limited, remaining unchanged, retry -1.
    let reply: Vec<i64> = throttle(17).query_async(&mut con).await.unwrap();
    assert_eq!(reply, [1, 16, 15, -1, 2]);
    // Pipelined: 15 more pass, then denials with a retry of 2 s (one emission interval, rounded up).
    let mut pipe = redis::pipe();
    for _ in 0..20 {
        pipe.add_command(throttle(1));
    }
    let replies: Vec<Vec<i64>> = pipe.query_async(&mut con).await.unwrap();
    assert_eq!(replies.iter().filter(|r| r[0] == 0).count(), 15);
    assert_eq!(replies[19], [1, 16, 0, 2, 32]);

    for (args, wanted) in [
        (vec!["k", "1", "2"], "Usage: CL.THROTTLE"),
        (vec!["k", "x", "30", "60"], "Couldn't parse as integer: x"),
        (vec!["k", "-1", "30", "60"], "max_burst must be >= 0"),
        (vec!["k", "1", "0", "60"], "count must be >= 1"),
        (vec!["k", "9223372036854775807", "30", "60"], "burst × emission interval is"),
        (vec!["k", "1", "30", "60", "-5"], "quantity must be >= 0"),
        (vec!["k", "1", "2", "9223372036854775807"], "above its maximum of 4320000000000000 ns (50 days)"),
    ] {
        let error = redis::cmd("CL.THROTTLE").arg(&args).query_async::<redis::Value>(&mut con).await.unwrap_err();
        assert!(error.to_string().contains(wanted), "{args:?}: {error}");
    }
    // The connection survived every error.
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_commands_cover_every_algorithm_and_named_limits() {
    let server = Server::start(config_with_limits()).await;
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    for algorithm in
        ["gcra", "token-bucket", "leaky-bucket", "fixed-window", "sliding-log", "sliding-window", "sub-window"]
    {
        let check = |cost: u64| {
            let mut cmd = redis::cmd("TG.CHECK");
            cmd.arg("k").arg(algorithm).arg(3).arg(60_000).arg("COST").arg(cost);
            cmd
        };
        let first: Vec<i64> = check(2).query_async(&mut con).await.unwrap();
        assert_eq!(first[..3], [1, 3, 1], "{algorithm}");
        let denied: Vec<i64> = check(2).query_async(&mut con).await.unwrap();
        assert_eq!(denied[0], 0, "{algorithm}");
        assert!(denied[3] > 0, "{algorithm}: retry_after_ms {denied:?}");
        let peek: Vec<i64> =
            redis::cmd("TG.PEEK").arg("k").arg(algorithm).arg(3).arg(60_000).query_async(&mut con).await.unwrap();
        assert_eq!(peek[..3], [1, 3, 1], "{algorithm}");
        let ok: String =
            redis::cmd("TG.RESET").arg("k").arg(algorithm).arg(3).arg(60_000).query_async(&mut con).await.unwrap();
        assert_eq!(ok, "OK");
        let after: Vec<i64> = check(3).query_async(&mut con).await.unwrap();
        assert_eq!(after[..3], [1, 3, 0], "{algorithm} after reset");
    }
    let api = |key: &str| {
        let mut cmd = redis::cmd("TG.LIMIT");
        cmd.arg("api").arg(key);
        cmd
    };
    let replies: Vec<Vec<i64>> = redis::pipe()
        .add_command(api("u"))
        .add_command(api("u"))
        .add_command(api("u"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(replies.iter().map(|r| r[0]).collect::<Vec<_>>(), [1, 1, 0]);
    let error = redis::cmd("TG.LIMIT").arg("nope").arg("u").query_async::<redis::Value>(&mut con).await.unwrap_err();
    assert!(error.to_string().contains("no rule or limit named \"nope\""), "{error}");
    let error = redis::cmd("TG.CHECK")
        .arg("k")
        .arg("quantum")
        .arg(1)
        .arg(1)
        .query_async::<redis::Value>(&mut con)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("quantum"), "{error}");
    let error = redis::cmd("TG.CHECK")
        .arg("k")
        .arg("gcra")
        .arg(1)
        .arg(1000)
        .arg("COST")
        .arg(2)
        .query_async::<redis::Value>(&mut con)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("exceeds the capacity"), "{error}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_redis_benchmark_work_against_it() {
    let server = Server::start(common::manual_config()).await;
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");
    assert_eq!(
        server.cli(&["CL.THROTTLE", "cli", "15", "30", "60"]).split_whitespace().collect::<Vec<_>>(),
        ["0", "16", "15", "-1", "2"]
    );
    assert!(server.cli(&["info"]).contains("tollgate_version"));
    let port = server.resp.port().to_string();
    let output = Command::new("redis-benchmark")
        .args([
            "-p",
            &port,
            "-c",
            "8",
            "-n",
            "2000",
            "-r",
            "1000",
            "-P",
            "4",
            "-q",
            "CL.THROTTLE",
            "bench:__rand_int__",
            "15",
            "30",
            "60",
            "1",
        ])
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && text.contains("requests per second"), "{text}");
    assert_eq!(server.cli(&["ping"]).trim(), "PONG", "still serving after the benchmark");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_closes_only_that_connection() {
    let resp = RespBounds { max_frame_bytes: 4096, max_inline_bytes: 4096, max_args: 8, ..RespBounds::default() };
    let server = Server::start(Config { resp, ..common::manual_config() }).await;
    let mut healthy = server.client().get_multiplexed_async_connection().await.unwrap();
    for (bytes, wanted) in [
        (&b"*x\r\n"[..], "-ERR Protocol error: invalid multibulk length"),
        (b"*1\r\n$2000000000\r\n", "-ERR Protocol error: command larger than 4096 bytes"),
        (b"*1\r\n:5\r\n", "-ERR Protocol error: expected '$', got ':'"),
        (b"*9\r\n", "-ERR Protocol error: too many arguments"),
        (b"*1\r\n$4\r\nPINGxx", "-ERR Protocol error: bulk string not terminated"),
    ] {
        let reply = server.raw(bytes);
        assert!(reply.starts_with(wanted), "{bytes:?}: {reply:?}");
    }
    // An oversized inline line is refused once the bound is reached.
    assert!(server.raw(&vec![b'a'; 5000]).starts_with("-ERR Protocol error: inline command longer than 4096"));
    // Keys are bytes (before: "ERR the key must be valid UTF-8"); errors that keep the
    // connection: wrong arity, an unknown command.
    let reply = server.raw(b"*5\r\n$11\r\nCL.THROTTLE\r\n$2\r\n\xff\xfe\r\n$1\r\n1\r\n$1\r\n1\r\n$1\r\n1\r\n*1\r\n$4\r\nNOPE\r\n*2\r\n$4\r\nECHO\r\n$2\r\nok\r\n");
    assert!(reply.starts_with("*5\r\n:0\r\n:2\r\n:1\r\n:-1\r\n:1\r\n-ERR unknown command 'NOPE'"), "{reply:?}");
    assert!(reply.ends_with("$2\r\nok\r\n"), "{reply:?}");
    let pong: String = redis::cmd("PING").query_async(&mut healthy).await.unwrap();
    assert_eq!(pong, "PONG", "other clients are unaffected");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused() {
    let resp = RespBounds { max_connections: 2, ..RespBounds::default() };
    let server = Server::start(Config { resp, ..common::manual_config() }).await;
    let first = server.client().get_multiplexed_async_connection().await.unwrap();
    let second = server.client().get_multiplexed_async_connection().await.unwrap();
    assert!(server.raw(b"PING\r\n").starts_with("-ERR max number of clients reached"));
    drop((first, second));
    // The slots come back once the server has seen the two connections close.
    let mut reply = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        reply = server.raw(b"PING\r\nQUIT\r\n");
        if reply.starts_with("+PONG") {
            break;
        }
    }
    assert!(reply.starts_with("+PONG"), "{reply}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_answers_decisions_headers_metrics_and_errors() {
    let server = Server::start(config_with_limits()).await;
    let body = r#"{"key":"h","limit":"2/1m","algorithm":"fixed-window"}"#;
    let post =
        |body: &str| server.curl(&["-X", "POST", "HTTP/v1/check", "-H", "content-type: application/json", "-d", body]);
    let first = post(body);
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(first.contains("ratelimit-policy: \"default\";q=2;w=60"), "{first}");
    assert!(first.contains("\"remaining\":1"), "{first}");
    post(body);
    let denied = post(body);
    assert!(denied.starts_with("HTTP/1.1 429"), "{denied}");
    assert!(denied.contains("retry-after: "), "{denied}");
    assert!(denied.contains("ratelimit: \"default\";r=0;t="), "{denied}");
    let named = post(r#"{"limit_name":"login","key":"alice"}"#);
    assert!(named.starts_with("HTTP/1.1 200") && named.contains("\"login\";q=1;w=3600"), "{named}");
    // A bucket's policy states its rate, and its burst apart (never the burst as the quota).
    let bucket = post(r#"{"limit":"100/1m","burst":20,"key":"b"}"#);
    assert!(bucket.contains("ratelimit-policy: \"default\";q=100;w=60;burst=20"), "{bucket}");
    for (bad, wanted) in [
        ("{", "invalid JSON body"),
        (r#"{"key":"h"}"#, "give either"),
        (
            r#"{"limit_name":"nope","key":"h"}"#,
            "no rule or limit named \\\"nope\\\"; limits usable by name: api, login",
        ),
        (r#"{"key":"h","limit":"2/fortnight"}"#, "fortnight"),
        (r#"{"key":"h","limit":"2/s","cost":3}"#, "exceeds the capacity"),
        (r#"{"key":"h","limit_name":"nope"}"#, "no rule or limit named"),
    ] {
        let reply = post(bad);
        assert!(reply.starts_with("HTTP/1.1 400") && reply.contains(wanted), "{bad}: {reply}");
    }
    let metrics = server.curl(&["HTTP/metrics"]);
    assert!(
        metrics.contains("tollgate_decisions_total{outcome=\"denied\",algorithm=\"fixed-window\",limit=\"http\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("tollgate_store_latency_seconds"), "memory calls are not timed: {metrics}");
    assert!(server.curl(&["HTTP/healthz"]).contains("ok"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_from_redis_too() {
    let redis = RedisServer::start();
    let server = Server::start(Config { store: StoreConfig::redis(&redis.url()), ..common::manual_config() }).await;
    assert_eq!(
        server.cli(&["CL.THROTTLE", "r", "15", "30", "60"]).split_whitespace().collect::<Vec<_>>(),
        ["0", "16", "15", "-1", "2"]
    );
    assert!(redis.cli(&["--scan"]).contains("tollgate:gcra:{r}"), "the state lives in Redis");
    let metrics = server.curl(&["HTTP/metrics"]);
    assert!(metrics.contains("tollgate_store_latency_seconds_count 1"), "one Redis call timed: {metrics}");
    server.stop().await;

    // Leased, decisions from a slice make no Redis call, and are not timed as one (before, every
    // decision was: the histogram read as if Redis answered in microseconds).
    let lease = tollgate_store::LeaseOptions { mode: tollgate_store::LeaseMode::Always, ..Default::default() };
    let config = Config { store: StoreConfig::redis(&redis.url()), lease, ..Config::default() };
    let server = Server::start(config).await;
    for _ in 0..50 {
        let _ = server.cli(&["CL.THROTTLE", "leased", "999", "1000", "60"]);
    }
    let metrics = server.curl(&["HTTP/metrics"]);
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (timed, calls) = (value("tollgate_store_latency_seconds_count"), value("tollgate_store_script_calls_total"));
    assert!(calls < 50.0 && timed == calls, "{timed} timed, {calls} Redis calls, 50 decisions");
    server.stop().await;
}

/// redis-cell #54: `CL.THROTTLE k 0 1 60` spent (one a minute, no burst), then the key's limit
/// raised with new numbers, `CL.THROTTLE k 10 100 60` (11 at once, 100 a minute): the raised
/// limit applies at once, the request spent counted against it; lowered again, what was spent
/// stays spent. On the memory store and on Redis (whose clock runs: the last wait is bounded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_with_raised_numbers_applies_them_at_once() {
    let redis = RedisServer::start();
    for store in [StoreConfig::parse("memory").unwrap(), StoreConfig::redis(&redis.url())] {
        let server = Server::start(Config { store, ..common::manual_config() }).await;
        let throttle = |args: &[&str]| -> Vec<i64> {
            let reply = server.cli(&[&["CL.THROTTLE", "upgraded"][..], args].concat());
            reply.split_whitespace().map(|word| word.parse().unwrap_or(i64::MIN)).collect()
        };
        assert_eq!(throttle(&["0", "1", "60"]), [0, 1, 0, -1, 60]);
        assert_eq!(throttle(&["0", "1", "60"]), [1, 1, 0, 60, 60], "one a minute: spent");
        assert_eq!(
            throttle(&["10", "100", "60"]),
            [0, 11, 9, -1, 2],
            "raised to 11 at once and 100 a minute: admitted now, 2 of 11 spent (1.2 s, rounded up)"
        );
        let lowered = throttle(&["0", "1", "60"]);
        assert_eq!(lowered[..3], [1, 1, 0], "lowered again: refused");
        assert!(
            (110..=120).contains(&lowered[3]) && lowered[3] == lowered[4],
            "the 2 spent stay spent, a minute each (less what drained at 100 a minute meanwhile): {lowered:?}"
        );
        server.stop().await;
    }
}

/// redis-cell answers a quantity above the burst "limited", consuming nothing, with the key's
/// state and a retry of -1 (it can never pass). That answer is one decision: one script call to
/// Redis, as any other `CL.THROTTLE` (no second trip to read the state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_over_the_burst_is_one_trip_to_redis() {
    let redis = RedisServer::start();
    let server = Server::start(Config { store: StoreConfig::redis(&redis.url()), ..common::manual_config() }).await;
    let throttle = |quantity: &str| -> Vec<String> {
        server.cli(&["CL.THROTTLE", "over", "15", "30", "60", quantity]).split_whitespace().map(String::from).collect()
    };
    // Redis's count of script calls (EVALSHA, FCALL and their kin), from `INFO commandstats`.
    let script_calls = || -> u64 {
        let stats = redis.cli(&["info", "commandstats"]);
        stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"))
            .filter_map(|l| l.split_once(":calls=")?.1.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(throttle("1"), ["0", "16", "15", "-1", "2"]);
    let before = script_calls();
    assert_eq!(throttle("17"), ["1", "16", "15", "-1", "2"], "limited, nothing consumed, retry -1");
    assert_eq!(script_calls() - before, 1, "script calls for one CL.THROTTLE over the burst");
    assert_eq!(throttle("1"), ["0", "16", "14", "-1", "4"], "the denied request consumed nothing");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_what_was_sent_and_stops_listening() {
    // Below the ephemeral range: a test beside this one binding port 0 is never handed these
    // ports once closed (it was once, and read as "still listening").
    let server = Server::start_below_ephemeral(common::manual_config()).await;
    let mut stream = TcpStream::connect(server.resp).unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
    let (resp, http) = (server.resp, server.http);
    server.stop().await;
    assert!(closed(resp), "RESP listener closed");
    assert!(closed(http), "HTTP listener closed");
}

/// Whether nothing listens at `address`. A connection to a closed loopback port in the ephemeral
/// range can be the socket meeting itself (TCP's simultaneous open, when the kernel picks that
/// very port as its source: seen once in CI): that is no listener.
fn closed(address: std::net::SocketAddr) -> bool {
    match TcpStream::connect(address) {
        Err(_) => true,
        Ok(stream) => stream.local_addr().ok() == stream.peer_addr().ok(),
    }
}
