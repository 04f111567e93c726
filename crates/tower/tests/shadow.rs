//! A shadow-ban's fake success next to the route's real responses, through the middleware on
//! tokio's paused clock (the app's latency and the fake's wait are exact and instant): the fake
//! carries the route's headers (its stable ones as they are, per-response and personal ones
//! synthesized, never another client's), waits as long as the route's real responses took, keeps
//! the `RateLimit` fields of an allowed response, and a flood of fakes waits in a bounded way.
//!
//! Before: the fake had only `content-type`, answered at once (0 ms against the route's 220 ms)
//! and, with `headers_on_allowed`, dropped the `RateLimit` fields right after `r=0`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tollgate_core::ManualClock;
use tollgate_engine::Engine;
use tollgate_rules::Rules;
use tollgate_store::{Check, Limit, MemoryStore, Refund, Reserved, Store, StoreError};
use tollgate_tower::{Options, RateLimitLayer};
use tower_service::Service;

const T0: u64 = 1_700_000_000_000_000_000;
/// How long the route's real responses take.
const APP_LATENCY: Duration = Duration::from_millis(220);

/// Two requests per minute per client, then the fake page.
const RULES: &str = "[[rules]]\nname = \"page\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
                     [rules.mitigation]\naction = \"shadow-ban\"\nbody = \"<p>fake</p>\"\ncontent_type = \"text/html\"\n";

/// The validators of `/static`, the same for every client.
const STATIC_ETAG: &str = "\"9bc04e77370bcf3e\"";
const STATIC_MODIFIED: &str = "Tue, 14 Nov 2023 22:13:20 GMT";

/// A store that must be waited for, as Redis is: the middleware then decides in a task.
struct Waited(MemoryStore);

impl Store for Waited {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        tokio::task::yield_now().await;
        self.0.reserve(checks).await
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.0.refund(refunds).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.0.reset(scope, key, limit).await
    }
}

struct App {
    router: Router,
    hits: Arc<AtomicU64>,
    registry: Arc<Registry>,
}

/// `GET /page`, answered after [`APP_LATENCY`] with a server name, an app header, a
/// per-response id and a session cookie of its own (`sid=S<n>`).
fn app_on<S: Store + 'static>(store: S, clock: Arc<ManualClock>, rules: &str, options: Options) -> App {
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap();
    let engine = Arc::new(Engine::builder(store, rules).clock(clock).build(&mut registry));
    let layer = RateLimitLayer::from_engine(engine, options);
    layer.register_metrics(&mut registry);
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    let router = Router::new()
        .route(
            "/page",
            get(move || {
                let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
                async move {
                    tokio::time::sleep(APP_LATENCY).await;
                    let headers = [
                        ("server", "upstream/1.2".to_string()),
                        ("x-app-version", "7".to_string()),
                        ("x-request-id", format!("{:016x}", 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(n))),
                        ("set-cookie", format!("sid=S{n:08}; Path=/; HttpOnly")),
                        ("content-type", "text/html".to_string()),
                    ];
                    let mut response = format!("<p>real {n}</p>").into_response();
                    for (name, value) in headers {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                    response
                }
            }),
        )
        // A static page and its validators, revalidated as nginx does (304 only when every
        // validator sent matches).
        .route(
            "/static",
            get(|headers: HeaderMap| async move {
                let validators =
                    [("etag", STATIC_ETAG), ("last-modified", STATIC_MODIFIED), ("cache-control", "max-age=60")];
                let tag = headers.get("if-none-match");
                let date = headers.get("if-modified-since");
                if (tag.is_some() || date.is_some())
                    && tag.is_none_or(|tag| tag == STATIC_ETAG)
                    && date.is_none_or(|date| date == STATIC_MODIFIED)
                {
                    (StatusCode::NOT_MODIFIED, validators).into_response()
                } else {
                    (validators, "<p>static</p>").into_response()
                }
            }),
        )
        // The site's name, as a multi-site upstream (a tenant's subdomain) names it.
        .route(
            "/site",
            get(|headers: HeaderMap| async move {
                let host = headers.get("host").cloned().unwrap_or(axum::http::HeaderValue::from_static(""));
                ([("x-site", host)], "<p>real</p>")
            }),
        )
        .layer(layer);
    App { router, hits, registry: Arc::new(registry) }
}

fn app(options: Options) -> App {
    let clock = Arc::new(ManualClock::new(T0));
    app_on(MemoryStore::builder().clock(clock.clone()).build(), clock, RULES, options)
}

fn app_waited(options: Options) -> App {
    let clock = Arc::new(ManualClock::new(T0));
    app_on(Waited(MemoryStore::builder().clock(clock.clone()).build()), clock, RULES, options)
}

fn request(peer: &str) -> Request<Body> {
    request_to(peer, "/page", "example.com")
}

fn request_to(peer: &str, path: &str, host: &str) -> Request<Body> {
    let mut request = Request::builder().uri(path).header("host", host).body(Body::empty()).unwrap();
    let peer: SocketAddr = format!("{peer}:40000").parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// A response, and how long it took on tokio's clock.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
    took: Duration,
}

impl App {
    /// The response future of a request from `peer`, called but not yet polled.
    async fn call(&self, peer: &str) -> axum::routing::future::RouteFuture<std::convert::Infallible> {
        self.call_with(request(peer)).await
    }

    async fn call_with(&self, request: Request<Body>) -> axum::routing::future::RouteFuture<std::convert::Infallible> {
        let mut router = self.router.clone();
        std::future::poll_fn(|cx| <Router as Service<Request<Body>>>::poll_ready(&mut router, cx)).await.unwrap();
        router.call(request)
    }

    async fn send(&self, peer: &str) -> Answer {
        self.send_to(peer, "/page", "example.com").await
    }

    async fn send_to(&self, peer: &str, path: &str, host: &str) -> Answer {
        self.send_request(request_to(peer, path, host)).await
    }

    async fn send_request(&self, request: Request<Body>) -> Answer {
        let started = Instant::now();
        let response = self.call_with(request).await.await.unwrap();
        read(response, started).await
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }
}

async fn read(response: axum::response::Response, started: Instant) -> Answer {
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let took = started.elapsed();
    Answer { status: parts.status, headers: parts.headers, body: String::from_utf8_lossy(&bytes).into_owned(), took }
}

fn value<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
    headers.get(name).unwrap_or_else(|| panic!("no {name} in {headers:?}")).to_str().unwrap()
}

fn names(headers: &HeaderMap) -> Vec<String> {
    headers.keys().map(ToString::to_string).collect()
}

/// A fake's field names, its `Cache-Control` (which no real response here has) left out: no
/// shared cache stores it, nor any past the ban (here the window's 40 s left).
fn fake_names(headers: &HeaderMap) -> Vec<String> {
    assert_eq!(value(headers, "cache-control"), "private, max-age=40", "a fake is one client's: {headers:?}");
    names(headers).into_iter().filter(|name| name != "cache-control").collect()
}

/// Each letter or digit as its class: `S00000001` and `S48213907` have one shape.
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

#[tokio::test(start_paused = true)]
async fn a_fake_looks_and_waits_like_the_routes_real_responses() {
    fake_like_real(app(Options::default())).await;
}

#[tokio::test(start_paused = true)]
async fn a_fake_looks_and_waits_like_the_routes_real_responses_on_a_store_that_must_be_waited_for() {
    fake_like_real(app_waited(Options::default())).await;
}

async fn fake_like_real(app: App) {
    // Three clients' real responses (so that a value they all got is known to be nobody's own),
    // then the first client's third request: banned.
    let mut real = Vec::new();
    for peer in ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.1"] {
        let answer = app.send(peer).await;
        assert!(answer.body.starts_with("<p>real"), "{}", answer.body);
        assert!(answer.took >= APP_LATENCY, "{:?}", answer.took);
        real.push(answer);
    }
    let fake = app.send("192.0.2.1").await;
    assert_eq!((fake.status, fake.body.as_str()), (StatusCode::OK, "<p>fake</p>"));
    assert_eq!(app.hits.load(Ordering::Relaxed), 4, "the fake never reached the app");

    // The same fields, in the same order, and a `Cache-Control` that no shared cache stores.
    assert_eq!(
        fake_names(&fake.headers),
        names(&real[3].headers),
        "fake {:?}\nreal {:?}",
        fake.headers,
        real[3].headers
    );
    // The stable ones as the app wrote them.
    for name in ["server", "x-app-version", "content-type"] {
        assert_eq!(value(&fake.headers, name), value(&real[3].headers, name), "{name}");
    }
    // The per-response id and the session cookie: shaped like the real ones, none of them.
    let id = value(&fake.headers, "x-request-id");
    let cookie = value(&fake.headers, "set-cookie");
    for real in &real {
        assert_ne!(id, value(&real.headers, "x-request-id"));
        assert_ne!(cookie, value(&real.headers, "set-cookie"), "another client's session is never replayed");
        assert_eq!(id.len(), value(&real.headers, "x-request-id").len(), "{id}");
    }
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "hex stays hex: {id}");
    assert!(cookie.starts_with("sid=") && cookie.ends_with("; Path=/; HttpOnly"), "{cookie}");
    assert_eq!(shape(cookie), shape("sid=S00000001; Path=/; HttpOnly"), "{cookie}");

    // As slow as the route (on tokio's paused clock: no wall-clock bound).
    assert!(fake.took >= APP_LATENCY, "the fake took {:?}, the route's real responses {APP_LATENCY:?}", fake.took);
}

/// Before: `RateLimit: "page";r=0;t=…` on the last allowed response, then no field at all.
#[tokio::test(start_paused = true)]
async fn with_headers_on_allowed_a_fake_keeps_the_ratelimit_fields() {
    let app = app(Options { headers_on_allowed: true, legacy_headers: true, ..Options::default() });
    let first = app.send("192.0.2.1").await;
    let last = app.send("192.0.2.1").await;
    assert_eq!(value(&first.headers, "ratelimit").split(";t=").next(), Some("\"page\";r=1"));
    assert_eq!(value(&last.headers, "ratelimit").split(";t=").next(), Some("\"page\";r=0"));
    for _ in 0..3 {
        let fake = app.send("192.0.2.1").await;
        assert_eq!(fake.body, "<p>fake</p>");
        assert_eq!(fake_names(&fake.headers), names(&last.headers), "fake {:?}\nreal {:?}", fake.headers, last.headers);
        assert_eq!(value(&fake.headers, "ratelimit-policy"), value(&last.headers, "ratelimit-policy"));
        // Remaining 0, as on the last allowed response, and the window's reset.
        assert_eq!(value(&fake.headers, "ratelimit"), value(&last.headers, "ratelimit"));
        assert_eq!(value(&fake.headers, "x-ratelimit-remaining"), "0");
        assert_eq!(value(&fake.headers, "x-ratelimit-limit"), value(&last.headers, "x-ratelimit-limit"));
    }
}

fn assert_metrics(app: &App, wanted: &[&str]) {
    let metrics = app.metrics();
    for wanted in wanted {
        assert!(metrics.contains(wanted), "{wanted}: {metrics}");
    }
}

/// At most `shadow_ban_max_waiting` fakes wait at once; the others are answered at once, and
/// counted. Before: no bound (and no wait).
#[tokio::test(start_paused = true)]
async fn a_flood_of_fakes_waits_in_a_bounded_way() {
    let app = app(Options { shadow_ban_max_waiting: 2, ..Options::default() });
    for _ in 0..2 {
        app.send("192.0.2.1").await;
    }
    // Five fakes at once: each takes its place (or not) when first polled (the router calls the
    // layer then), in the order they were spawned.
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let call = app.call("192.0.2.1").await;
        answers.push(tokio::spawn(async move { read(call.await.unwrap(), started).await }));
        tokio::task::yield_now().await;
    }
    assert_metrics(
        &app,
        &[
            "tollgate_shadow_ban_fakes_total{rule=\"page\",delay=\"learned\"} 2",
            "tollgate_shadow_ban_fakes_total{rule=\"page\",delay=\"over_cap\"} 3",
            "tollgate_shadow_ban_waiting 2",
        ],
    );
    let mut took = Vec::new();
    for answer in answers {
        let answer = answer.await.unwrap();
        assert_eq!(answer.body, "<p>fake</p>");
        took.push(answer.took);
    }
    // Tokio's paused clock: the two that waited took the route's latency, the others nothing.
    assert!(took[..2].iter().all(|t| *t >= APP_LATENCY) && took[2..].iter().all(|t| *t < APP_LATENCY), "{took:?}");
    assert_metrics(&app, &["tollgate_shadow_ban_waiting 0"]);
    // The places are free again.
    assert!(app.send("192.0.2.1").await.took >= APP_LATENCY);
    assert_metrics(&app, &["tollgate_shadow_ban_fakes_total{rule=\"page\",delay=\"learned\"} 3"]);
}

/// A fake of a status the route never answered has nothing to look like: the configured body
/// and content type alone, at once (documented), counted `none_learned`.
#[tokio::test(start_paused = true)]
async fn a_fake_with_nothing_learned_is_bare_and_at_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let rules = RULES.replace("action = \"shadow-ban\"", "action = \"shadow-ban\"\nstatus = 203");
    let app = app_on(MemoryStore::builder().clock(clock.clone()).build(), clock, &rules, Options::default());
    for _ in 0..2 {
        app.send("192.0.2.1").await;
    }
    let fake = app.send("192.0.2.1").await;
    assert_eq!((fake.status, fake.body.as_str()), (StatusCode::NON_AUTHORITATIVE_INFORMATION, "<p>fake</p>"));
    assert_eq!(names(&fake.headers), ["content-type", "cache-control", "content-length"]);
    assert_eq!(value(&fake.headers, "cache-control"), "private, max-age=40", "a fake is one client's, for its ban");
    assert!(fake.took < APP_LATENCY, "{:?}", fake.took);
    assert_metrics(&app, &["tollgate_shadow_ban_fakes_total{rule=\"page\",delay=\"none_learned\"} 1"]);
}

/// One upstream serving several sites (tenants on subdomains): a fake on one site never carries
/// another site's fields, which three of its clients got alike. Before: `x-site: alice.example`
/// on bob.example's fake.
#[tokio::test(start_paused = true)]
async fn a_fake_on_one_site_never_carries_anothers_fields() {
    let app = app(Options::default());
    // Bob's budget, on his site's page.
    for _ in 0..2 {
        app.send_to("192.0.2.9", "/page", "bob.example").await;
    }
    for peer in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
        let real = app.send_to(peer, "/site", "alice.example").await;
        assert_eq!(value(&real.headers, "x-site"), "alice.example");
    }
    // Bob's third: banned, on a route of his site not learned yet: his site's page's fields.
    let fake = app.send_to("192.0.2.9", "/site", "Bob.Example:80").await;
    assert_eq!(fake.body, "<p>fake</p>");
    assert!(fake.headers.get("x-site").is_none(), "another site's field: {:?}", fake.headers);
    assert_eq!(value(&fake.headers, "server"), "upstream/1.2", "{:?}", fake.headers);
}

/// A banned client that names a host nothing was learned on (any `Host` reaches a single-site
/// upstream alike) still gets the rule's shape, from any host: the server's fields as they are,
/// the application's made anew (another site's values are never shown), a learned latency.
/// Before: a bare fake, answered at once, where the real one has every field.
#[tokio::test(start_paused = true)]
async fn a_fake_on_a_host_never_learned_keeps_the_rules_shape_but_no_sites_values() {
    let app = app(Options::default());
    for peer in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
        app.send_to(peer, "/page", "example.com").await;
    }
    let mut last = None;
    for _ in 0..2 {
        last = Some(app.send_to("192.0.2.9", "/page", "example.com").await);
    }
    let last = last.unwrap();
    let fake = app.send_to("192.0.2.9", "/page", "never-seen.example").await;
    assert_eq!(fake.body, "<p>fake</p>");
    assert_eq!(fake_names(&fake.headers), names(&last.headers), "fake {:?}\nreal {:?}", fake.headers, last.headers);
    assert_eq!(value(&fake.headers, "server"), "upstream/1.2");
    assert_eq!(shape(value(&fake.headers, "x-app-version")), "9");
    assert!(fake.took >= APP_LATENCY, "{:?}", fake.took);

    // Another site's value, which three of its clients got alike, is made anew.
    for peer in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
        app.send_to(peer, "/site", "alice.example").await;
    }
    let fake = app.send_to("192.0.2.9", "/site", "carol.example").await;
    assert_eq!(fake.body, "<p>fake</p>");
    let site = value(&fake.headers, "x-site");
    assert!(site != "alice.example" && shape(site) == "aaaaa.aaaaaaa", "another site's value: {:?}", fake.headers);
}

/// A fake the client's cache keeps (`max-age`, then revalidated) is never taken for the real
/// page once the ban ends: revalidated with the fake's own validators, the app answers the real
/// page. Before: the fake's `ETag` and `Last-Modified` were the real ones, the app answered 304,
/// and the client's cache went on showing the fake.
#[tokio::test(start_paused = true)]
async fn a_cached_fake_is_never_revalidated_as_the_real_page() {
    let clock = Arc::new(ManualClock::new(T0));
    let app = app_on(MemoryStore::builder().clock(clock.clone()).build(), clock.clone(), RULES, Options::default());
    for peer in ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.9", "192.0.2.9"] {
        assert_eq!(app.send_to(peer, "/static", "example.com").await.body, "<p>static</p>");
    }
    let fake = app.send_to("192.0.2.9", "/static", "example.com").await;
    assert_eq!(fake.body, "<p>fake</p>");
    // The ban ends with its window, and the client's cache revalidates what it kept.
    clock.advance(Duration::from_secs(60));
    let mut request = request_to("192.0.2.9", "/static", "example.com");
    for (condition, validator) in [("if-none-match", "etag"), ("if-modified-since", "last-modified")] {
        request.headers_mut().insert(condition, fake.headers[validator].clone());
    }
    let revalidated = app.send_request(request).await;
    assert_eq!(
        (revalidated.status, revalidated.body.as_str()),
        (StatusCode::OK, "<p>static</p>"),
        "{:?}",
        fake.headers
    );
}

/// A client that sends its session cookie is never sent another in its place: once the ban
/// ends its session goes on (a real logout's `Set-Cookie` would not be replayed either). Before:
/// `set-cookie: sid=<random>` on the fake, which the browser kept in place of its own.
#[tokio::test(start_paused = true)]
async fn a_fake_never_replaces_a_cookie_the_client_sent() {
    let app = app(Options::default());
    for peer in ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.1"] {
        app.send(peer).await;
    }
    let mut request = request("192.0.2.1");
    request.headers_mut().insert("cookie", "theme=dark; sid=S00000001".parse().unwrap());
    let fake = app.send_request(request).await;
    assert_eq!(fake.body, "<p>fake</p>");
    assert!(fake.headers.get("set-cookie").is_none(), "{:?}", fake.headers);
    assert_eq!(value(&fake.headers, "x-app-version"), "7");
    // Without it: a cookie of its own, as the real responses set one.
    let fake = app.send("192.0.2.1").await;
    assert!(value(&fake.headers, "set-cookie").starts_with("sid="), "{:?}", fake.headers);
}

/// A fake the client's cache keeps is kept no longer than the ban: its `max-age` is at most the
/// time until the client is let through again (here the window's 40 s left; the real one says
/// 60). Before: `max-age=60`, and a year for a real `max-age=31536000, immutable`, which kept a
/// wrongly banned client's cache showing the fake long after its ban.
#[tokio::test(start_paused = true)]
async fn a_fake_is_never_cached_past_its_ban() {
    let app = app(Options::default());
    for _ in 0..2 {
        assert_eq!(app.send_to("192.0.2.9", "/static", "example.com").await.body, "<p>static</p>");
    }
    let fake = app.send_to("192.0.2.9", "/static", "example.com").await;
    assert_eq!(fake.body, "<p>fake</p>");
    assert_eq!(value(&fake.headers, "cache-control"), "max-age=40, private", "{:?}", fake.headers);
}

/// A client that names other addresses in a forwarding header is still one client (the header
/// counts only from a trusted proxy): its own value is never taken for one three clients got.
/// Through a trusted proxy the same three requests are three clients.
#[tokio::test(start_paused = true)]
async fn forwarded_addresses_count_as_clients_only_from_a_trusted_proxy() {
    for (trusted, replayed) in [("", false), ("trusted_proxies = [\"192.0.2.1/32\"]\n", true)] {
        let clock = Arc::new(ManualClock::new(T0));
        let rules = format!("{trusted}{}", RULES.replace("2/1m", "4/1m"));
        let app = app_on(MemoryStore::builder().clock(clock.clone()).build(), clock, &rules, Options::default());
        // Then 198.51.100.1's fifth, over either way (as one client of the peer's, or as itself).
        for last in [".1", ".2", ".3", ".1", ".1", ".1"] {
            let forwarded = format!("198.51.100{last}");
            let mut request = request_to("192.0.2.1", "/site", "alice.example");
            request.headers_mut().insert("x-forwarded-for", forwarded.parse().unwrap());
            app.send_request(request).await;
        }
        let mut request = request_to("192.0.2.1", "/site", "alice.example");
        request.headers_mut().insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
        let fake = app.send_request(request).await;
        assert_eq!(fake.body, "<p>fake</p>", "{trusted}");
        assert_eq!(value(&fake.headers, "x-site") == "alice.example", replayed, "{trusted}: {:?}", fake.headers);
    }
}
