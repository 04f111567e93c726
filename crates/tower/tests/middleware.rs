//! The middleware driven directly as a tower service (no network where it adds nothing), on a
//! manual clock shared by the engine and the store: `examples/rules/login.toml`'s login defence, and each way around
//! a rule that existed before (each test says what it was).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use tollgate_core::{Limit, ManualClock};
use tollgate_engine::Engine;
use tollgate_rules::Rules;
use tollgate_store::{Check, MemoryStore, Refund, Reserved, Store, StoreError};
use tollgate_tower::{Options, PeerAddr, RateLimitLayer};
use tower_service::Service;

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// An app behind the layer, its hit counter, the clock and the metrics registry.
struct App {
    router: Router,
    hits: Arc<AtomicU64>,
    clock: Arc<ManualClock>,
    registry: Arc<Registry>,
}

/// A store that must be waited for, as Redis is: each call yields once before the memory store
/// decides. The middleware then admits requests from a task instead of in `call`.
struct Waited(MemoryStore);

impl Store for Waited {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        tokio::task::yield_now().await;
        self.0.reserve(checks).await
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        tokio::task::yield_now().await;
        self.0.refund(refunds).await
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.0.reset(scope, key, limit).await
    }
}

/// The app's handlers: `POST /login` (401 unless `x-password: right`, after `slow` ms), `GET /`;
/// on the memory store.
fn app(rules: &str, options: Options, slow: u64) -> App {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    app_on(store, clock, rules, options, slow)
}

/// [`app`] on a store that must be waited for.
fn app_waited(rules: &str, options: Options, slow: u64) -> App {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Waited(MemoryStore::builder().clock(clock.clone()).build());
    app_on(store, clock, rules, options, slow)
}

fn app_on<S: Store + 'static>(store: S, clock: Arc<ManualClock>, rules: &str, options: Options, slow: u64) -> App {
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap();
    let engine =
        Arc::new(Engine::builder(store, rules).clock(clock.clone()).routes(options.routes).build(&mut registry));
    let hits = Arc::new(AtomicU64::new(0));
    let (h1, h2) = (hits.clone(), hits.clone());
    let router = Router::new()
        .route(
            "/login",
            post(move |headers: HeaderMap| {
                let hits = h1.clone();
                async move {
                    hits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(slow)).await;
                    let right = headers.get("x-password").is_some_and(|p| p == "right");
                    if right { (StatusCode::OK, "welcome") } else { (StatusCode::UNAUTHORIZED, "no") }
                }
            }),
        )
        .route(
            "/",
            get(move || {
                let hits = h2.clone();
                async move {
                    hits.fetch_add(1, Ordering::Relaxed);
                    "home"
                }
            }),
        )
        .fallback(|| async { "other" })
        .layer(RateLimitLayer::from_engine(engine, options));
    App { router, hits, clock, registry: Arc::new(registry) }
}

fn request(method: &str, uri: &str, peer: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut request = builder.body(Body::empty()).unwrap();
    let peer: SocketAddr = format!("{peer}:40000").parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

impl App {
    async fn send(&self, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
        let mut router = self.router.clone();
        std::future::poll_fn(|cx| <Router as Service<Request<Body>>>::poll_ready(&mut router, cx)).await.unwrap();
        let response = router.call(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        (parts.status, parts.headers, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn status(&self, method: &str, uri: &str, peer: &str, headers: &[(&str, &str)]) -> StatusCode {
        self.send(request(method, uri, peer, headers)).await.0
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
    headers.get(name).unwrap_or_else(|| panic!("no {name}")).to_str().unwrap()
}

const LOGIN: &str = include_str!("../../../examples/rules/login.toml");
const PROXY: &str = "127.0.0.1";

#[tokio::test]
async fn seed_003_login_defence_blocks_the_ip_after_too_many_failures() {
    login_defence(app(LOGIN, Options::default(), 0)).await;
}

#[tokio::test]
async fn seed_003_login_defence_holds_on_a_store_that_must_be_waited_for() {
    login_defence(app_waited(LOGIN, Options::default(), 0)).await;
}

async fn login_defence(app: App) {
    let attacker = [("x-forwarded-for", "198.51.100.7")];
    // Successful logins do not count (their reservations are refunded).
    for _ in 0..10 {
        let ok = [("x-forwarded-for", "198.51.100.7"), ("x-password", "right")];
        assert_eq!(app.status("POST", "/login", PROXY, &ok).await, StatusCode::OK);
    }
    // Five failures reach the app; the sixth attempt is over the limit before it is forwarded.
    for attempt in 1..=5 {
        assert_eq!(app.status("POST", "/login", PROXY, &attacker).await, StatusCode::UNAUTHORIZED, "failure {attempt}");
    }
    assert_eq!(app.status("POST", "/login", PROXY, &attacker).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(app.hits(), 15);
    // Now every request from that IP is refused for the timeout, whatever it claims on the left.
    app.clock.advance(Duration::from_secs(30));
    for headers in [
        vec![("x-forwarded-for", "198.51.100.7")],
        vec![("x-forwarded-for", "1.2.3.4, 198.51.100.7")],
        vec![("x-forwarded-for", "198.51.100.7"), ("x-password", "right")],
    ] {
        let (status, response, _) = app.send(request("GET", "/", PROXY, &headers)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{headers:?}");
        assert_eq!(header(&response, "retry-after"), "30", "the timeout's 60 s, 30 s in");
    }
    assert_eq!(app.status("GET", "/", PROXY, &[("x-forwarded-for", "198.51.100.8")]).await, StatusCode::OK);
    app.clock.advance(Duration::from_secs(31));
    assert_eq!(app.status("GET", "/", PROXY, &attacker).await, StatusCode::OK, "the timeout ended");
    let metrics = app.metrics();
    for wanted in ["outcome=\"counted\"} 5", "outcome=\"refunded\"} 10", "outcome=\"rejected\"} 4"] {
        assert!(
            metrics.contains(&format!("tollgate_rule_decisions_total{{rule=\"login-failures\",{wanted}")),
            "{wanted}: {metrics}"
        );
    }
    // Every request decided by the engine is timed, the ones a mitigation answered included.
    let timed = "tollgate_decision_duration_seconds_count{frontend=\"middleware\"} 21\n";
    assert!(metrics.contains(timed), "{timed}: {metrics}");
}

/// Before: a `count_status` rule counted after the response only, so 40 concurrent failed logins
/// all reached the upstream. Now each is reserved before it is forwarded (so a key has at most
/// `count` requests in flight under such a rule); good logins from other clients all pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_concurrent_failed_logins_let_at_most_five_through() {
    forty_concurrent_failed_logins(app(LOGIN, Options::default(), 50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_concurrent_failed_logins_on_a_store_that_must_be_waited_for() {
    forty_concurrent_failed_logins(app_waited(LOGIN, Options::default(), 50)).await;
}

async fn forty_concurrent_failed_logins(app: App) {
    let app = Arc::new(app);
    let attempts: Vec<_> = (0..40)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let (peer, password) = if i % 2 == 0 {
                    ("198.51.100.7".to_string(), "wrong")
                } else {
                    (format!("203.0.113.{i}"), "right")
                };
                let headers = [("x-forwarded-for", peer.as_str()), ("x-password", password)];
                (i, app.status("POST", "/login", PROXY, &headers).await)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for attempt in attempts {
        outcomes.push(attempt.await.unwrap());
    }
    let attacker: Vec<StatusCode> = outcomes.iter().filter(|(i, _)| i % 2 == 0).map(|(_, s)| *s).collect();
    let failures = attacker.iter().filter(|s| **s == StatusCode::UNAUTHORIZED).count();
    assert!(failures <= 5, "{failures} failed logins reached the app: {attacker:?}");
    assert!(
        outcomes.iter().filter(|(i, _)| i % 2 == 1).all(|(_, s)| *s == StatusCode::OK),
        "good logins pass: {outcomes:?}"
    );
}

/// Before: a cost header of 0 was a peek, and a huge one failed the check, after which the
/// middleware let the request through with no rule applied.
#[tokio::test]
async fn a_bad_cost_header_is_refused_never_a_free_pass() {
    let app = app(
        "[[rules]]\nname = \"api\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\ncost_header = \"x-cost\"\n",
        Options::default(),
        0,
    );
    for cost in ["0", "4", "99999999999999999999", "x"] {
        let (status, headers, body) = app.send(request("GET", "/", "192.0.2.1", &[("x-cost", cost)])).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{cost}");
        assert_eq!(header(&headers, "content-type"), "application/problem+json");
        assert!(body.contains("x-cost must hold the request's cost, an integer from 1 to 3"), "{body}");
    }
    assert_eq!(app.hits(), 0);
    assert_eq!(app.status("GET", "/", "192.0.2.1", &[("x-cost", "3")]).await, StatusCode::OK);
    assert_eq!(app.status("GET", "/", "192.0.2.1", &[("x-cost", "1")]).await, StatusCode::TOO_MANY_REQUESTS);
}

/// Before: behind a proxy writing X-Forwarded-For, `Forwarded: for=<random>` gave a fresh key
/// per request.
#[tokio::test]
async fn a_rotating_forwarded_header_does_not_reset_the_key() {
    let app = app(
        "trusted_proxies = [\"127.0.0.1/32\"]\n[[rules]]\nname = \"ip\"\nlimit = \"2/1m\"\nkey = [\"client_ip\"]\n",
        Options::default(),
        0,
    );
    let statuses: Vec<StatusCode> = futures_for(
        5,
        |i| {
            let forwarded = format!("for=10.9.8.{i}");
            request("GET", "/", PROXY, &[("x-forwarded-for", "198.51.100.7"), ("forwarded", &forwarded)])
        },
        &app,
    )
    .await;
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

async fn futures_for(n: usize, make: impl Fn(usize) -> Request<Body>, app: &App) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(app.send(make(i)).await.0);
    }
    out
}

/// Before: paths were matched as spelled: `//login` and `/%6Cogin` escaped a rule on `/login`.
#[tokio::test]
async fn spellings_of_a_path_count_toward_its_rule() {
    let app = app(
        "[[rules]]\nname = \"login\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\nmatch = { path = \"/login\" }\n",
        Options::default(),
        0,
    );
    for path in ["/login", "//login", "/%6Cogin"] {
        assert_ne!(app.status("POST", path, "192.0.2.1", &[]).await, StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
    assert_eq!(app.status("POST", "/x/../login", "192.0.2.1", &[]).await, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        app.metrics().contains("tollgate_rule_decisions_total{rule=\"login\",outcome=\"allowed\"} 3"),
        "{}",
        app.metrics()
    );
}

/// A missing key part under `on_missing = "reject"` is a 400; under the default it skips the rule.
#[tokio::test]
async fn a_missing_key_part_follows_the_rule() {
    let app = app(
        "[[rules]]\nname = \"k\"\nlimit = \"1/1m\"\nkey = [\"header:x-api-key\"]\non_missing = \"reject\"\n",
        Options::default(),
        0,
    );
    let (status, _, body) = app.send(request("GET", "/", "192.0.2.1", &[])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("needs header x-api-key"), "{body}");
    assert_eq!(app.status("GET", "/", "192.0.2.1", &[("x-api-key", "a")]).await, StatusCode::OK);
    assert_eq!(app.status("GET", "/", "192.0.2.1", &[("x-api-key", "a")]).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(app.status("GET", "/", "192.0.2.1", &[("x-api-key", "b")]).await, StatusCode::OK);
}

#[tokio::test]
async fn rejections_carry_exact_headers_and_a_problem_body() {
    let app = app(
        "[[rules]]\nname = \"api\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n",
        Options { headers_on_allowed: true, legacy_headers: true, ..Options::default() },
        0,
    );
    // 20 s into a minute window.
    app.clock.set(T0 - T0 % (60 * SEC) + 20 * SEC);
    let (status, first, _) = app.send(request("GET", "/", "192.0.2.1", &[])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), "\"api\";q=2;w=60");
    assert_eq!(header(&first, "ratelimit"), "\"api\";r=1;t=40");
    app.send(request("GET", "/", "192.0.2.1", &[])).await;
    let (status, denied, body) = app.send(request("GET", "/", "192.0.2.1", &[])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "40", "fixed window: retry at the window's end");
    assert_eq!(header(&denied, "ratelimit"), "\"api\";r=0;t=40");
    assert_eq!(header(&denied, "ratelimit-policy"), "\"api\";q=2;w=60");
    assert_eq!(header(&denied, "cache-control"), "no-store");
    assert_eq!(header(&denied, "content-type"), "application/problem+json");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "2");
    assert_eq!(header(&denied, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&denied, "x-ratelimit-reset"), "40");
    assert!(body.contains("\"title\":\"Too Many Requests\"") && body.contains("\"status\":429"), "{body}");
    assert_eq!(app.hits(), 2, "the rejected request never reached the app");
}

#[tokio::test]
async fn shadow_ban_answers_success_without_calling_the_app() {
    let app = app(
        "[[rules]]\nname = \"s\"\nlimit = \"2/1m\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"shadow-ban\"\nbody = \"{\\\"ok\\\":true}\"\ncontent_type = \"application/json\"\n",
        Options::default(),
        0,
    );
    for _ in 0..2 {
        assert_eq!(app.send(request("GET", "/", "192.0.2.1", &[])).await.2, "home");
    }
    let (status, headers, body) = app.send(request("GET", "/", "192.0.2.1", &[])).await;
    assert_eq!(
        (status, body.as_str(), header(&headers, "content-type")),
        (StatusCode::OK, "{\"ok\":true}", "application/json")
    );
    assert_eq!(app.hits(), 2, "the app received nothing once banned");
}

#[tokio::test]
async fn dry_run_never_blocks_but_counts() {
    let app = app(
        "[[rules]]\nname = \"d\"\nlimit = \"1/1m\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"dry-run\"\n",
        Options::default(),
        0,
    );
    for _ in 0..4 {
        assert_eq!(app.status("GET", "/", "192.0.2.1", &[]).await, StatusCode::OK);
    }
    assert_eq!(app.hits(), 4);
    assert!(
        app.metrics().contains("tollgate_rule_decisions_total{rule=\"d\",outcome=\"dry_run\"} 3"),
        "{}",
        app.metrics()
    );
}

/// Delays are slots of a GCRA shaper: the k-th request of a burst waits k emission intervals
/// (tokio's paused clock: exact, and instant); beyond `max_delay`, 429.
#[tokio::test(start_paused = true)]
async fn delay_smooths_a_burst_to_one_request_per_interval() {
    let app = app(
        "[[rules]]\nname = \"shape\"\nlimit = \"10/s\"\nburst = 1\nkey = [\"global\"]\n[rules.mitigation]\naction = \"delay\"\nmax_delay = \"450ms\"\n",
        Options::default(),
        0,
    );
    let mut waits = Vec::new();
    for _ in 0..5 {
        let started = tokio::time::Instant::now();
        assert_eq!(app.status("GET", "/", "192.0.2.1", &[]).await, StatusCode::OK);
        waits.push(started.elapsed());
    }
    // The shaper's clock (the manual one) did not move: each slot is 100 ms after the last.
    assert_eq!(waits, (0..5).map(|k| Duration::from_millis(100 * k)).collect::<Vec<_>>());
    assert_eq!(
        app.status("GET", "/", "192.0.2.1", &[]).await,
        StatusCode::TOO_MANY_REQUESTS,
        "a 500 ms wait is beyond max_delay"
    );
}

/// Before: without `ConnectInfo`, every client was keyed as 0.0.0.0: one global limit.
#[tokio::test]
async fn without_a_peer_address_a_client_ip_rule_refuses_to_guess() {
    let app = app("[[rules]]\nname = \"ip\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n", Options::default(), 0);
    let bare = Request::builder().uri("/").body(Body::empty()).unwrap();
    assert_eq!(app.send(bare).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    let mut with_peer = Request::builder().uri("/").body(Body::empty()).unwrap();
    with_peer.extensions_mut().insert(PeerAddr("192.0.2.1:1".parse().unwrap()));
    assert_eq!(app.send(with_peer).await.0, StatusCode::OK);
    let global = app_global();
    assert_eq!(
        global.send(Request::builder().uri("/").body(Body::empty()).unwrap()).await.0,
        StatusCode::OK,
        "no client_ip rule: no peer needed"
    );
}

fn app_global() -> App {
    app("[[rules]]\nname = \"g\"\nlimit = \"5/1m\"\nkey = [\"global\"]\n", Options::default(), 0)
}

/// `route` passes a request over the limit on, marked with its quarantine, only when the front
/// end routes (`tollgate proxy` does); otherwise it is a 429, never served by the app: on a store
/// that decides in place and on one that must be waited for.
#[tokio::test]
async fn route_quarantines_only_where_the_front_end_routes() {
    let rules = "[[rules]]\nname = \"q\"\nlimit = \"1/1m\"\nkey = [\"global\"]\n\
                 [rules.mitigation]\naction = \"route\"\nupstream = \"http://127.0.0.1:3001\"\n";
    for waited in [false, true] {
        let build = if waited { app_waited } else { app };
        let plain = build(rules, Options::default(), 0);
        assert_eq!(plain.status("GET", "/", "192.0.2.1", &[]).await, StatusCode::OK);
        let (status, _, body) = plain.send(request("GET", "/", "192.0.2.1", &[])).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert!(body.contains("\"rate_per_s\""), "{body}");
        assert_eq!(plain.hits(), 1, "waited: {waited}");

        let routing = build(rules, Options { routes: true, ..Options::default() }, 0);
        for _ in 0..3 {
            assert_eq!(routing.status("GET", "/", "192.0.2.1", &[]).await, StatusCode::OK);
        }
        assert_eq!(routing.hits(), 3, "passed on to the app, which would forward them to the quarantine");
        assert!(routing.metrics().contains("tollgate_rule_decisions_total{rule=\"q\",outcome=\"routed\"} 2"));
    }
}
