//! What sharing holds through the store costs a request, and how soon another node sees a hold
//! (the figures of `docs/rules.md`, "A fleet holds as one node does"):
//!
//! - **Redis** (a `redis-server` of its own, on its own time, one task, one call at a time, a GCRA
//!   limit that admits, a fresh key per call): each call's round trip as this process sees it and
//!   the time Redis spends in it (`usec_per_call` of `INFO commandstats`), for a decision that
//!   does not ask for its key's hold, one that asks (none there: the usual case), one a hold
//!   denies, a peek at a hold (`Store::held`, a request a rule only mitigates) and a hold's write
//!   (`Store::hold`, once per hold and node).
//! - **Propagation**: two nodes (two stores, each its own connection) on that Redis: node A
//!   writes a hold, then node B's next decision asking for it must be denied by it, for every one
//!   of the keys. Until A's write returns (its round trip, above) B decides by the limit alone.
//! - **The engine on the memory store**: ns per request of `GET /` from 65,536 client addresses
//!   under `examples/rules/login.toml` (every request peeks at its IP's hold), with no hold and
//!   with 10,000 other addresses held, next to the same rule mitigating only the logins it counts
//!   (`mitigation.match` left out: no peek, as every request was before holds were shared).
//!
//! Rounds run back to back; each figure is given as the range over the rounds.
//! `cargo bench -p tollgate-engine --bench holds` (starts its own redis-server).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use prometheus_client::registry::Registry;
use tollgate_engine::{Admission, Engine, Request};
use tollgate_rules::Rules;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Check, Limit, MemoryStore, RedisOptions, RedisStore, Store};

const ROUNDS: usize = 3;
const CALLS: usize = 20_000;
const REQUESTS: usize = 2_000_000;
const HOLD: u64 = 60_000_000_000;

/// The smallest and the largest of `values`, as "a–b".
fn range(values: &[f64], digits: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    format!("{min:.digits$}–{max:.digits$}")
}

/// Microseconds Redis spent per script call (`FCALL`, `EVALSHA`) since the last `CONFIG RESETSTAT`.
fn inside_redis(server: &RedisServer) -> f64 {
    let stats = server.cli(&["info", "commandstats"]);
    let field = |line: &str, name: &str| -> f64 {
        line.split(&format!("{name}="))
            .nth(1)
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let (calls, usec) = stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .fold((0.0, 0.0), |(c, u), l| (c + field(l, "calls"), u + field(l, "usec")));
    usec / calls.max(1.0)
}

/// The Redis calls measured.
#[derive(Clone, Copy, PartialEq)]
enum Call {
    Decision,
    Asking,
    Held,
    Peek,
    Hold,
}

impl Call {
    const ALL: [Call; 5] = [Call::Decision, Call::Asking, Call::Held, Call::Peek, Call::Hold];

    fn name(self) -> &'static str {
        match self {
            Call::Decision => "decision, not asking for its hold",
            Call::Asking => "decision asking (no hold there)",
            Call::Held => "decision a hold denies",
            Call::Peek => "peek at a hold (Store::held)",
            Call::Hold => "hold's write (Store::hold)",
        }
    }
}

/// `CALLS` calls of `call` on fresh keys: the mean round trip (µs) and the time inside Redis (µs).
async fn measure(server: &RedisServer, store: &RedisStore, call: Call, round: usize) -> (f64, f64) {
    let limit = Limit::per_second(100).build().expect("limit");
    let keys: Vec<String> = (0..CALLS).map(|i| format!("{}:{round}:{i}", call as u8)).collect();
    if call == Call::Held {
        for key in &keys {
            store.hold("login", key.as_bytes(), HOLD).await.expect("hold");
        }
    }
    let _ = server.cli(&["config", "resetstat"]);
    let started = Instant::now();
    for key in &keys {
        let check = Check::new(key.as_bytes(), &limit, 1).scoped("login");
        match call {
            Call::Decision => assert!(store.reserve(&[check]).await.expect("reserve").decisions[0].allowed),
            Call::Asking => assert!(store.reserve(&[check.with_hold()]).await.expect("reserve").decisions[0].allowed),
            Call::Held => assert!(store.reserve(&[check.with_hold()]).await.expect("reserve").is_held(0)),
            Call::Peek => assert_eq!(store.held(&[check]).await.expect("held"), [None]),
            Call::Hold => store.hold("login", key.as_bytes(), HOLD).await.expect("hold"),
        }
    }
    let round_trip = started.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    (round_trip, inside_redis(server))
}

/// Node A writes a hold on each of `CALLS` keys, node B decides each at once after: how many B
/// saw held.
async fn propagation(a: &RedisStore, b: &RedisStore) -> usize {
    let limit = Limit::per_second(100).build().expect("limit");
    let mut seen = 0;
    for i in 0..CALLS {
        let key = format!("propagation:{i}");
        a.hold("login", key.as_bytes(), HOLD).await.expect("hold");
        let check = Check::new(key.as_bytes(), &limit, 1).scoped("login").with_hold();
        seen += usize::from(b.reserve(&[check]).await.expect("reserve").is_held(0));
    }
    seen
}

async fn redis() {
    let server = RedisServer::start();
    let open = || RedisStore::open(&server.url(), RedisOptions::default()).expect("store");
    let store = open();
    // The script loaded before anything is timed.
    let warm = Limit::per_second(100).build().expect("limit");
    store.reserve(&[Check::new(b"warm", &warm, 1).with_hold()]).await.expect("reserve");
    store.hold("", b"warm", 1).await.expect("hold");
    let mut figures: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); Call::ALL.len()];
    for round in 0..ROUNDS {
        for (i, call) in Call::ALL.into_iter().enumerate() {
            let (round_trip, inside) = measure(&server, &store, call, round).await;
            figures[i].0.push(round_trip);
            figures[i].1.push(inside);
        }
    }
    println!("Redis: {CALLS} calls per round, {ROUNDS} rounds, one task, loopback, GCRA");
    println!("{:<36}{:>20}{:>20}", "call", "round trip (µs)", "inside Redis (µs)");
    for (call, (round_trip, inside)) in Call::ALL.into_iter().zip(&figures) {
        println!("{:<36}{:>20}{:>20}", call.name(), range(round_trip, 1), range(inside, 2));
    }
    let (a, b) = (open(), open());
    let seen = propagation(&a, &b).await;
    println!("propagation: node B's first decision after node A's write saw the hold for {seen} of {CALLS} keys");
    assert_eq!(seen, CALLS, "a hold node B did not see at once");
}

/// `GET /` from 65,536 addresses, `REQUESTS` of them on `engine`: ns per request.
fn requests(engine: &Engine<MemoryStore>) -> f64 {
    let policy = engine.policy();
    let started = Instant::now();
    for i in 0..REQUESTS {
        let [c, d] = u16::try_from(i % 65_536).expect("fits").to_be_bytes();
        let request = Request {
            method: "GET",
            path: "/",
            query: "",
            host: "example.com",
            headers: &[],
            client_ip: IpAddr::V4(Ipv4Addr::new(10, 1, c, d)),
            key: None,
            ja3: None,
            ja4: None,
            from_trusted_proxy: false,
        };
        let admission = engine.admit_now(&policy, &request, None).expect("the memory store decides in place");
        assert!(matches!(admission, Admission::Proceed(_)));
    }
    started.elapsed().as_secs_f64() * 1e9 / REQUESTS as f64
}

fn memory() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml");
    let login = std::fs::read_to_string(path).expect("examples/rules/login.toml");
    let narrow: String = login.lines().filter(|l| !l.starts_with("match = {}")).collect::<Vec<_>>().join("\n");
    assert_ne!(narrow, login, "login.toml mitigates every request of the IP");
    let engine = |rules: &str| {
        let rules = Rules::parse(rules, "login.toml").expect("rules");
        Engine::builder(MemoryStore::new(), rules).build(&mut Registry::default())
    };
    let (peeking, held, not_peeking) = (engine(&login), engine(&login), engine(&narrow));
    let store = held.store();
    for i in 0..10_000u32 {
        let ip = Ipv4Addr::from(0xC633_6400 + i).to_string();
        ready(store.hold("login-failures", ip.as_bytes(), 3_600 * 1_000_000_000)).expect("hold");
    }
    let mut figures = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, engine) in [&not_peeking, &peeking, &held].into_iter().enumerate() {
            figures[i].push(requests(engine));
        }
    }
    println!();
    println!("The engine on the memory store: GET / from 65,536 addresses, {REQUESTS} per round, {ROUNDS} rounds");
    for (name, ns) in [
        "login.toml without `mitigation.match = {}` (no peek)",
        "login.toml (a peek per request), no hold",
        "login.toml, 10,000 other addresses held",
    ]
    .into_iter()
    .zip(&figures)
    {
        println!("{name:<56}{:>12} ns", range(ns, 0));
    }
}

/// A memory store's future, ready on its first poll (`Store::decides_in_place`).
fn ready<T>(future: impl std::future::Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("the memory store made a call wait"),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(redis());
    memory();
}
