//! A load loop for `tollgate serve`: the same decision asked over gRPC (Envoy's
//! `ShouldRateLimit`, one descriptor) and over RESP (`TG.CHECK`, the same fixed-window limit), by
//! `CONCURRENCY` tasks for `SECONDS` each, one after the other in the same run; prints calls/s
//! and latency percentiles for both, and their ratio. `scripts/bench-grpc.sh` runs it against
//! the memory store and Redis.
//!
//! `cargo run --release -p tollgate-server --example rls_load -- GRPC_ADDR RESP_ADDR [SECONDS] [CONCURRENCY]`
//!
//! The server must serve domain `bench` with `- key: user` limited to `1000000000/second` (the
//! script writes that file): every call is admitted, and the keys are spread over 10,000 users.

use std::time::{Duration, Instant};

use tollgate_rls::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};

/// Calls/s and latency percentiles of one run.
struct Run {
    calls: usize,
    seconds: f64,
    latencies: Vec<Duration>,
}

impl Run {
    fn report(&mut self, name: &str) -> f64 {
        self.latencies.sort_unstable();
        // The q-quantile by rank: `len * per_mille / 1000`.
        let at = |per_mille: usize| {
            let i = (self.latencies.len() * per_mille / 1000).min(self.latencies.len().saturating_sub(1));
            self.latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        let rate = self.calls as f64 / self.seconds;
        println!("{name:<28} {rate:>12.0} {:>10.0} {:>10.0} {:>10.0}", at(500), at(990), at(999));
        rate
    }
}

async fn grpc(address: &str, seconds: u64, concurrency: usize) -> Run {
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let mut client = RateLimitServiceClient::new(channel.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = task;
                while Instant::now() < deadline {
                    i = i.wrapping_add(concurrency);
                    let entry = Entry { key: "user".into(), value: format!("u{}", i % 10_000) };
                    let descriptor = RateLimitDescriptor { entries: vec![entry], limit: None, hits_addend: None };
                    let request =
                        RateLimitRequest { domain: "bench".into(), descriptors: vec![descriptor], hits_addend: 0 };
                    let start = Instant::now();
                    let response = client.should_rate_limit(request).await.expect("an answer").into_inner();
                    latencies.push(start.elapsed());
                    assert_eq!(response.overall_code, 1, "every call is admitted");
                }
                latencies
            })
        })
        .collect();
    collect(tasks, seconds).await
}

async fn resp(address: &str, seconds: u64, concurrency: usize) -> Run {
    let client = redis::Client::open(format!("redis://{address}")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        // One connection per task, as each gRPC task shares one HTTP/2 connection's streams.
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = task;
            while Instant::now() < deadline {
                i = i.wrapping_add(concurrency);
                let start = Instant::now();
                let reply: Vec<i64> = redis::cmd("TG.CHECK")
                    .arg(format!("u{}", i % 10_000))
                    .arg("fixed-window")
                    .arg(1_000_000_000)
                    .arg(1000)
                    .query_async(&mut connection)
                    .await
                    .expect("an answer");
                latencies.push(start.elapsed());
                assert_eq!(reply[0], 1, "every call is admitted");
            }
            latencies
        }));
    }
    collect(tasks, seconds).await
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>, seconds: u64) -> Run {
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    Run { calls: latencies.len(), seconds: seconds as f64, latencies }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(grpc_address), Some(resp_address)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: rls_load GRPC_ADDR RESP_ADDR [SECONDS] [CONCURRENCY]");
        std::process::exit(2);
    };
    let seconds = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let concurrency = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(64);
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>10}",
        format!("-c {concurrency}, {seconds} s"),
        "calls/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs"
    );
    let over_grpc = grpc(grpc_address, seconds, concurrency).await.report("gRPC ShouldRateLimit");
    let over_resp = resp(resp_address, seconds, concurrency).await.report("RESP TG.CHECK");
    println!("gRPC / RESP: {:.2}x", over_grpc / over_resp);
}
