//! What the shipped examples promise, at the middleware, with a slow app and clients that leave
//! (tokio's paused clock: every wait is virtual and exact; the engine and the store share a manual
//! clock standing still unless a test moves it):
//!
//! - `examples/rules/login.toml` counts failed logins only: successful logins in flight at once
//!   from one address (an office behind a NAT) never lock that address out, a login whose client
//!   left counts as its handler answers (a correct one is not counted, a failed one is), and one
//!   whose handler panicked is not counted;
//! - a `delay` that cannot end inside the request's time is a 429 at once, charging nothing, and
//!   the requests waiting for their slot are bounded across keys;
//! - a client's `cost_header` can raise its cost, never lower it below the rule's `cost`.

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
use tollgate_engine::{Engine, EngineBuilder};
use tollgate_rules::Rules;
use tollgate_store::{Check, MemoryStore, Refund, Reserved, Store, StoreError};
use tollgate_tower::{Options, RateLimitLayer};
use tower_service::Service;

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;
const LOGIN: &str = include_str!("../../../examples/rules/login.toml");
/// The trusted proxy of `login.toml`, in front of every client of these tests.
const PROXY: &str = "127.0.0.1";
/// An office's address, many people behind it.
const OFFICE: &str = "198.51.100.7";

/// A store that must be waited for, as Redis is: each call yields once first.
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

/// An app behind the layer: `POST /login` answers after `slow` (401 unless `x-password: right`),
/// `POST /boom` panics, every other path answers "ok" at once; with its hit counter, how many
/// logins it answered, and metrics.
struct App {
    router: Router,
    hits: Arc<AtomicU64>,
    logins_answered: Arc<AtomicU64>,
    registry: Arc<Registry>,
}

fn app(rules: &str, options: Options, slow: Duration, waited: bool) -> App {
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    if waited {
        app_on(Waited(memory), clock, rules, options, slow)
    } else {
        app_on(memory, clock, rules, options, slow)
    }
}

fn app_on<S: Store + 'static>(store: S, clock: Arc<ManualClock>, rules: &str, options: Options, slow: Duration) -> App {
    app_with(store, clock, rules, options, slow, |builder| builder)
}

/// [`app_on`], the engine built as `build` says.
fn app_with<S: Store + 'static>(
    store: S,
    clock: Arc<ManualClock>,
    rules: &str,
    options: Options,
    slow: Duration,
    build: impl FnOnce(EngineBuilder<S>) -> EngineBuilder<S>,
) -> App {
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap();
    let engine = Arc::new(build(Engine::builder(store, rules).clock(clock)).build(&mut registry));
    let hits = Arc::new(AtomicU64::new(0));
    let (h1, h2, h3) = (hits.clone(), hits.clone(), hits.clone());
    let logins_answered = Arc::new(AtomicU64::new(0));
    let answered = logins_answered.clone();
    let router = Router::new()
        .route(
            "/login",
            post(move |headers: HeaderMap| {
                h1.fetch_add(1, Ordering::Relaxed);
                let answered = answered.clone();
                async move {
                    tokio::time::sleep(slow).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                    let right = headers.get("x-password").is_some_and(|p| p == "right");
                    if right { (StatusCode::OK, "welcome") } else { (StatusCode::UNAUTHORIZED, "no") }
                }
            }),
        )
        .route(
            "/boom",
            post(move || {
                h2.fetch_add(1, Ordering::Relaxed);
                async move {
                    tokio::task::yield_now().await;
                    panic!("the handler failed");
                    #[allow(unreachable_code)]
                    "never"
                }
            }),
        )
        .fallback(get(move || {
            h3.fetch_add(1, Ordering::Relaxed);
            async { "ok" }
        }))
        .layer(RateLimitLayer::from_engine(engine, options));
    App { router, hits, logins_answered, registry: Arc::new(registry) }
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

/// A correct login from the office, through the proxy.
fn good_login() -> Request<Body> {
    request("POST", "/login", PROXY, &[("x-forwarded-for", OFFICE), ("x-password", "right")])
}

impl App {
    /// The status and `Retry-After` (if any) of `request`.
    async fn send(&self, request: Request<Body>) -> (StatusCode, Option<String>) {
        let mut router = self.router.clone();
        std::future::poll_fn(|cx| <Router as Service<Request<Body>>>::poll_ready(&mut router, cx)).await.unwrap();
        let response = router.call(request).await.unwrap();
        let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        (response.status(), retry)
    }

    /// `tollgate_rule_decisions_total{rule, outcome}`, 0 while absent.
    fn counted(&self, rule: &str, outcome: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let series = format!("tollgate_rule_decisions_total{{rule=\"{rule}\",outcome=\"{outcome}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&series)).map_or(0, |v| v.trim().parse().unwrap())
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

/// Sends every request at once (each on its own task), answers in the order sent.
async fn at_once(app: &Arc<App>, requests: Vec<Request<Body>>) -> Vec<(StatusCode, Option<String>)> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let app = app.clone();
            tokio::spawn(async move { app.send(request).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Before: the sixth login, refused only because five others were still in flight, went "over"
/// and locked the office out for 60 s (`GET /` → 429, `Retry-After: 59`). Now it is a 429 of its
/// own (retry in a second), nothing is held, and once the five are answered (200: refunded) the
/// office logs in again.
#[tokio::test(start_paused = true)]
async fn six_good_logins_at_once_from_one_address_lock_nobody_out() {
    for waited in [false, true] {
        let app = Arc::new(app(LOGIN, Options::default(), Duration::from_secs(1), waited));
        let answers = at_once(&app, (0..6).map(|_| good_login()).collect()).await;
        let mut statuses: Vec<u16> = answers.iter().map(|(s, _)| s.as_u16()).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "waited: {waited}");
        let home = app.send(request("GET", "/", PROXY, &[("x-forwarded-for", OFFICE)])).await;
        assert_eq!(home, (StatusCode::OK, None), "waited: {waited}: nobody was locked out");
        let refused = answers.iter().find(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS).unwrap();
        assert_eq!(refused.1.as_deref(), Some("1"), "waited: {waited}: retry once those in flight are answered");
        assert_eq!(app.send(good_login()).await.0, StatusCode::OK, "waited: {waited}");
        let outcomes = ["allowed", "refunded", "rejected", "counted"].map(|o| app.counted("login-failures", o));
        assert_eq!(outcomes, [6, 6, 1, 0], "waited: {waited}: allowed, refunded, rejected, counted");
    }
}

/// Before: a login whose client left before the answer (or that the server timed out) was never
/// settled: five such correct logins held every reservation, and the next correct login was
/// refused and locked the address out for 60 s. Now a request dropped before its response is
/// settled with the status its handler goes on to answer: 200, refunded.
#[tokio::test(start_paused = true)]
async fn logins_whose_clients_left_are_not_counted() {
    for waited in [false, true] {
        let app = Arc::new(app(LOGIN, Options::default(), Duration::from_secs(1), waited));
        for _ in 0..5 {
            let left = tokio::time::timeout(Duration::from_millis(500), app.send(good_login())).await;
            assert!(left.is_err(), "the client leaves before the answer");
        }
        // A remote store's refund runs on a task of its own.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(app.send(good_login()).await, (StatusCode::OK, None), "waited: {waited}");
        let home = app.send(request("GET", "/", PROXY, &[("x-forwarded-for", OFFICE)])).await;
        assert_eq!(home.0, StatusCode::OK, "waited: {waited}");
        assert_eq!(app.counted("login-failures", "refunded"), 6, "waited: {waited}");
        assert_eq!(app.counted("login-failures", "rejected"), 0, "waited: {waited}");
    }
}

/// Before: a failed login whose client hung up before the answer was refunded, though the handler
/// went on to check the password and answer 401: an attacker who hangs up after each guess (or
/// gives up just after the fast answer of a right password) was never locked out (6 guesses
/// reached the handler, the address was not held, `counted` stayed 0). Now the handler's call goes
/// on when its client leaves, and the request is settled with the status it answers: 401 counts.
#[tokio::test(start_paused = true)]
async fn failed_logins_whose_clients_hung_up_still_count() {
    const ATTACKER: &str = "203.0.113.5";
    let guess = || request("POST", "/login", ATTACKER, &[("x-password", "guess")]);
    for waited in [false, true] {
        let app = Arc::new(app(LOGIN, Options::default(), Duration::from_secs(1), waited));
        for _ in 0..5 {
            let hung_up = tokio::time::timeout(Duration::from_millis(100), app.send(guess())).await;
            assert!(hung_up.is_err(), "the client hangs up before the answer");
        }
        // The handler answers the five meanwhile.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(app.counted("login-failures", "counted"), 5, "waited: {waited}");
        assert_eq!(app.send(guess()).await.0, StatusCode::TOO_MANY_REQUESTS, "waited: {waited}");
        let home = app.send(request("GET", "/", ATTACKER, &[])).await;
        assert_eq!(home.0, StatusCode::TOO_MANY_REQUESTS, "waited: {waited}: the address is held");
        assert_eq!(app.hits(), 5, "waited: {waited}: the sixth guess never reached the handler");
    }
}

/// A request no `count_status` rule reserved for has nothing to settle: its handler is dropped
/// with its client, as without the layer (only a counted request's call goes on to its status).
#[tokio::test(start_paused = true)]
async fn a_request_with_nothing_to_settle_ends_with_its_client() {
    let rules = "[[rules]]\nname = \"plain\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\n";
    for waited in [false, true] {
        let app = Arc::new(app(rules, Options::default(), Duration::from_secs(1), waited));
        let login = request("POST", "/login", "192.0.2.1", &[]);
        assert!(tokio::time::timeout(Duration::from_millis(100), app.send(login)).await.is_err());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(app.hits(), 1, "waited: {waited}");
        assert_eq!(app.logins_answered.load(Ordering::Relaxed), 0, "waited: {waited}: the handler was dropped");
    }
}

/// Before: a handler that panicked left its reservation counted (a rule of one request per
/// minute then refused the next). Now the reservation is settled while the panic unwinds.
#[tokio::test(start_paused = true)]
async fn a_panicking_handler_leaves_nothing_counted() {
    let rules = "[[rules]]\nname = \"boom\"\nlimit = \"1/1m\"\nkey = [\"client_ip\"]\ncount_status = [500]\n\
                 match = { path = \"/boom\" }\n";
    for waited in [false, true] {
        let app = Arc::new(app(rules, Options::default(), Duration::ZERO, waited));
        for attempt in 1..=2 {
            let app = app.clone();
            let crashed = tokio::spawn(async move { app.send(request("POST", "/boom", "192.0.2.1", &[])).await }).await;
            assert!(crashed.unwrap_err().is_panic(), "waited: {waited}: attempt {attempt}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(app.hits(), 2, "waited: {waited}: the second attempt reached the handler too");
        assert_eq!(app.counted("boom", "refunded"), 2, "waited: {waited}");
    }
}

/// Before: the default `max_delay` (burst × T: 60 s for 10/1m) ignored the server's request
/// timeout: of 20 requests at once, 10 passed, one waited its 6 s slot, and nine waited 12 to
/// 60 s for slots the server's 408 (at 10 s) threw away, spending them. Now a delay that would
/// not end within the request's time is a 429 at once, and charges nothing.
#[tokio::test(start_paused = true)]
async fn a_delay_past_the_request_timeout_is_a_429_at_once() {
    let rules = "[[rules]]\nname = \"shape\"\nlimit = \"10/1m\"\nkey = [\"global\"]\n\
                 [rules.mitigation]\naction = \"delay\"\n";
    let options = Options { request_timeout: Some(Duration::from_secs(10)), ..Options::default() };
    let app = Arc::new(app(rules, options, Duration::ZERO, false));
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                // The server's request timeout, as `tollgate proxy` applies it.
                let answer =
                    tokio::time::timeout(Duration::from_secs(10), app.send(request("GET", "/", "192.0.2.1", &[])));
                let status = answer.await.map_or(StatusCode::REQUEST_TIMEOUT, |(status, _)| status);
                (status.as_u16(), started.elapsed().as_secs())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers.sort_unstable();
    let mut wanted = vec![(200, 0); 10];
    wanted.push((200, 6));
    wanted.extend([(429, 0); 9]);
    wanted.sort_unstable();
    assert_eq!(answers, wanted, "(status, seconds waited)");
    // Nothing was charged for the refusals: the next slot is still 12 s after the burst, past
    // the timeout, and refused at once (the shaper's clock has not moved).
    assert_eq!(app.send(request("GET", "/", "192.0.2.1", &[])).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(app.counted("shape", "delayed"), 1);
    assert_eq!(app.counted("shape", "rejected"), 10);
}

/// Requests waiting for their slot are bounded across keys, not only per key (`max_delay` per
/// key): beyond the engine's `max_delayed` a request that would wait is a 429 at once, charging
/// nothing, so its client's next slot is not pushed back.
#[tokio::test(start_paused = true)]
async fn waiting_requests_are_bounded_across_keys() {
    let rules = "[[rules]]\nname = \"shape\"\nlimit = \"60/1m\"\nburst = 1\nkey = [\"client_ip\"]\n\
                 [rules.mitigation]\naction = \"delay\"\nmax_delay = \"10s\"\n";
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let app = Arc::new(app_with(store, clock, rules, Options::default(), Duration::ZERO, |b| b.max_delayed(2)));
    let clients: Vec<String> = (1..=5).map(|i| format!("192.0.2.{i}")).collect();
    // Each client's first request passes at once; their second ones would each wait a second.
    let first = at_once(&app, clients.iter().map(|c| request("GET", "/", c, &[])).collect()).await;
    assert!(first.iter().all(|(s, _)| *s == StatusCode::OK), "{first:?}");
    let started = tokio::time::Instant::now();
    let second = at_once(&app, clients.iter().map(|c| request("GET", "/", c, &[])).collect()).await;
    let mut statuses: Vec<u16> = second.iter().map(|(s, _)| s.as_u16()).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429, 429, 429], "two wait, the others are refused");
    assert_eq!(started.elapsed(), Duration::from_secs(1), "the two waited their slot");
    assert_eq!(app.counted("shape", "delayed"), 2);
}

/// Before: `x-cost: 1` from any client cost 1 where the rule says 5. Now a client's header can
/// only raise the cost; a trusted proxy's is taken as it is.
#[tokio::test]
async fn a_clients_cost_header_never_lowers_the_rules_cost() {
    let rules = "trusted_proxies = [\"127.0.0.1/32\"]\n[[rules]]\nname = \"api\"\nlimit = \"10/1m\"\n\
                 key = [\"client_ip\"]\ncost = 5\ncost_header = \"x-cost\"\n";
    let app = app(rules, Options::default(), Duration::ZERO, false);
    let direct = |cost: &str| request("GET", "/", "192.0.2.1", &[("x-cost", cost)]);
    assert_eq!(app.send(direct("1")).await.0, StatusCode::OK);
    assert_eq!(app.send(direct("1")).await.0, StatusCode::OK);
    assert_eq!(app.send(direct("1")).await.0, StatusCode::TOO_MANY_REQUESTS, "each cost 5, not 1");
    // A higher cost is taken as it is.
    let other = |cost: &str| request("GET", "/", "192.0.2.2", &[("x-cost", cost)]);
    assert_eq!(app.send(other("8")).await.0, StatusCode::OK);
    assert_eq!(app.send(other("5")).await.0, StatusCode::TOO_MANY_REQUESTS, "8 + 5 > 10");
    // Through the trusted proxy, the header says what the proxy computed.
    let proxied = |cost: &str| request("GET", "/", PROXY, &[("x-forwarded-for", "203.0.113.9"), ("x-cost", cost)]);
    for _ in 0..10 {
        assert_eq!(app.send(proxied("1")).await.0, StatusCode::OK);
    }
    assert_eq!(app.send(proxied("1")).await.0, StatusCode::TOO_MANY_REQUESTS);
}
