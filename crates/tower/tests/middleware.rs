//! The middleware over real loopback HTTP (axum server, curl client): seed 003's login defence,
//! shadow-ban, dry-run, delay, exact header values, spoofed X-Forwarded-For.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tollgate_rules::Rules;
use tollgate_store::MemoryStore;
use tollgate_tower::{Options, RateLimitLayer};

/// An upstream app behind the layer; returns its address and its hit counter.
async fn serve(layer: RateLimitLayer<MemoryStore>) -> (SocketAddr, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let (h1, h2) = (hits.clone(), hits.clone());
    let app = Router::new()
        .route(
            "/login",
            post(move |headers: HeaderMap| {
                let hits = h1.clone();
                async move {
                    hits.fetch_add(1, Ordering::Relaxed);
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
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    (address, hits)
}

/// curl in a blocking task: (status, headers and body as one text).
async fn curl(address: SocketAddr, args: &[&str]) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-i", "--max-time", "10"]);
    for arg in args {
        command.arg(arg.replace("URL", &format!("http://{address}")));
    }
    let output = tokio::task::spawn_blocking(move || command.output().expect("curl")).await.unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

fn rules(text: &str) -> Rules {
    Rules::parse(text, "test").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_003_login_defence_blocks_the_ip_after_too_many_failures() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml");
    let (address, _) = serve(RateLimitLayer::new(Rules::load(&file).unwrap(), MemoryStore::new())).await;
    let attacker = "X-Forwarded-For: 198.51.100.7";
    // Successful logins do not count.
    for _ in 0..10 {
        let (status, _) = curl(address, &["-X", "POST", "URL/login", "-H", attacker, "-H", "x-password: right"]).await;
        assert_eq!(status, 200);
    }
    // Five failures are within the limit, the sixth goes over.
    for attempt in 1..=6 {
        let (status, _) = curl(address, &["-X", "POST", "URL/login", "-H", attacker]).await;
        assert_eq!(status, 401, "failure {attempt} reaches the app");
    }
    // Now every request from that IP is refused for the timeout, whatever it claims on the left.
    for args in [
        vec!["URL/", "-H", attacker],
        vec!["URL/", "-H", "X-Forwarded-For: 1.2.3.4, 198.51.100.7"],
        vec!["-X", "POST", "URL/login", "-H", attacker, "-H", "x-password: right"],
    ] {
        let (status, text) = curl(address, &args).await;
        assert_eq!(status, 429, "{args:?}: {text}");
        let retry: u64 = header(&text, "retry-after").parse().unwrap();
        assert!((59..=60).contains(&retry), "Retry-After {retry}");
    }
    // Another client is unaffected.
    let (status, _) = curl(address, &["URL/", "-H", "X-Forwarded-For: 198.51.100.8"]).await;
    assert_eq!(status, 200);
}

fn header(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| {
            l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_carry_exact_headers_and_a_problem_body() {
    let layer = RateLimitLayer::with_options(
        rules("[[rules]]\nname = \"api\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n"),
        MemoryStore::new(),
        Options { headers_on_allowed: true, legacy_headers: true },
    );
    let (address, hits) = serve(layer).await;
    let (status, first) = curl(address, &["URL/"]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&first, "ratelimit-policy"), "\"api\";q=2;w=60");
    assert!(header(&first, "ratelimit").starts_with("\"api\";r=1;t="), "{first}");
    curl(address, &["URL/"]).await;
    let (status, denied) = curl(address, &["URL/"]).await;
    assert_eq!(status, 429);
    let reset: u64 = header(&denied, "x-ratelimit-reset").parse().unwrap();
    assert!((1..=60).contains(&reset));
    assert_eq!(header(&denied, "retry-after"), reset.to_string(), "fixed window: retry at the window's end");
    assert_eq!(header(&denied, "ratelimit"), format!("\"api\";r=0;t={reset}"));
    assert_eq!(header(&denied, "ratelimit-policy"), "\"api\";q=2;w=60");
    assert_eq!(header(&denied, "cache-control"), "no-store");
    assert_eq!(header(&denied, "content-type"), "application/problem+json");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "2");
    assert_eq!(header(&denied, "x-ratelimit-remaining"), "0");
    assert!(denied.contains("\"title\":\"Too Many Requests\"") && denied.contains("\"status\":429"), "{denied}");
    assert_eq!(hits.load(Ordering::Relaxed), 2, "the rejected request never reached the app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_ban_answers_success_without_calling_the_app() {
    let layer = RateLimitLayer::new(
        rules(
            "[[rules]]\nname = \"s\"\nlimit = \"2/1m\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"shadow-ban\"\nbody = \"{\\\"ok\\\":true}\"\ncontent_type = \"application/json\"\n",
        ),
        MemoryStore::new(),
    );
    let (address, hits) = serve(layer).await;
    for _ in 0..2 {
        assert!(curl(address, &["URL/"]).await.1.ends_with("home"));
    }
    let (status, text) = curl(address, &["URL/"]).await;
    assert_eq!(status, 200);
    assert!(text.ends_with("{\"ok\":true}") && header(&text, "content-type") == "application/json", "{text}");
    assert_eq!(hits.load(Ordering::Relaxed), 2, "the app received nothing once banned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_never_blocks_but_counts() {
    let layer = RateLimitLayer::new(
        rules(
            "[[rules]]\nname = \"d\"\nlimit = \"1/1m\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"dry-run\"\n",
        ),
        MemoryStore::new(),
    );
    let (address, hits) = serve(layer.clone()).await;
    for _ in 0..4 {
        assert_eq!(curl(address, &["URL/"]).await.0, 200);
    }
    assert_eq!(hits.load(Ordering::Relaxed), 4);
    assert_eq!(layer.dry_run_hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_smooths_a_burst_to_one_request_per_interval() {
    let layer = RateLimitLayer::new(
        rules(
            "[[rules]]\nname = \"shape\"\nlimit = \"10/s\"\nburst = 1\nkey = [\"global\"]\n[rules.mitigation]\naction = \"delay\"\nmax_delay = \"450ms\"\n",
        ),
        MemoryStore::new(),
    );
    let (address, _) = serve(layer).await;
    let started = Instant::now();
    let burst: Vec<_> =
        (0..5).map(|_| tokio::spawn(async move { (curl(address, &["URL/"]).await.0, started.elapsed()) })).collect();
    let mut done = Vec::new();
    for request in burst {
        done.push(request.await.unwrap());
    }
    assert!(done.iter().all(|(status, _)| *status == 200), "{done:?}");
    let mut times: Vec<Duration> = done.iter().map(|(_, t)| *t).collect();
    times.sort();
    // Slots are 100 ms apart: the k-th request cannot finish before k*100 ms (a lower bound only).
    for (k, t) in times.iter().enumerate() {
        assert!(*t >= Duration::from_millis(100 * k as u64), "request {k} done at {t:?}");
    }
    // Beyond max_delay: 20 more at once, the queue (4.5 slots of wait) is full for some of them.
    let over: Vec<_> = (0..20).map(|_| tokio::spawn(async move { curl(address, &["URL/"]).await.0 })).collect();
    let mut statuses = Vec::new();
    for request in over {
        statuses.push(request.await.unwrap());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_counted_after_the_response_mitigates_while_over_even_without_timeout() {
    let layer = RateLimitLayer::new(
        rules(
            "[[rules]]\nname = \"f\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\ncount_status = [401]\nmatch = { path = \"/login\" }\n",
        ),
        MemoryStore::new(),
    );
    let (address, hits) = serve(layer).await;
    for _ in 0..3 {
        assert_eq!(curl(address, &["-X", "POST", "URL/login"]).await.0, 401);
    }
    let (status, text) = curl(address, &["-X", "POST", "URL/login"]).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(hits.load(Ordering::Relaxed), 3);
    // The mitigation match defaults to the counting match: other paths pass.
    assert_eq!(curl(address, &["URL/"]).await.0, 200);
}
