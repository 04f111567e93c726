//! The middleware's cost in-process: an axum handler bare and behind `RateLimitLayer` (one rule
//! keyed on the client IP, memory store, a limit that never denies), measured in the same run.
//! `cargo bench -p tollgate-tower` (the summary line gives the ratio, back to back).

use std::hint::black_box;
use std::net::SocketAddr;
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

fn app(limited: bool) -> Router {
    let router = Router::new().route("/", get(|| async { "ok" }));
    if !limited {
        return router;
    }
    let rules = Rules::parse("[[rules]]\nname = \"api\"\nlimit = \"1000000000/1s\"\nkey = [\"client_ip\"]\n", "bench")
        .expect("rules");
    router.layer(RateLimitLayer::new(rules, MemoryStore::new()))
}

fn request(i: u32) -> Request<Body> {
    let [_, _, high, low] = i.to_be_bytes();
    let peer = SocketAddr::from(([10, 0, high, low], 4000));
    let mut request = Request::builder().uri("/").header("user-agent", "bench").body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn one(runtime: &tokio::runtime::Runtime, router: &mut Router, i: u32) {
    let response = runtime.block_on(router.call(request(i))).expect("infallible");
    black_box(response.status());
}

fn ns_per_request(runtime: &tokio::runtime::Runtime, router: &mut Router, n: u32) -> f64 {
    let started = Instant::now();
    for i in 0..n {
        one(runtime, router, i);
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
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
    let (mut bare, mut limited) = (app(false), app(true));
    if std::env::var_os("SUMMARY_ONLY").is_none() {
        let mut criterion = Criterion::default().configure_from_args().measurement_time(Duration::from_secs(2));
        let mut i = 0u32;
        criterion.bench_function("axum handler, bare", |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                one(&runtime, &mut bare, i)
            })
        });
        criterion.bench_function("axum handler, behind RateLimitLayer", |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                one(&runtime, &mut limited, i)
            })
        });
        criterion.final_summary();
    }
    let mut rounds: Vec<(f64, f64)> = (0..9)
        .map(|_| (ns_per_request(&runtime, &mut bare, 50_000), ns_per_request(&runtime, &mut limited, 50_000)))
        .collect();
    rounds.sort_by(|a, b| (a.1 / a.0).total_cmp(&(b.1 / b.0)));
    let (b, l) = rounds[4];
    println!(
        "in-process, per request (median of 9 back-to-back rounds): bare {b:.0} ns, behind the middleware {l:.0} ns ({:.2}x, +{:.0} ns)",
        l / b,
        l - b
    );
    let (bare_at, limited_at) = (serve_loopback(app(false)), serve_loopback(app(true)));
    let mut rounds: Vec<(f64, f64)> =
        (0..9).map(|_| (loopback_median(bare_at, 2_000), loopback_median(limited_at, 2_000))).collect();
    rounds.sort_by(|a, b| (a.1 / a.0).total_cmp(&(b.1 / b.0)));
    let (b, l) = rounds[4];
    println!(
        "over loopback HTTP/1.1, median round trip: bare {:.1} us, behind the middleware {:.1} us ({:.2}x)",
        b / 1e3,
        l / 1e3,
        l / b
    );
}
