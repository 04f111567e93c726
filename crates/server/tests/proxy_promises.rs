//! `tollgate proxy` keeps what its rules promise, in front of a slow upstream, driven by curl:
//! `examples/rules/login.toml` locks out nobody for successful logins in flight at once, nor for
//! correct logins whose clients left, and counts the failed ones all the same; a `delay` never outlasts the request timeout (no 408 for a slot
//! spent); and a rule whose algorithm changes on a reload keeps its counts, on Redis too.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use common::proxy::{Proxy, curl};
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::proxy::ProxyConfig;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

/// An upstream whose `POST /login` answers after a second (200 for `x-password: right`, else
/// 401), and whose other paths answer at once.
async fn slow_upstream() -> SocketAddr {
    let app = Router::new()
        .route(
            "/login",
            post(|headers: HeaderMap| async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if headers.get("x-password").is_some_and(|p| p == "right") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .fallback(get(|| async { "ok" }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn start(config: Config, upstream: SocketAddr, rules: Rules, file: Option<&Path>) -> Proxy {
    let proxy = ProxyConfig {
        upstream: format!("http://{upstream}"),
        rules,
        rules_file: file.map(Path::to_path_buf),
        options: Default::default(),
        upstream_timeout: Duration::from_secs(30),
        tls: None,
        limits: Default::default(),
    };
    Proxy::start(config, proxy).await
}

fn login_rules() -> Rules {
    Rules::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml")).unwrap()
}

/// curl arguments of a correct login from `office` (through the proxy, which `login.toml` trusts
/// for `X-Forwarded-For`).
fn good_login(proxy: &Proxy, office: &str) -> Vec<String> {
    let headers = ["-X", "POST", "-H", "x-password: right", "-H"];
    let mut args: Vec<String> = headers.iter().map(|s| (*s).to_string()).collect();
    args.extend([format!("X-Forwarded-For: {office}"), proxy.url("/login")]);
    args
}

/// Runs every curl at once; their statuses, in the order given.
async fn at_once(requests: Vec<Vec<String>>) -> Vec<u16> {
    let tasks: Vec<_> = requests.into_iter().map(|args| tokio::spawn(curl(args))).collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap().0);
    }
    statuses
}

/// Before: six correct logins at once from one office (the upstream answering in a second) got
/// five 200s and a 429, and that 429 locked the office out for 60 s (`GET /` → 429). Now nobody is
/// locked out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_good_logins_at_once_from_one_office_lock_nobody_out() {
    let proxy = start(common::manual_config(), slow_upstream().await, login_rules(), None).await;
    let office = "198.51.100.7";
    let mut statuses = at_once((0..6).map(|_| good_login(&proxy, office)).collect()).await;
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let home = curl(vec!["-H".into(), format!("X-Forwarded-For: {office}"), proxy.url("/")]).await;
    assert_eq!(home.0, 200, "{}", home.1);
    assert_eq!(curl(good_login(&proxy, office)).await.0, 200);
    proxy.stop().await;
}

/// Before: five correct logins whose clients gave up after half a second (the upstream answering
/// in one) stayed counted: the next correct login was a 429 and locked the address out
/// (`Retry-After: 60`). Now a request the client left is settled with the upstream's status:
/// 200, not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_whose_clients_gave_up_are_not_counted() {
    let proxy = start(common::manual_config(), slow_upstream().await, login_rules(), None).await;
    let office = "198.51.100.8";
    for _ in 0..5 {
        let args = [vec!["--max-time".to_string(), "0.5".into()], good_login(&proxy, office)].concat();
        assert_eq!(curl(args).await.0, 0, "the client gave up");
    }
    // Each settlement follows its disconnection (hyper then drops the request): eventually.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = curl(good_login(&proxy, office)).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tollgate_rule_decisions_total{rule=\"login-failures\",outcome=\"refunded\"} 6"),
        "{metrics}"
    );
    proxy.stop().await;
}

/// Before: an attacker who hung up a third of a second after each wrong guess (the upstream
/// checking it for a second, then answering 401) was never counted: every guess reached the
/// upstream, and after five the sixth was still forwarded (`counted` absent, `refunded` 5). Now
/// the upstream's 401 is counted though nobody waited for it: the sixth guess is a 429, and the
/// address is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_guesses_whose_clients_hung_up_still_lock_the_attacker_out() {
    let proxy = start(common::manual_config(), slow_upstream().await, login_rules(), None).await;
    let attacker = "203.0.113.66";
    let guess = |max_time: &[&str]| {
        let mut args: Vec<String> = max_time.iter().map(|s| (*s).to_string()).collect();
        args.extend(["-X", "POST", "-H", "x-password: guess", "-H"].map(String::from));
        args.extend([format!("X-Forwarded-For: {attacker}"), proxy.url("/login")]);
        args
    };
    for _ in 0..5 {
        assert_eq!(curl(guess(&["--max-time", "0.3"])).await.0, 0, "the client hung up");
    }
    // The upstream answers each a second after it was sent: eventually.
    let counted = "tollgate_rule_decisions_total{rule=\"login-failures\",outcome=\"counted\"} 5";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = proxy.metrics().await;
        if metrics.contains(counted) {
            break;
        }
        assert!(Instant::now() < deadline, "never counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(curl(guess(&[])).await.0, 429, "the sixth guess");
    let home = curl(vec!["-H".into(), format!("X-Forwarded-For: {attacker}"), proxy.url("/")]).await;
    assert_eq!(home.0, 429, "the address is held: {}", home.1);
    proxy.stop().await;
}

/// Before: with `--http-request-timeout 2s`, a `delay` rule of 10 per 10 s (slots a second apart,
/// `max_delay` 10 s by default) answered 20 requests at once with 11 200s and nine 408s after
/// 2 s, each 408 spending a slot nobody used. Now a delay that would not end within the request
/// timeout is a 429 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_never_outlasts_the_request_timeout() {
    let mut config = common::manual_config();
    config.http.request_timeout = Duration::from_secs(2);
    let rules = Rules::parse(
        "[[rules]]\nname = \"shape\"\nlimit = \"10/10s\"\nkey = [\"global\"]\n[rules.mitigation]\naction = \"delay\"\n",
        "t",
    )
    .unwrap();
    let proxy = start(config, slow_upstream().await, rules, None).await;
    let started = Instant::now();
    let mut statuses = at_once((0..20).map(|_| vec![proxy.url("/")]).collect()).await;
    statuses.sort_unstable();
    let mut wanted = vec![200; 11];
    wanted.extend([429; 9]);
    assert_eq!(statuses, wanted, "after {:?}", started.elapsed());
    proxy.stop().await;
}

/// Before: a rule's state was found by its algorithm too, so changing `algorithm` in the rules
/// file reset every count (3 per hour, 2 spent, reloaded as a fixed window: 3 more). Now the
/// counts are carried into the new algorithm, on Redis as on the memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_algorithm_keeps_the_counts_on_redis() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("tollgate-carry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    let rule = |algorithm: &str| {
        format!("[[rules]]\nname = \"lock\"\nlimit = \"3/1h\"\nalgorithm = \"{algorithm}\"\nkey = [\"client_ip\"]\n")
    };
    std::fs::write(&file, rule("gcra")).unwrap();
    let config = Config { store: StoreConfig::redis(&redis.url()), ..common::manual_config() };
    let proxy = start(config, slow_upstream().await, Rules::load(&file).unwrap(), Some(&file)).await;
    let home = || curl(vec![proxy.url("/")]);
    assert_eq!((home().await.0, home().await.0), (200, 200));
    std::fs::write(&file, rule("fixed-window")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !proxy.metrics().await.contains("tollgate_config_reloads_total{result=\"ok\"} 1") {
        assert!(Instant::now() < deadline, "the new file was never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(home().await.0, 200, "one left of three");
    let (status, text) = home().await;
    assert_eq!(status, 429, "{text}");
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
