//! The middleware's cost, next to tower_governor's measured in the same run: an axum handler
//! bare, behind a layer that does nothing (the floor: what axum's per-route layering costs any
//! middleware), behind `RateLimitLayer` (one rule keyed on the client IP, memory store) and
//! behind tower_governor's `GovernorLayer` (keyed on the peer IP), both with limits that never
//! deny, over 65,536 client addresses; and the same rule with its keys' rates measured
//! (`rate_half_life`, for `top`, `when_rate_above` and dry-run reports). In-process (tower `call` on the router) and over loopback
//! HTTP. `cargo bench -p tollgate-tower` (the summary lines give the ratios, rounds back to back;
//! `SUMMARY_ONLY=1` skips criterion; `ROUNDS=n` sets the in-process rounds, 9 by default;
//! `CPU_TIME=1` times them by this thread's time on the CPU, not the wall clock: on a machine
//! shared with other work, the only figures that hold). `PROFILE=tollgate` (or `measured`, `governor`, `bare`) runs
//! that app alone in process for ten seconds and prints its time per request: what to run under
//! `perf`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::routing::get;
use criterion::Criterion;
use tollgate_rules::Rules;
use tollgate_store::MemoryStore;
use tollgate_tower::RateLimitLayer;
use tower_service::Service;

/// The apps compared.
#[derive(Clone, Copy)]
enum Behind {
    Nothing,
    NoOp,
    Tollgate,
    Governor,
    TollgateMeasured,
}

const ALL: [Behind; 5] = [Behind::Nothing, Behind::NoOp, Behind::Tollgate, Behind::Governor, Behind::TollgateMeasured];

/// The rule of both tollgate apps: a limit that never denies, per client IP.
const RULE: &str = "[[rules]]\nname = \"api\"\nlimit = \"1000000000/1s\"\nkey = [\"client_ip\"]\n";

/// A layer that passes every request on: the cost of being a layer at all.
#[derive(Clone)]
struct PassThrough<S>(S);

impl<S: Service<R>, R> Service<R> for PassThrough<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.0.call(request)
    }
}

fn app(behind: Behind) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    let router = match behind {
        Behind::Nothing => router,
        Behind::NoOp => router.layer(tower_layer::layer_fn(PassThrough)),
        Behind::Tollgate => {
            router.layer(RateLimitLayer::new(Rules::parse(RULE, "bench").expect("rules"), MemoryStore::new()))
        }
        Behind::TollgateMeasured => {
            let rules = Rules::parse(&format!("{RULE}rate_half_life = \"2s\"\n"), "bench").expect("rules");
            router.layer(RateLimitLayer::new(rules, MemoryStore::new()))
        }
        Behind::Governor => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .finish()
                .expect("governor config");
            router.layer(tower_governor::GovernorLayer::new(config))
        }
    };
    // What `axum::serve` does once: without it, `call` would re-apply every layer to its route on
    // each request, a cost no served app pays.
    router.with_state(())
}

fn request(i: u32) -> Request<Body> {
    // 65,536 client addresses.
    let [_, _, high, low] = (i & 0xFFFF).to_be_bytes();
    let peer = SocketAddr::from(([10, 0, high, low], 4000));
    let mut request = Request::builder().uri("/").header("user-agent", "bench").body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn one(runtime: &tokio::runtime::Runtime, router: &mut Router, i: u32) {
    let response = runtime.block_on(router.call(request(i))).expect("infallible");
    black_box(response.status());
}

/// The time this thread has spent on a CPU, in ns (Linux: its scheduler statistics).
fn on_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

/// Whether rounds are timed on the CPU (`CPU_TIME=1`) rather than by the wall clock: on a
/// machine shared with other work, the time this thread waited for a core is not the requests'.
fn timed_on_cpu() -> bool {
    std::env::var_os("CPU_TIME").is_some_and(|v| v == "1") && on_cpu_ns().is_some()
}

fn ns_per_request(runtime: &tokio::runtime::Runtime, router: &mut Router, n: u32) -> f64 {
    let on_cpu = timed_on_cpu().then(on_cpu_ns).flatten();
    let started = Instant::now();
    for i in 0..n {
        one(runtime, router, i);
    }
    let elapsed = match (on_cpu, on_cpu_ns()) {
        (Some(before), Some(after)) => after.saturating_sub(before) as f64,
        _ => started.elapsed().as_nanos() as f64,
    };
    elapsed / f64::from(n)
}

/// Serves `router` on a loopback port from a background runtime; returns the address.
fn serve_loopback(router: Router) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("address")).expect("send");
            axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await.expect("serve");
        });
    });
    rx.recv().expect("address")
}

/// Median round-trip of `n` keep-alive HTTP/1.1 GETs over loopback, in ns.
fn loopback_median(address: SocketAddr, n: usize) -> f64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut buffer = [0u8; 4096];
    let mut samples: Vec<f64> = (0..n)
        .map(|_| {
            let started = Instant::now();
            stream.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n").expect("write");
            // The reply is small: read until the 2-byte body "ok" has arrived.
            let mut got = Vec::new();
            while !got.ends_with(b"ok") {
                let read = stream.read(&mut buffer).expect("read");
                assert!(read > 0, "closed");
                got.extend_from_slice(&buffer[..read]);
            }
            started.elapsed().as_nanos() as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[n / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut apps = ALL.map(app);
    if let Some(profiled) = std::env::var_os("PROFILE") {
        let k = match profiled.to_str() {
            Some("bare") => 0,
            Some("tollgate") => 2,
            Some("governor") => 3,
            Some("measured") => 4,
            _ => panic!("PROFILE is one of bare, tollgate, governor, measured"),
        };
        let started = Instant::now();
        let mut rounds = Vec::new();
        while started.elapsed() < Duration::from_secs(10) {
            rounds.push(ns_per_request(&runtime, &mut apps[k], 65_536));
        }
        rounds.sort_by(f64::total_cmp);
        eprintln!("{profiled:?}: {:.0} ns per request (median of {} rounds)", rounds[rounds.len() / 2], rounds.len());
        return;
    }
    let names = [
        "axum handler, bare",
        "axum handler, behind a pass-through layer",
        "axum handler, behind RateLimitLayer",
        "axum handler, behind tower_governor",
        "axum handler, behind RateLimitLayer, rates measured",
    ];
    if std::env::var_os("SUMMARY_ONLY").is_none() {
        let mut criterion = Criterion::default().configure_from_args().measurement_time(Duration::from_secs(2));
        let mut i = 0u32;
        for (router, name) in apps.iter_mut().zip(names) {
            criterion.bench_function(name, |b| {
                b.iter(|| {
                    i = i.wrapping_add(1);
                    one(&runtime, router, i)
                })
            });
        }
        criterion.final_summary();
    }
    // Rounds of the five back to back; the median round by tollgate's overhead over governor's.
    let overhead = |round: &[f64; 5]| (round[2] - round[0]) / (round[3] - round[0]);
    let count: usize = std::env::var("ROUNDS").ok().and_then(|n| n.parse().ok()).filter(|&n| n > 0).unwrap_or(9);
    let mut rounds: Vec<[f64; 5]> =
        (0..count).map(|_| std::array::from_fn(|k| ns_per_request(&runtime, &mut apps[k], 65_536))).collect();
    rounds.sort_by(|a, b| overhead(a).total_cmp(&overhead(b)));
    let [bare, noop, tollgate, governor, measured] = rounds[count / 2];
    let clock = if timed_on_cpu() { ", on the CPU" } else { "" };
    println!(
        "in-process, per request (median of {count} rounds{clock}): bare {bare:.0} ns; a pass-through layer +{:.0} ns; \
         tollgate +{:.0} ns; tower_governor +{:.0} ns; tollgate's overhead is {:.2}x governor's \
         ({:.2}x beyond the pass-through layer's); with its rates measured +{:.0} ns ({:.2}x governor's)",
        noop - bare,
        tollgate - bare,
        governor - bare,
        (tollgate - bare) / (governor - bare),
        (tollgate - noop) / (governor - noop),
        measured - bare,
        (measured - bare) / (governor - bare),
    );
    let addresses: Vec<SocketAddr> = ALL.map(|b| serve_loopback(app(b))).into();
    let mut rounds: Vec<[f64; 5]> =
        (0..9).map(|_| std::array::from_fn(|k| loopback_median(addresses[k], 2_000))).collect();
    rounds.sort_by(|a, b| (a[2] / a[0]).total_cmp(&(b[2] / b[0])));
    let [bare, noop, tollgate, governor, measured] = rounds[4];
    println!(
        "over loopback HTTP/1.1, median round trip: bare {:.1} us, pass-through layer {:.3}x, tollgate {:.3}x, \
         tower_governor {:.3}x, tollgate with rates measured {:.3}x",
        bare / 1e3,
        noop / bare,
        tollgate / bare,
        governor / bare,
        measured / bare
    );
}
