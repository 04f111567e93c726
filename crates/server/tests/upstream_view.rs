//! What reaches the upstream is exactly what was rated: raw bytes through the real `tollgate
//! proxy` to a raw-socket upstream that records every request as it arrives (see
//! `common::raw_upstream`), as an attacker would send them: the forwarding headers, bodies on
//! methods that carry none, upstream connections shared between clients, hop-by-hop tricks and
//! the client's framing, and clients that hold their connection without reading.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::raw_client::{Client, exchange, request};
use common::raw_upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_rules::Rules;
use tollgate_server::Config;
use tollgate_server::proxy::ProxyConfig;

/// A proxy in front of `upstream` with `rules`, after `tweak` adjusted its configuration.
async fn start_proxy(upstream: &str, rules: &str, tweak: impl FnOnce(&mut Config, &mut ProxyConfig)) -> Proxy {
    let mut config = common::manual_config();
    let mut proxy = ProxyConfig {
        upstream: upstream.to_string(),
        rules: Rules::parse(rules, "upstream_view").unwrap(),
        rules_file: None,
        options: Default::default(),
        upstream_timeout: Duration::from_secs(10),
        tls: None,
        limits: Default::default(),
    };
    tweak(&mut config, &mut proxy);
    Proxy::start(config, proxy).await
}

const TRUSTING_LOOPBACK: &str = "trusted_proxies = [\"127.0.0.1/32\"]\n";

/// Item 1: HAProxy's `option forwardfor` adds its own `X-Forwarded-For` line after the client's;
/// the proxy read the first line only, appended the peer and dropped the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarded_for_line_reaches_the_upstream_in_order() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, TRUSTING_LOOPBACK, |_, _| {}).await;
    let lines = ["X-Forwarded-For: 6.6.6.1", "X-Forwarded-For: 203.0.113.7"];
    let (status, received) = exchange(&proxy, &seen, &request("GET", "/", &lines, b"")).await;
    assert_eq!(status, 200);
    let chain = received[0].lines("x-forwarded-for");
    assert_eq!(chain, ["6.6.6.1, 203.0.113.7, 127.0.0.1"], "one line: every hop, in order, the peer last");
    // A tier behind (trusting this proxy and the one in front) finds the real client.
    let tier = tollgate_rules::TrustedProxies::new(vec!["127.0.0.1/32".parse().unwrap()]);
    let values: Vec<&[u8]> = chain.iter().map(|v| v.as_bytes()).collect();
    assert_eq!(
        tier.client_ip("127.0.0.1".parse().unwrap(), &values),
        "203.0.113.7".parse::<std::net::IpAddr>().unwrap()
    );
    proxy.stop().await;
}

const LIMITED: &str = "[[rules]]\nname = \"limited\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\n\
                       match = { path_prefix = \"/limited\" }\n";

/// Item 2: a GET whose body is another request. The proxy rated `GET /public` and streamed the
/// body; an upstream that ignores a GET's body read the smuggled request, never rated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_on_a_method_without_one_never_reaches_the_upstream() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, LIMITED, |_, _| {}).await;
    for _ in 0..3 {
        assert_eq!(exchange(&proxy, &seen, &request("GET", "/limited/x", &[], b"")).await.0, 200);
    }
    assert_eq!(exchange(&proxy, &seen, &request("GET", "/limited/x", &[], b"")).await.0, 429, "the budget is spent");
    let smuggled = b"GET /limited/smuggled HTTP/1.1\r\nHost: app.example\r\n\r\n";
    let mut reached = Vec::new();
    // The rules fold a method's case (`get` is GET to them, as to Werkzeug and Django, which
    // upper-case it): so does the refusal.
    for method in ["GET", "HEAD", "DELETE", "TRACE", "get", "Delete"] {
        let (status, received) = exchange(&proxy, &seen, &request(method, "/public", &[], smuggled)).await;
        let targets: Vec<String> = received.iter().map(|r| format!("{} {}", r.method, r.target)).collect();
        if status != 400 || !received.is_empty() {
            reached.push(format!("{method} with a body: {status}, the upstream read {targets:?}"));
        }
    }
    let chunked = [format!("{:x}\r\n", smuggled.len()).as_bytes(), smuggled, b"\r\n0\r\n\r\n"].concat();
    let (status, received) =
        exchange(&proxy, &seen, &request("GET", "/public", &["Transfer-Encoding: chunked"], &chunked)).await;
    if status != 400 || !received.is_empty() {
        reached.push(format!("GET with a chunked body: {status}, the upstream read {} requests", received.len()));
    }
    assert!(reached.is_empty(), "{reached:#?}");
    // A GET declaring an empty body is no body.
    let (status, received) = exchange(&proxy, &seen, &request("GET", "/public", &["Content-Length: 0"], b"")).await;
    assert_eq!((status, received.len()), (200, 1));
    proxy.stop().await;
}

/// Item 2: an upstream that ignores a body it does not expect (here any body sent to
/// `/static`: CL.0) answers a request smuggled in it; on an upstream connection shared between
/// clients, that answer went to the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_never_share_an_upstream_connection() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |_, _| {}).await;
    let mut attacker = Client::connect(&proxy).await;
    let smuggled = b"GET /smuggled-slow HTTP/1.1\r\nHost: app.example\r\n\r\n";
    attacker.send(&request("POST", "/static", &[], smuggled)).await;
    assert_eq!(attacker.response().await.map(|r| r.body), Some(b"/static".to_vec()));
    let mut victim = Client::connect(&proxy).await;
    victim.send(&request("GET", "/account", &[], b"")).await;
    let answer = victim.response().await.map(|r| String::from_utf8_lossy(&r.body).into_owned());
    assert_eq!(answer.as_deref(), Some("/account"), "the victim gets its own answer");
    // Each client connection has its own upstream connection, reused by its next requests.
    victim.send(&request("GET", "/again", &[], b"")).await;
    assert_eq!(victim.response().await.map(|r| r.body), Some(b"/again".to_vec()));
    let connection = |target: &str| seen.requests().iter().find(|r| r.target == target).map(|r| r.connection);
    assert_ne!(connection("/static"), connection("/account"), "another client, another upstream connection");
    assert_eq!(connection("/account"), connection("/again"), "one client connection, one upstream connection");
    proxy.stop().await;
}

/// Item 3: clients that never read a large response held their connection slot (and an
/// upstream connection) for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_loses_its_connection() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |config, _| {
        config.http.max_connections = 2;
        config.http.write_timeout = Duration::from_secs(1);
    })
    .await;
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut client = Client::connect(&proxy).await;
        client.send(&request("GET", "/big", &[], b"")).await;
        stalled.push(client);
    }
    // Eventually (once the stalled clients are closed) another client is served.
    let mut served = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut client = Client::connect(&proxy).await;
        client.send(&request("GET", "/small", &["Connection: close"], b"")).await;
        served = client.response().await.map(|r| r.status);
        if served == Some(200) {
            break;
        }
    }
    assert_eq!(served, Some(200), "the stalled clients still hold every connection slot");
    // The upstream connections they pinned are closed too.
    let mut released = 0;
    for _ in 0..100 {
        released = *seen.closed.lock().unwrap();
        if released >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(released >= 2, "upstream connections released: {released}");
    drop(stalled);
    proxy.stop().await;
}

/// A client the write timeout closed was left a closed socket still holding the response's
/// unsent bytes (megabytes in the kernel, in FIN-WAIT-1 for as long as the client kept reading
/// a byte now and then), its slot free for the next such connection: now it is reset, and the
/// bytes dropped at once (nginx's `reset_timedout_connection`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closed_for_reading_nothing_is_reset() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |config, _| config.http.write_timeout = Duration::from_secs(1)).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut client = socket.connect(proxy.at).await.unwrap();
    client.write_all(&request("GET", "/big", &[], b"")).await.unwrap();
    // The proxy gives the connection up (and the upstream connection it held).
    let mut closed = false;
    for _ in 0..200 {
        closed = *seen.closed.lock().unwrap() >= 1;
        if closed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed, "the proxy never gave the connection up");
    // What the client can still read ends in a reset, not after megabytes and a FIN.
    let (mut read, mut chunk) = (0usize, vec![0u8; 1 << 16]);
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match client.read(&mut chunk).await {
                Ok(0) => return Ok(()),
                Ok(n) => read += n,
                Err(error) => return Err(error.kind()),
            }
        }
    })
    .await;
    assert_eq!(end.ok(), Some(Err(std::io::ErrorKind::ConnectionReset)), "the client read {read} bytes");
    proxy.stop().await;
}

/// Item 3: one address held as many connections as it liked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_client_address_are_capped() {
    let (upstream, seen) = raw_upstream::start().await;
    let cap = |_: &mut Config, proxy: &mut ProxyConfig| proxy.limits.max_connections_per_client = 2;
    let proxy = start_proxy(&upstream, "", cap).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = Client::connect(&proxy).await;
        client.send(&request("GET", "/one", &[], b"")).await;
        assert_eq!(client.response().await.map(|r| r.status), Some(200));
        held.push(client);
    }
    let (status, received) = exchange(&proxy, &seen, &request("GET", "/third", &[], b"")).await;
    assert_eq!((status, received.len()), (429, 0), "a third connection from one address");
    drop(held);
    proxy.stop().await;
    // A trusted proxy's connections carry many clients: not capped.
    let proxy = start_proxy(&upstream, TRUSTING_LOOPBACK, cap).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut client = Client::connect(&proxy).await;
        client.send(&request("GET", "/one", &[], b"")).await;
        assert_eq!(client.response().await.map(|r| r.status), Some(200), "from a trusted proxy");
        held.push(client);
    }
    drop(held);
    proxy.stop().await;
}

/// Item 3: a 429 left the connection open for the next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_closes_the_connection() {
    let (upstream, _seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, LIMITED, |_, _| {}).await;
    let mut client = Client::connect(&proxy).await;
    for _ in 0..3 {
        client.send(&request("GET", "/limited", &[], b"")).await;
        let response = client.response().await.unwrap();
        assert_eq!((response.status, response.header("connection")), (200, None), "allowed: kept open");
    }
    client.send(&request("GET", "/limited", &[], b"")).await;
    let response = client.response().await.unwrap();
    assert_eq!((response.status, response.header("connection")), (429, Some("close")));
    assert!(client.closed_by_proxy().await, "closed after the 429");
    proxy.stop().await;
}

/// Item 3: a slow upstream got the request timeout's 408 before `--upstream-timeout`'s 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_is_a_504_and_a_slow_client_a_408() {
    let (upstream, _seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |config, proxy| {
        config.http.request_timeout = Duration::from_millis(500);
        proxy.upstream_timeout = Duration::from_secs(1);
    })
    .await;
    let mut client = Client::connect(&proxy).await;
    client.send(&request("GET", "/slow", &[], b"")).await;
    assert_eq!(client.response().await.map(|r| r.status), Some(504), "the upstream is the slow one");
    // A client that sends half its body: the request timeout, whatever the upstream does.
    let mut client = Client::connect(&proxy).await;
    client.send(b"POST /upload HTTP/1.1\r\nHost: app.example\r\nContent-Length: 10\r\n\r\nhalf.").await;
    assert_eq!(client.response().await.map(|r| r.status), Some(408), "the client is the slow one");
    proxy.stop().await;
}

/// The client's body had the request timeout from its head's arrival, so a `delay` rule holding
/// the request spent it: a body finished after the hold was the client's fault (408). The clock
/// now starts when the proxy starts reading the body (a delay itself is bounded by the request
/// timeout, so that a client is never held longer than that before its request is forwarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_rule_does_not_spend_the_clients_time_to_send_its_body() {
    let (upstream, seen) = raw_upstream::start().await;
    let rules = "[[rules]]\nname = \"paced\"\nlimit = \"1/2s\"\nkey = [\"global\"]\n\
                 [rules.mitigation]\naction = \"delay\"\nmax_delay = \"10s\"\n";
    let proxy = start_proxy(&upstream, rules, |config, _| {
        config.http.request_timeout = Duration::from_secs(3);
    })
    .await;
    let request = request("POST", "/upload", &[], &[b'x'; 1000]);
    let (head_and_half, rest) = request.split_at(request.len() - 500);
    let mut first = Client::connect(&proxy).await;
    first.send(&request).await;
    let first = first.response().await.map(|r| r.status);
    // The second is held about 2 s for its slot; its body's second half comes 3.5 s after its
    // head: 1.5 s after the proxy starts reading it, within the 3 s request timeout.
    let mut second = Client::connect(&proxy).await;
    second.send(head_and_half).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let _ = second.try_send(rest).await;
    let second = second.response().await.map(|r| r.status);
    assert_eq!([first, second], [Some(200), Some(200)]);
    assert_eq!(seen.requests().iter().map(|r| r.body.len()).collect::<Vec<_>>(), [1000, 1000]);
    proxy.stop().await;
}

/// An upstream that took the request's head and then read nothing more (a hung service whose
/// kernel accepted the connection) held the client, and its connection slot, for ever: the
/// upstream's clock ran only once the body was sent, and the client's only while the body was
/// read. The upstream must now take the body within `--upstream-timeout` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_takes_no_body_is_a_504() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |config, proxy| {
        config.http.max_body_bytes = 32 << 20;
        proxy.upstream_timeout = Duration::from_secs(1);
    })
    .await;
    let (mut reading, mut writing) = tokio::net::TcpStream::connect(proxy.at).await.unwrap().into_split();
    let upload = request("POST", "/stuck", &[], &vec![b'x'; 16 << 20]);
    // Never all taken: the proxy stops reading once its writes to the upstream wait.
    let sending = tokio::spawn(async move {
        let _ = writing.write_all(&upload).await;
        writing
    });
    let mut answer = vec![0u8; 12];
    let read = tokio::time::timeout(Duration::from_secs(15), reading.read_exact(&mut answer)).await;
    assert_eq!(read.ok().map(|_| String::from_utf8_lossy(&answer).into_owned()).as_deref(), Some("HTTP/1.1 504"));
    assert_eq!(seen.requests().iter().map(|r| r.target.as_str()).collect::<Vec<_>>(), ["/stuck"]);
    sending.abort();
    proxy.stop().await;
}

/// The headers a client can set to tell an application who it is, where it came from, or what
/// it asked for: the proxy's own to write.
const CLAIMS: [&str; 10] = [
    "X-Forwarded-For: 198.51.100.1",
    "Forwarded: for=198.51.100.1;host=api.example.com;proto=https",
    "X-Forwarded-Host: api.example.com",
    "X-Forwarded-Proto: https",
    "X-Forwarded-Port: 443",
    "X-Real-IP: 198.51.100.1",
    "True-Client-IP: 198.51.100.1",
    "X-Client-IP: 198.51.100.1",
    "X-Original-URL: /admin",
    "X-Rewrite-URL: /admin",
];

/// Item 4: `Forwarded`, `X-Forwarded-Host`, `X-Real-IP` and their kind passed through from
/// anyone: an application routing on `X-Forwarded-Host` served another host than the rules
/// matched, and a tier behind keyed on a `Forwarded: for=` the client chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarding_headers_are_the_proxys_own() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |_, _| {}).await;
    let (status, received) = exchange(&proxy, &seen, &request("GET", "/", &CLAIMS, b"")).await;
    assert_eq!(status, 200);
    let got = &received[0];
    // A claim passed through if the upstream got that line (names compared case-insensitively).
    let passed: Vec<&str> = CLAIMS
        .iter()
        .filter(|c| got.headers.iter().any(|(n, v)| format!("{n}: {v}").eq_ignore_ascii_case(c)))
        .copied()
        .collect();
    assert!(passed.is_empty(), "passed through from an untrusted client: {passed:#?}");
    assert_eq!(got.lines("x-forwarded-for"), ["127.0.0.1"], "the peer, as the rules keyed it");
    assert_eq!(got.lines("x-forwarded-proto"), ["http"]);
    for name in ["forwarded", "x-forwarded-host", "x-forwarded-port", "x-real-ip", "true-client-ip", "x-original-url"] {
        assert!(!got.has(name), "{name}: {:?}", got.lines(name));
    }
    proxy.stop().await;

    // From a trusted proxy they are kept, and the chains extended with the peer.
    let proxy = start_proxy(&upstream, TRUSTING_LOOPBACK, |_, _| {}).await;
    let (status, received) = exchange(&proxy, &seen, &request("GET", "/", &CLAIMS, b"")).await;
    assert_eq!(status, 200);
    let got = &received[0];
    assert_eq!(got.lines("x-forwarded-for"), ["198.51.100.1, 127.0.0.1"]);
    assert_eq!(got.lines("forwarded"), ["for=198.51.100.1;host=api.example.com;proto=https, for=127.0.0.1"]);
    for (name, value) in
        [("x-forwarded-host", "api.example.com"), ("x-forwarded-proto", "https"), ("x-real-ip", "198.51.100.1")]
    {
        assert_eq!(got.lines(name), [value], "{name} from a trusted proxy");
    }
    proxy.stop().await;
}

const KEYED: &str = "[[rules]]\nname = \"keyed\"\nlimit = \"3/1m\"\nkey = [\"header:x-api-key\"]\n";

/// Item 7: `Connection` naming `Host` (or a header a rule reads) dropped it on the way: the rules
/// matched one host, and hyper-util filled in the upstream's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cannot_remove_what_the_rules_read() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, KEYED, |_, _| {}).await;
    let mut escaped = Vec::new();
    for (connection, headers) in [
        ("host", vec!["Connection: host"]),
        ("a header a rule keys on", vec!["X-Api-Key: k1", "Connection: keep-alive, X-Api-Key"]),
        ("the forwarding header", vec!["Connection: x-forwarded-for"]),
        ("the framing", vec!["Connection: content-length"]),
    ] {
        let (status, received) = exchange(&proxy, &seen, &request("POST", "/", &headers, b"data")).await;
        if status != 400 || !received.is_empty() {
            let hosts: Vec<Vec<String>> = received.iter().map(|r| r.lines("host")).collect();
            escaped.push(format!("Connection naming {connection}: {status}, the upstream's Host lines {hosts:?}"));
        }
    }
    assert!(escaped.is_empty(), "{escaped:#?}");
    // What `Connection` may name is removed, as RFC 9110 says.
    let headers = ["X-Hop: 1", "Connection: close, X-Hop", "X-Api-Key: k2"];
    let (status, received) = exchange(&proxy, &seen, &request("GET", "/", &headers, b"")).await;
    assert_eq!(status, 200);
    assert!(!received[0].has("x-hop") && received[0].lines("x-api-key") == ["k2"], "{:?}", received[0].headers);
    proxy.stop().await;
}

/// Item 7: the client's `Transfer-Encoding` spelling was forwarded as sent, over a body the
/// proxy had re-framed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_the_body_as_the_proxy_framed_it() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |_, _| {}).await;
    let chunked = b"5\r\nhello\r\n0\r\n\r\n";
    let mut wrong = Vec::new();
    for spelling in [
        vec!["Transfer-Encoding: identity, chunked"],
        vec!["Transfer-Encoding: CHUNKED"],
        vec!["Transfer-Encoding: identity", "Transfer-Encoding: chunked"],
    ] {
        let (status, received) = exchange(&proxy, &seen, &request("POST", "/upload", &spelling, chunked)).await;
        let framing =
            received.first().map(|r| (r.lines("transfer-encoding"), r.lines("content-length"), r.body.clone()));
        if status != 200 || framing != Some((vec![], vec!["5".to_string()], b"hello".to_vec())) {
            wrong.push(format!("{spelling:?}: {status}, the upstream got {framing:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    proxy.stop().await;
}

/// Item 2's way out: `--allow-body-on GET` forwards such a body (framed by the proxy) on an
/// upstream connection of its own; the client's other requests share another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_body_goes_on_an_upstream_connection_of_its_own() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |_, proxy| proxy.limits.bodies_allowed_on = vec![http::Method::GET]).await;
    let mut client = Client::connect(&proxy).await;
    for (target, body) in [("/first", b"".as_slice()), ("/search", b"{\"query\":1}"), ("/last", b"")] {
        client.send(&request("GET", target, &[], body)).await;
        assert_eq!(client.response().await.map(|r| r.status), Some(200), "{target}");
    }
    let received = seen.requests();
    let of = |target: &str| received.iter().find(|r| r.target == target).unwrap();
    assert_eq!(of("/search").lines("content-length"), ["11"]);
    assert_eq!(of("/first").connection, of("/last").connection);
    assert_ne!(of("/search").connection, of("/first").connection);
    assert!(of("/first").lines("content-length").is_empty(), "a GET without a body declares none");
    proxy.stop().await;
}

/// A request target longer than `--http-max-target` (8 KiB by default, as nginx's request
/// line) is refused before the rules fold its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_target_over_the_limit_is_a_414() {
    let (upstream, seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, LIMITED, |_, _| {}).await;
    let long = format!("/limited/{}", "a/".repeat(5000));
    let (status, received) = exchange(&proxy, &seen, &request("GET", &long, &[], b"")).await;
    assert_eq!((status, received.len()), (414, 0));
    let (status, received) = exchange(&proxy, &seen, &request("GET", &long[..8000], &[], b"")).await;
    assert_eq!((status, received.len()), (200, 1));
    proxy.stop().await;
}

/// A header the proxy owns, or one the rules read, spelled with `_` for `-`: CGI, PHP and WSGI
/// servers (and Rack's) name both `HTTP_X_FORWARDED_FOR`, so the application may read the
/// spelling the rules never saw (nginx drops every such name by default).
const ALIASES: [&str; 6] = [
    "X_Forwarded_For: 198.51.100.1",
    "X-Forwarded_For: 198.51.100.2",
    "X_Real_IP: 198.51.100.3",
    "X_Forwarded_Host: admin.example",
    "X_Api_Key: someone-elses",
    "Transfer_Encoding: chunked",
];

/// Underscored spellings of the forwarding headers, of a header a rule keys on, and of the
/// framing reached the upstream from anyone, beside the proxy's own `X-Forwarded-For`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscored_spellings_of_what_the_proxy_owns_never_reach_the_upstream() {
    let (upstream, seen) = raw_upstream::start().await;
    for rules in [KEYED.to_string(), format!("{TRUSTING_LOOPBACK}{KEYED}")] {
        let proxy = start_proxy(&upstream, &rules, |_, _| {}).await;
        let mut headers = ALIASES.to_vec();
        headers.extend(["X-Api-Key: mine", "X_Trace_Id: 7"]);
        let (status, received) = exchange(&proxy, &seen, &request("GET", "/", &headers, b"")).await;
        assert_eq!((status, received.len()), (200, 1), "{rules}");
        let underscored: Vec<&String> =
            received[0].headers.iter().map(|(name, _)| name).filter(|name| name.contains('_')).collect();
        assert_eq!(underscored, ["x_trace_id"], "only a name nothing else is spelled as: {rules}");
        assert_eq!(received[0].lines("x-api-key"), ["mine"]);
        proxy.stop().await;
    }
    // A rule reading an underscored name: the dashed spelling is the alias.
    let rules = "[[rules]]\nname = \"keyed\"\nlimit = \"3/1m\"\nkey = [\"header:api_key\"]\n";
    let proxy = start_proxy(&upstream, rules, |_, _| {}).await;
    let (status, received) =
        exchange(&proxy, &seen, &request("GET", "/", &["api_key: mine", "Api-Key: other"], b"")).await;
    assert_eq!((status, received.len()), (200, 1));
    assert_eq!((received[0].lines("api_key"), received[0].has("api-key")), (vec!["mine".to_string()], false));
    proxy.stop().await;
}

/// Principle 13: an upstream response declaring both `Transfer-Encoding` and `Content-Length`
/// (RFC 9112 section 6.3: read as chunked, and a proxy removes the length) was passed on with
/// both; hyper refused to write it and closed the client's connection without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_gets_the_upstreams_body_as_the_proxy_frames_it() {
    let (upstream, _seen) = raw_upstream::start().await;
    let proxy = start_proxy(&upstream, "", |_, _| {}).await;
    let mut client = Client::connect(&proxy).await;
    client.send(&request("GET", "/chunked-and-length", &[], b"")).await;
    let response = client.response().await;
    let got = response.as_ref().map(|r| (r.status, r.body.clone(), r.header("content-length")));
    assert_eq!(got, Some((200, b"hello".to_vec(), None)), "{response:?}");
    // And the connection goes on.
    client.send(&request("GET", "/next", &[], b"")).await;
    assert_eq!(client.response().await.map(|r| r.body), Some(b"/next".to_vec()));
    proxy.stop().await;
}
