//! `tollgate proxy`'s shadow-ban next to a slow upstream's real responses, read as raw bytes (the
//! header lines in the order they were sent): the fake carries the upstream's fields (`Server`,
//! an app header, a `Set-Cookie` of its own shape but never another client's, `Date` now, chunked
//! when the upstream chunks), takes as long as the route's real responses, keeps the `RateLimit`
//! fields with `--headers-on-allowed`, and a flood of fakes waits in a bounded way.
//!
//! Before: the fake had `content-type`, `content-length` and `date` alone, answered in about a
//! millisecond against the upstream's 200, and dropped the `RateLimit` fields after `r=0`.

mod common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response as AxumResponse};
use axum::routing::get;
use bytes::Bytes;
use common::proxy::Proxy;
use common::raw_client::{Client, Response, request};
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::proxy::ProxyConfig;
use tollgate_tower::Options;

/// How long the upstream takes on `/page` and `/stream`.
const LATENCY: Duration = Duration::from_millis(200);
/// How long it takes on `/long` (the flood's route: its fakes outlast the flood's sending).
const LONG: Duration = Duration::from_secs(2);

/// A body that does not give its length: the upstream sends it chunked.
struct Unsized(Body);

impl http_body::Body for Unsized {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }
}

/// The upstream's response number `n`, after `latency`: a server name, an app header, a
/// per-response id and a session cookie of its own.
async fn page(n: u64, latency: Duration, chunked: bool) -> AxumResponse {
    tokio::time::sleep(latency).await;
    let body = Body::from(format!("real page {n}"));
    let mut response = if chunked { Body::new(Unsized(body)).into_response() } else { body.into_response() };
    let headers = [
        ("server", "upstream/1.2".to_string()),
        ("x-app-version", "7".to_string()),
        ("x-request-id", format!("{:016x}", 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(n))),
        ("set-cookie", format!("sid=S{n:08}; Path=/; HttpOnly")),
        ("content-type", "text/html".to_string()),
    ];
    for (name, value) in headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// `<html>real page</html>`, gzipped.
const GZIPPED: [u8; 38] = [
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xb3, 0xc9, 0x28, 0xc9, 0xcd, 0xb1, 0x2b, 0x4a, 0x4d,
    0xcc, 0x51, 0x28, 0x48, 0x4c, 0x4f, 0xb5, 0xd1, 0x07, 0xf3, 0x01, 0xfa, 0x33, 0xcf, 0x3c, 0x16, 0x00, 0x00, 0x00,
];

/// A page as a web server compresses it and lets a CDN keep it: the same for every client.
async fn compressed() -> AxumResponse {
    let headers = [
        ("content-type", "text/html"),
        ("content-encoding", "gzip"),
        ("vary", "Accept-Encoding"),
        ("cache-control", "public, max-age=600"),
        ("cdn-cache-control", "max-age=3600"),
    ];
    (headers, &GZIPPED[..]).into_response()
}

async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let (a, b, c) = (hits.clone(), hits.clone(), hits.clone());
    let app = Router::new()
        .route("/page", get(move || page(a.fetch_add(1, Ordering::Relaxed) + 1, LATENCY, false)))
        .route("/stream", get(move || page(b.fetch_add(1, Ordering::Relaxed) + 1, LATENCY, true)))
        .route("/long", get(move || page(c.fetch_add(1, Ordering::Relaxed) + 1, LONG, false)))
        .route("/compressed", get(compressed));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, hits)
}

/// Two requests a minute per client (behind the trusted 127.0.0.1, the `X-Forwarded-For`
/// address), then the fake page.
fn rules() -> Rules {
    Rules::parse(
        "trusted_proxies = [\"127.0.0.1/32\"]\n[[rules]]\nname = \"page\"\nlimit = \"2/1m\"\n\
         algorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         [rules.mitigation]\naction = \"shadow-ban\"\nbody = \"<p>fake</p>\"\ncontent_type = \"text/html\"\n",
        "t",
    )
    .unwrap()
}

async fn start(upstream: SocketAddr, options: Options) -> Proxy {
    let proxy = ProxyConfig {
        upstream: format!("http://{upstream}"),
        rules: rules(),
        rules_file: None,
        options,
        upstream_timeout: Duration::from_secs(30),
        tls: None,
        limits: Default::default(),
    };
    Proxy::start(common::manual_config(), proxy).await
}

/// `GET path` from `client`, on a connection of its own: the response and how long it took.
async fn get_from(proxy: &Proxy, path: &str, client: &str) -> (Response, Duration) {
    let mut connection = Client::connect(proxy).await;
    let started = Instant::now();
    connection.send(&request("GET", path, &[&format!("X-Forwarded-For: {client}")], b"")).await;
    let response = connection.response().await.expect("a response");
    (response, started.elapsed())
}

fn names(response: &Response) -> Vec<&str> {
    response.headers.iter().map(|(name, _)| name.as_str()).collect()
}

fn value<'r>(response: &'r Response, name: &str) -> &'r str {
    response.header(name).unwrap_or_else(|| panic!("no {name} in {:?}", response.headers))
}

fn shape(value: &str) -> String {
    value
        .chars()
        .map(|c| match c {
            '0'..='9' => '9',
            'a'..='z' => 'a',
            'A'..='Z' => 'A',
            other => other,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_looks_and_waits_like_the_upstreams_real_responses() {
    let (up, hits) = upstream().await;
    let proxy = start(up, Options { headers_on_allowed: true, ..Options::default() }).await;
    for (path, net) in [("/page", "198.51.100"), ("/stream", "203.0.113")] {
        // Three clients' real responses (so that a value they all got is known to be nobody's
        // own), then the first client's second one, and its third request: the fake.
        let client = format!("{net}.1");
        let before = hits.load(Ordering::Relaxed);
        let mut real = Vec::new();
        for from in [client.clone(), format!("{net}.2"), format!("{net}.3"), client.clone()] {
            let (response, took) = get_from(&proxy, path, &from).await;
            assert!(took >= LATENCY, "{took:?}");
            assert!(String::from_utf8_lossy(&response.body).starts_with("real page"), "{response:?}");
            real.push(response);
        }
        let last = &real[3];
        let (fake, took) = get_from(&proxy, path, &client).await;
        assert_eq!((fake.status, fake.body.as_slice()), (200, &b"<p>fake</p>"[..]), "{fake:?}");
        assert_eq!(hits.load(Ordering::Relaxed), before + 4, "the fake never reached the upstream");

        // The same header lines in the same order, the stable ones as the upstream sent them,
        // and a `Cache-Control` no shared cache stores (documented: a fake is one client's).
        assert!(value(&fake, "cache-control").starts_with("private, max-age="), "{path}: {:?}", fake.headers);
        let fake_names: Vec<_> = names(&fake).into_iter().filter(|name| *name != "cache-control").collect();
        assert_eq!(fake_names, names(last), "{path}: fake {:?}\nreal {:?}", fake.headers, last.headers);
        for name in ["server", "x-app-version", "content-type", "ratelimit-policy"] {
            assert_eq!(value(&fake, name), value(last, name), "{path}: {name}");
        }
        // Remaining 0, as on the last allowed response.
        assert_eq!(value(last, "ratelimit").split(";t=").next(), Some("\"page\";r=0"));
        assert_eq!(value(&fake, "ratelimit").split(";t=").next(), Some("\"page\";r=0"), "{path}");
        assert_eq!(shape(value(&fake, "date")), shape(value(last, "date")), "{path}: a date of its own");
        // Its own session cookie and id, shaped like the real ones, none of theirs.
        for real in &real {
            assert_ne!(value(&fake, "set-cookie"), value(real, "set-cookie"), "{path}");
            assert_ne!(value(&fake, "x-request-id"), value(real, "x-request-id"), "{path}");
        }
        assert_eq!(shape(value(&fake, "set-cookie")), shape(value(last, "set-cookie")), "{path}");
        assert_eq!(value(&fake, "x-request-id").len(), 16, "{path}");
        // Framed as the upstream frames the route.
        let chunked = path == "/stream";
        assert_eq!(fake.header("transfer-encoding").is_some(), chunked, "{path}: {:?}", fake.headers);
        assert_eq!(fake.header("content-length").is_some(), !chunked, "{path}: {:?}", fake.headers);

        // At least as long as the route's real responses took (a lower bound: the fake waited
        // one of them, each at least the upstream's 200 ms).
        assert!(took >= LATENCY, "{path}: the fake took {took:?}, the upstream {LATENCY:?}");
    }
    proxy.stop().await;
}

/// At most `shadow_ban_max_waiting` fakes wait at once; the others are answered at once, and
/// counted. Ten requests sent at once to a route whose real responses take 2 s: two wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_fakes_waits_in_a_bounded_way() {
    let (up, _) = upstream().await;
    let proxy = start(up, Options { shadow_ban_max_waiting: 2, ..Options::default() }).await;
    let attacker = "X-Forwarded-For: 198.51.100.9";
    // Two real responses at once (their budget), each 2 s.
    let mut real = Vec::new();
    for _ in 0..2 {
        let mut client = Client::connect(&proxy).await;
        client.send(&request("GET", "/long", &[attacker], b"")).await;
        real.push(client);
    }
    for client in &mut real {
        assert!(String::from_utf8_lossy(&client.response().await.unwrap().body).starts_with("real page"));
    }
    // Ten at once: each connection opened first, then the requests, all well within 2 s.
    let mut flood = Vec::new();
    for _ in 0..10 {
        flood.push(Client::connect(&proxy).await);
    }
    for client in &mut flood {
        client.send(&request("GET", "/long", &[attacker], b"")).await;
    }
    for client in &mut flood {
        assert_eq!(client.response().await.unwrap().body, b"<p>fake</p>");
    }
    let metrics = proxy.metrics().await;
    for wanted in [
        "tollgate_shadow_ban_fakes_total{rule=\"page\",delay=\"learned\"} 2",
        "tollgate_shadow_ban_fakes_total{rule=\"page\",delay=\"over_cap\"} 8",
        "tollgate_shadow_ban_waiting 0",
    ] {
        assert!(metrics.contains(wanted), "{wanted}: {metrics}");
    }
    proxy.stop().await;
}

/// A compressed, publicly cacheable page: the fake's body is the rule's as it is, so it says no
/// `Content-Encoding` (a browser would fail to decode it), and no cache in front may store it
/// (it would answer it to every client). Before: `content-encoding: gzip` on `<p>fake</p>`, and
/// `cache-control: public, max-age=600` with `cdn-cache-control: max-age=3600`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_of_a_compressed_public_page_is_plain_and_private() {
    let (up, _) = upstream().await;
    let proxy = start(up, Options::default()).await;
    let mut real = Vec::new();
    for client in ["198.51.100.21", "198.51.100.22", "198.51.100.23", "198.51.100.21"] {
        real.push(get_from(&proxy, "/compressed", client).await.0);
    }
    let last = &real[3];
    assert_eq!((last.header("content-encoding"), last.body.as_slice()), (Some("gzip"), &GZIPPED[..]));
    let (fake, _) = get_from(&proxy, "/compressed", "198.51.100.21").await;
    assert_eq!(fake.body, b"<p>fake</p>", "{fake:?}");
    assert_eq!(fake.header("content-encoding"), None, "a plain body said to be gzip: {:?}", fake.headers);
    // No longer than the ban either: the window's 40 s left on the proxy's stopped clock.
    assert_eq!(fake.header("cache-control"), Some("private, max-age=40"), "{:?}", fake.headers);
    assert_eq!(fake.header("cdn-cache-control"), None, "{:?}", fake.headers);
    assert_eq!(value(&fake, "vary"), "Accept-Encoding");
    proxy.stop().await;
}
