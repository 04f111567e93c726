//! Two `tollgate serve` processes on one redis-server, leasing one hot key: 32 clients each
//! hammer it for 3 s with `CL.THROTTLE` (pipelined), and the total admitted stays within the
//! algorithm's bound over the run (`burst + elapsed / T`, from idle), whatever the leases did.
//! How close to the bound it gets, and the Redis calls per decision, are printed (performance,
//! not asserted; see `scripts/bench-lease.sh`).

mod support;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::Tollgate;
use tollgate_store::testkit::redis_server::RedisServer;

const CLIENTS: usize = 32;
const PIPELINE: usize = 16;
const RUN: Duration = Duration::from_secs(3);
/// `CL.THROTTLE hot <burst - 1> <per second> 1`: burst 100 and 1,000 a second, or as
/// `TOLLGATE_LEASE_LIMIT="BURST PER_SECOND"` says (`scripts/bench-lease.sh` asks for more).
fn limit() -> (u64, u64) {
    let text = std::env::var("TOLLGATE_LEASE_LIMIT").unwrap_or_else(|_| "100 1000".into());
    let mut numbers = text.split_whitespace().map(|n| n.parse::<u64>().expect("TOLLGATE_LEASE_LIMIT: two integers"));
    (numbers.next().expect("a burst"), numbers.next().expect("a rate"))
}

/// One client: pipelined `CL.THROTTLE` until `stop`; counts requests and admissions.
fn client(address: SocketAddr, stop: Arc<AtomicBool>, requests: Arc<AtomicU64>, admitted: Arc<AtomicU64>) {
    let (burst, per_second) = limit();
    let (max_burst, rate) = ((burst - 1).to_string(), per_second.to_string());
    let stream = TcpStream::connect(address).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut command = Vec::new();
    tollgate_resp::command::encode(&["CL.THROTTLE", "hot", &max_burst, &rate, "1"], &mut command);
    let command = command.repeat(PIPELINE);
    while !stop.load(Ordering::Relaxed) {
        writer.write_all(&command).expect("write");
        for _ in 0..PIPELINE {
            // Five integers, the first 0 (allowed) or 1 (limited).
            let reply = tollgate_resp::value::read(&mut reader).expect("read");
            let fields = reply.integers().unwrap_or_else(|| panic!("not a decision: {reply:?}"));
            assert_eq!(fields.len(), 5, "{fields:?}");
            requests.fetch_add(1, Ordering::Relaxed);
            if fields[0] == 0 {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The sum of every sample of `node`'s metric lines starting with `name`.
fn metric(node: &Tollgate, name: &str) -> f64 {
    node.metrics()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[test]
fn two_leasing_processes_on_one_key_admit_no_more_than_the_bound() {
    let redis = RedisServer::start();
    let nodes = [Tollgate::serve(&["--store", &redis.url()]), Tollgate::serve(&["--store", &redis.url()])];
    let (stop, requests, admitted) = (Arc::new(AtomicBool::new(false)), Arc::default(), Arc::default());
    let started = Instant::now();
    let clients: Vec<_> = nodes
        .iter()
        .flat_map(|node| std::iter::repeat_n(node.resp(), CLIENTS))
        .map(|address| {
            let (stop, requests, admitted) = (stop.clone(), Arc::clone(&requests), Arc::clone(&admitted));
            std::thread::spawn(move || client(address, stop, requests, admitted))
        })
        .collect();
    std::thread::sleep(RUN);
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client");
    }
    // From before the first request to after the last answer: at least the span of every decision.
    let elapsed = started.elapsed().as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let requests = requests.load(Ordering::Relaxed) as f64;
    let (burst, per_second) = limit();
    let bound = burst as f64 + elapsed * per_second as f64;
    let calls: f64 = nodes.iter().map(|n| metric(n, "tollgate_store_script_calls_total")).sum();
    let forfeited: f64 = nodes.iter().map(|n| metric(n, "tollgate_lease_units_forfeited_total")).sum();
    let local: f64 = nodes.iter().map(|n| metric(n, "tollgate_lease_decisions_total{path=\"local\"}")).sum();
    eprintln!(
        "{requests} requests in {elapsed:.2} s, {admitted} admitted of a bound of {bound:.0} ({:.1}%), {forfeited} units \
         forfeited, {local} decided locally, {:.4} Redis calls per decision",
        100.0 * admitted / bound,
        calls / requests,
    );
    assert!(requests > bound, "the clients must ask for more than the limit admits ({requests} asked)");
    assert!(admitted <= bound, "{admitted} admitted over the bound {bound}");
    assert!(local > 0.0, "the hot key was never leased");
}
