//! A web page a user visits cannot drive the control planes (issue 35 item 5), byte for byte on
//! real sockets: `serve`'s HTTP API and `tollgate proxy`'s admin listener answer only a `Host`
//! that cannot be rebound (an IP literal, `localhost`) or that the operator named, anything else
//! a 421 on every route (DNS rebinding: a page's own name resolving to 127.0.0.1); `POST
//! /v1/check` takes `application/json` alone, which a page can send across sites only after a
//! CORS preflight the server never grants (415 otherwise: the `text/plain` POST a page sends
//! without one spends nothing); and the RESP listener closes a connection that speaks HTTP, as
//! Redis does, before the body of a page's POST is run as commands.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use axum::Router;
use common::Server;
use common::proxy::Proxy;
use tollgate_rules::Rules;
use tollgate_server::Config;
use tollgate_server::proxy::ProxyConfig;

/// Sends `head` (request line and headers, each ending `\r\n`, without the blank line) and
/// `body` on a fresh connection; the whole response.
fn http(at: SocketAddr, head: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(at).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = format!("{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// The status of a response.
fn status(response: &str) -> u16 {
    response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// `POST /v1/check` with `Host: host` and this `Content-Type` line (none if empty).
fn check(at: SocketAddr, host: &str, content_type: &str, body: &str) -> String {
    let content_type =
        if content_type.is_empty() { String::new() } else { format!("Content-Type: {content_type}\r\n") };
    http(at, &format!("POST /v1/check HTTP/1.1\r\nHost: {host}\r\n{content_type}"), body)
}

/// What a page on another site sends with `fetch(url, {method: "POST", body})`: a "simple"
/// request, sent at once, without a CORS preflight. Before: a 200 that spent the key for 50 days,
/// and the key's own JSON check was then a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_post_spends_nothing() {
    let server = Server::start(common::manual_config()).await;
    let at = server.http;
    let local = format!("127.0.0.1:{}", at.port());
    let poison = r#"{"key":"user:42","limit":"1/50d"}"#;
    for content_type in ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data", ""] {
        let response = check(at, &local, content_type, poison);
        assert_eq!(status(&response), 415, "{content_type:?}: {response}");
        assert!(response.contains("application/json"), "says what it takes: {response}");
    }
    let response = check(at, &local, "application/json", poison);
    assert_eq!(status(&response), 200, "the key was never spent: {response}");
    let response = check(at, &local, "Application/JSON; charset=utf-8", r#"{"key":"b","limit":"1/50d"}"#);
    assert_eq!(status(&response), 200, "parameters and case are fine: {response}");
    server.stop().await;
}

/// DNS rebinding: a page on `rebind.example` whose name then resolves to 127.0.0.1 reads and
/// writes the API as its own origin, sending `Host: rebind.example:PORT`. Before: every route
/// answered it (the check spent the key; `/metrics` and `/healthz` were readable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_name_is_refused_on_every_route() {
    let server = Server::start(common::manual_config()).await;
    let (at, port) = (server.http, server.http.port());
    let rebound = format!("rebind.example:{port}");
    let response = check(at, &rebound, "application/json", r#"{"key":"k","limit":"1/50d"}"#);
    assert_eq!(status(&response), 421, "{response}");
    assert!(response.contains("--http-allowed-host rebind.example"), "says how to allow it: {response}");
    for path in ["/metrics", "/healthz"] {
        let response = http(at, &format!("GET {path} HTTP/1.1\r\nHost: {rebound}\r\n"), "");
        assert_eq!(status(&response), 421, "{path}: {response}");
    }
    // Names that cannot be rebound, with or without the port; and no Host at all (HTTP/1.0: no
    // browser sends that).
    for host in [format!("localhost:{port}"), "LOCALHOST".into(), format!("127.0.0.1:{port}"), "[::1]".into()] {
        let response = http(at, &format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n"), "");
        assert_eq!(status(&response), 200, "{host}: {response}");
    }
    assert_eq!(status(&http(at, "GET /healthz HTTP/1.0\r\n", "")), 200, "no Host");
    let response = check(at, &format!("localhost:{port}"), "application/json", r#"{"key":"k","limit":"1/50d"}"#);
    assert_eq!(status(&response), 200, "the refused check spent nothing: {response}");
    server.stop().await;
}

/// `tollgate proxy`'s admin listener: `/v1/rules/{name}/top` lists keys (which can hold cookies
/// or API keys), so it answers only its own names too. The proxy's own listener forwards any
/// Host, as before. Before: the top talkers were answered to a rebound name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_admin_listener_refuses_a_rebound_name() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_at = upstream.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(upstream, Router::new().fallback(|| async { "upstream" })).await });
    let rules = Rules::parse(
        "[[rules]]\nname = \"by-session\"\nlimit = \"100/1m\"\nkey = [\"cookie:session\"]\nrate_half_life = \"2s\"\n\
         when_rate_above = \"50/s\"\n",
        "admin",
    )
    .unwrap();
    let proxy = ProxyConfig {
        upstream: format!("http://{upstream_at}"),
        rules,
        rules_file: None,
        options: Default::default(),
        upstream_timeout: Duration::from_secs(10),
        tls: None,
        limits: Default::default(),
    };
    let proxy = Proxy::start(Config::default(), proxy).await;
    let forwarded = http(proxy.at, "GET / HTTP/1.1\r\nHost: any.example\r\nCookie: session=SECRET\r\n", "");
    assert!(forwarded.starts_with("HTTP/1.1 200") && forwarded.ends_with("upstream"), "{forwarded}");
    let top = |host: &str| http(proxy.admin, &format!("GET /v1/rules/by-session/top HTTP/1.1\r\nHost: {host}\r\n"), "");
    let response = top(&format!("rebind.example:{}", proxy.admin.port()));
    assert_eq!(status(&response), 421, "{response}");
    assert!(!response.contains("SECRET") && response.contains("--admin-allowed-host"), "{response}");
    let response = top(&format!("localhost:{}", proxy.admin.port()));
    assert!(status(&response) == 200 && response.contains("SECRET"), "{response}");
    let metrics = http(proxy.admin, "GET /metrics HTTP/1.1\r\nHost: rebind.example\r\n", "");
    assert_eq!(status(&metrics), 421, "{metrics}");
    proxy.stop().await;
}

/// A page's `text/plain` POST to the RESP port: its request line and headers are inline commands
/// to a RESP parser, and its body too. Before: the server answered each HTTP line with an unknown
/// command error and ran the body's `CL.THROTTLE`, spending `victim`. Now the first line answers
/// an error and closes the connection, as Redis does (`POST` and `Host:`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resp_listener_closes_a_connection_that_speaks_http() {
    let server = Server::start(common::manual_config()).await;
    let body = "CL.THROTTLE victim 0 1 3600\r\n";
    let attack = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        server.resp.port(),
        body.len()
    );
    let reply = server.raw(attack.as_bytes());
    assert!(reply.starts_with("-ERR") && reply.contains("SECURITY ATTACK"), "{reply:?}");
    assert_eq!(reply.matches("\r\n").count(), 1, "one error, then closed: {reply:?}");
    // Any request line, and a header line alone, close it too.
    for line in ["GET /healthz HTTP/1.1\r\n", "PUT /x HTTP/1.0\r\nPING\r\n", "host: 127.0.0.1\r\nPING\r\n"] {
        let reply = server.raw(line.as_bytes());
        assert!(reply.contains("SECURITY ATTACK") && !reply.contains("PONG"), "{line:?}: {reply:?}");
    }
    let reply = server.raw(b"CL.THROTTLE victim 0 1 3600\r\n");
    assert!(reply.starts_with("*5\r\n:0\r\n"), "victim was never spent: {reply:?}");
    // A command that only looks like a method stays a command.
    let reply = server.raw(b"GET /x\r\nPING\r\n");
    assert!(!reply.contains("SECURITY") && reply.ends_with("+PONG\r\n"), "{reply:?}");
    server.stop().await;
}
