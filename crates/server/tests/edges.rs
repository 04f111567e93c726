//! The edges of `tollgate serve`, each one a way a single client could hurt the server or the
//! other clients before: a request that aborted the process, keys that were not bytes, named
//! limits sharing state, unbounded inline commands and buffers, slow or silent clients holding a
//! shutdown or a connection forever, a Redis outage invisible in the metrics, and a Redis reply
//! with an impossible value (`-MOVED 20000 …`) that killed the call's task.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Server;
use tollgate_server::{Config, HttpBounds, RespBounds, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

/// Before: `slices` had no upper bound and the sub-window state was allocated per key, even for a
/// peek: this request aborted the whole process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_slice_count_is_a_clear_error_and_the_server_lives_on() {
    let server = Server::start(common::manual_config()).await;
    let reply = server.cli(&["TG.PEEK", "k", "sub-window", "1", "1000000000000", "SLICES", "1000000000000000"]);
    assert!(reply.contains("above its maximum"), "{reply}");
    let reply = server.cli(&["TG.CHECK", "k", "sub-window", "1", "1000000000000", "SLICES", "1000000000000000"]);
    assert!(reply.contains("above its maximum"), "{reply}");
    let reply = server.cli(&["TG.CHECK", "k", "sliding-log", "1000000", "60000"]);
    assert!(reply.contains("count is 1000000, above its maximum of 100000"), "{reply}");
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");
    server.stop().await;
}

/// Redis keys are bytes; redis-cell's drop-in accepts any (before: `ERR the key must be valid UTF-8`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_bytes() {
    let server = Server::start(common::manual_config()).await;
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    for key in [&b"\xff\xfe"[..], b"a\0b", b"{brace}", b"}{"] {
        let throttle = || redis::cmd("CL.THROTTLE").arg(key).arg(0).arg(1).arg(60).clone();
        let first: Vec<i64> = throttle().query_async(&mut con).await.unwrap();
        let second: Vec<i64> = throttle().query_async(&mut con).await.unwrap();
        assert_eq!((first[0], second[0]), (0, 1), "{key:?}: its own state");
        let check: Vec<i64> =
            redis::cmd("TG.CHECK").arg(key).arg("fixed-window").arg(1).arg(60_000).query_async(&mut con).await.unwrap();
        assert_eq!(check[0], 1, "{key:?}");
    }
    server.stop().await;
}

/// Before: the key was not namespaced by the limit's name, so `TG.LIMIT api u` and
/// `TG.LIMIT search u` drew from one state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_limits_never_share_state() {
    let rules =
        tollgate_rules::Rules::parse("[limits.api]\nlimit = \"1/1h\"\n[limits.search]\nlimit = \"1/1h\"\n", "t")
            .unwrap();
    let server = Server::start(Config { rules, ..common::manual_config() }).await;
    for name in ["api", "search"] {
        assert_eq!(server.cli(&["TG.LIMIT", name, "u"]).lines().next(), Some("1"), "{name}: its own state");
        assert_eq!(server.cli(&["TG.LIMIT", name, "u"]).lines().next(), Some("0"), "{name}");
    }
    let adhoc = server.cli(&["TG.CHECK", "u", "gcra", "1", "3600000"]);
    assert_eq!(adhoc.lines().next(), Some("1"), "an ad-hoc limit on the same key is another state");
    server.stop().await;
}

/// Before: inline commands were accepted (and rescanned from byte 0 on every read) up to 1 MiB.
/// A large array command is still served, and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_commands_are_bounded_and_large_frames_still_work() {
    let server = Server::start(common::manual_config()).await;
    let reply = server.raw(&vec![b'a'; 70 * 1024]);
    assert!(reply.starts_with("-ERR Protocol error: inline command longer than 65536 bytes"), "{reply}");
    // A 900 KB command, then small ones on the same connection.
    let mut stream = TcpStream::connect(server.resp).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let big = vec![b'x'; 900 * 1024];
    stream.write_all(format!("*2\r\n$4\r\nECHO\r\n${}\r\n", big.len()).as_bytes()).unwrap();
    stream.write_all(&big).unwrap();
    stream.write_all(b"\r\nPING\r\n").unwrap();
    let header = format!("${}\r\n", big.len());
    let mut reply = vec![0; header.len() + big.len() + 2 + 7];
    stream.read_exact(&mut reply).unwrap();
    assert!(reply.starts_with(header.as_bytes()) && reply.ends_with(b"\r\n+PONG\r\n"));
    server.stop().await;
}

/// A command dribbled one byte per write is framed incrementally and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dribbled_byte_by_byte_is_answered() {
    let server = Server::start(common::manual_config()).await;
    let mut stream = TcpStream::connect(server.resp).unwrap();
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for byte in b"*2\r\n$4\r\nECHO\r\n$5\r\nhello\r\n" {
        stream.write_all(&[*byte]).unwrap();
    }
    let mut reply = [0u8; 11];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"$5\r\nhello\r\n");
    server.stop().await;
}

/// Before: a RESP client that never read its replies blocked graceful shutdown for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_within_the_grace_period_whatever_the_clients_do() {
    let config = Config { shutdown_grace: Duration::from_millis(500), ..common::manual_config() };
    let server = Server::start(config).await;
    // A client that pipelines without ever reading: its replies fill the socket buffers.
    let mut silent = TcpStream::connect(server.resp).unwrap();
    silent.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let ping = b"PING\r\n".repeat(10_000);
    for _ in 0..200 {
        if silent.write_all(&ping).is_err() {
            break;
        }
    }
    // And an HTTP client that sends half a request head, and another idle one.
    let mut slow = TcpStream::connect(server.http).unwrap();
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nhost: x\r\n").unwrap();
    let _idle = TcpStream::connect(server.http).unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await.expect("exits").unwrap().unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?} with a grace of 500 ms");
    println!("shutdown with a client that never reads: {took:?}");
}

/// A client that never reads its replies is closed after the write timeout; others carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_after_the_write_timeout() {
    let resp = RespBounds { write_timeout: Duration::from_millis(300), ..RespBounds::default() };
    let server = Server::start(Config { resp, ..common::manual_config() }).await;
    let mut silent = TcpStream::connect(server.resp).unwrap();
    silent.set_write_timeout(Some(Duration::from_millis(100))).unwrap();
    let ping = b"PING\r\n".repeat(10_000);
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(10) {
        if silent
            .write_all(&ping)
            .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut)
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "the server never closed the connection of a client that does not read");
    assert_eq!(server.cli(&["ping"]).trim(), "PONG");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_timeout_closes_idle_connections() {
    let resp = RespBounds { idle_timeout: Some(Duration::from_millis(200)), ..RespBounds::default() };
    let server = Server::start(Config { resp, ..common::manual_config() }).await;
    let mut idle = TcpStream::connect(server.resp).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buffer = [0u8; 1];
    assert_eq!(idle.read(&mut buffer).unwrap(), 0, "closed by the server");
    server.stop().await;
}

/// An HTTP connection kept alive after its request and then silent is closed after the
/// header-read timeout: hyper starts the timer again as it waits for the next request's head, so
/// `--http-header-timeout` is the HTTP listener's idle bound as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_connection_idle_after_its_request_is_closed() {
    let http = HttpBounds { header_read_timeout: Duration::from_millis(300), ..HttpBounds::default() };
    let server = Server::start(Config { http, ..common::manual_config() }).await;
    let mut kept = TcpStream::connect(server.http).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = kept.read(&mut buffer).expect("closed within 10 s");
        if read == 0 {
            break;
        }
        response.extend_from_slice(&buffer[..read]);
    }
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200") && !response.contains("connection: close"), "{response}");
    server.stop().await;
}

/// Before: an HTTP client that pipelined requests and never read the answers held its connection
/// for ever (hyper waits on the write, reads no more, and no timer runs). Now a write that makes
/// no progress for `--http-write-timeout` closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_that_never_reads_is_closed_after_the_write_timeout() {
    let http = HttpBounds {
        write_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_secs(60),
        ..HttpBounds::default()
    };
    let server = Server::start(Config { http, ..common::manual_config() }).await;
    let mut silent = TcpStream::connect(server.http).unwrap();
    silent.set_nonblocking(true).unwrap();
    let request = b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n";
    let (mut sent, mut refused_since) = (0usize, None::<Instant>);
    // Pipeline until both directions' buffers are full (writes refused for a while).
    while refused_since.is_none_or(|at| at.elapsed() < Duration::from_millis(200)) {
        match silent.write(request) {
            Ok(n) if n == request.len() => {
                sent += 1;
                refused_since = None;
            }
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                refused_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("writing: {e}"),
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    silent.set_nonblocking(false).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut answered, mut buffer, mut tail) = (0usize, [0u8; 65536], Vec::new());
    let ended = loop {
        match silent.read(&mut buffer) {
            Ok(0) => break "closed",
            Ok(read) => {
                tail.extend_from_slice(&buffer[..read]);
                answered += tail.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count();
                let keep = tail.len().saturating_sub(14);
                tail.drain(..keep);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                break "still open";
            }
            Err(_) => break "closed",
        }
    };
    assert!(
        ended == "closed" && answered < sent,
        "{ended} after {answered} of {sent} pipelined requests were answered, the client reading nothing for 1.5 s \
         under a write timeout of 300 ms"
    );
    server.stop().await;
}

/// Before: the HTTP listener had no header-read timeout (slowloris), no connection cap and no
/// body limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bounds_slowloris_connections_and_bodies() {
    let http = HttpBounds {
        header_read_timeout: Duration::from_millis(300),
        max_connections: 4,
        max_body_bytes: 1024,
        ..HttpBounds::default()
    };
    let server = Server::start(Config { http, ..common::manual_config() }).await;
    // Half a request head, never finished: closed after the header-read timeout.
    let mut slow = TcpStream::connect(server.http).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nhost: x\r\n").unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(started.elapsed() < Duration::from_secs(3), "the slow head was cut after {:?}", started.elapsed());
    // A body over the limit: 413.
    let big = format!(r#"{{"key":"{}","limit":"1/s"}}"#, "k".repeat(2000));
    let reply = server.curl(&["-X", "POST", "HTTP/v1/check", "-d", &big]);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    server.stop().await;

    // Connections beyond the cap: 503 and closed; the others are served. On a server whose head
    // timeout cannot free a held slot meanwhile, however slow the machine: the kernel hands
    // connections over in the order they were made, so the fifth is the one refused.
    let http = HttpBounds { max_connections: 4, ..HttpBounds::default() };
    let server = Server::start(Config { http, ..common::manual_config() }).await;
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(server.http).unwrap()).collect();
    let mut extra = TcpStream::connect(server.http).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = String::new();
    let _ = extra.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply:?}");
    drop(held);
    // The slots come back once the server sees the held connections closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !server.curl(&["HTTP/healthz"]).contains("\"status\":\"ok\"") {
        assert!(Instant::now() < deadline, "the held connections' slots never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// Before: fallbacks were a gauge set at render time, and nothing showed the breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_trouble_shows_in_the_metrics_as_counters() {
    let mut redis = RedisServer::start();
    let server = Server::start(Config { store: StoreConfig::redis(&redis.url()), ..common::manual_config() }).await;
    assert_eq!(server.cli(&["CL.THROTTLE", "k", "9", "10", "60"]).lines().next(), Some("0"));
    redis.kill();
    for _ in 0..5 {
        assert_eq!(server.cli(&["CL.THROTTLE", "k", "9", "10", "60"]).lines().next(), Some("0"), "local fallback");
    }
    let metrics = server.curl(&["HTTP/metrics"]);
    for wanted in [
        "# TYPE tollgate_store_fallbacks counter",
        "tollgate_store_fallbacks_total 5",
        "tollgate_store_breaker_open 1",
        "tollgate_store_breaker_opened_total 1",
        "tollgate_store_debts 1",
    ] {
        assert!(metrics.contains(wanted), "{wanted} missing in\n{metrics}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_reports_keys_bytes_and_evictions() {
    let config = Config { store: StoreConfig::Memory { max_keys: 64, max_memory: 1 << 20 }, ..common::manual_config() };
    let server = Server::start(config).await;
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..200 {
        pipe.add_command(redis::cmd("CL.THROTTLE").arg(format!("k{i}")).arg(5).arg(10).arg(60).clone());
    }
    let _: Vec<Vec<i64>> = pipe.query_async(&mut con).await.unwrap();
    let metrics = server.curl(&["HTTP/metrics"]);
    assert!(metrics.contains("tollgate_store_keys 64"), "{metrics}");
    assert!(metrics.contains("tollgate_store_evictions_total{kind=\"live\"} 136"), "{metrics}");
    assert!(metrics.contains("tollgate_store_bytes "), "{metrics}");
    server.stop().await;
}

/// A cluster node that serves every slot itself and answers every script call `-MOVED 20000 …`
/// (a compromised server, or anyone on the path of a plain link). Before: the slot indexed the
/// slot map out of its bounds, the call's task panicked and the client's connection was closed
/// without a reply, on every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_redirect_is_a_store_error_and_the_server_lives_on() {
    use tollgate_store::testkit::fake_redis::{self, Answer, FakeRedis, is, resp};
    let node = FakeRedis::silent();
    let port = node.port();
    node.script(move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&[(0, 16_383, port)])
        } else if is(command, &["FCALL"]) {
            Answer::Raw(resp::error("MOVED 20000 127.0.0.1:1"))
        } else if is(command, &["CLUSTER", "INFO"]) {
            Answer::Raw(resp::bulk("cluster_state:ok"))
        } else {
            Answer::Raw(resp::simple("PONG"))
        }
    });
    let store = StoreConfig::redis(&format!("redis+cluster://{}", node.address()));
    let server = Server::start(Config { store, ..common::manual_config() }).await;
    let mut con = server.client().get_multiplexed_async_connection().await.unwrap();
    for i in 0..6 {
        let mut throttle = redis::cmd("CL.THROTTLE");
        throttle.arg(format!("k{i}")).arg(9).arg(10).arg(60);
        // `local` (the default policy) answers while the server misbehaves.
        let reply = throttle.query_async::<Vec<i64>>(&mut con).await;
        assert!(matches!(reply.as_deref(), Ok([0, 10, 9, ..])), "request {i}: {reply:?}");
    }
    assert!(node.count(&["FCALL"]) > 0, "the calls reached the fake node");
    let metrics = server.curl(&["HTTP/metrics"]);
    let errors = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_store_backend_errors_total "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(errors.is_some_and(|n| n > 0), "no backend error counted:\n{metrics}");
    server.stop().await;
}
