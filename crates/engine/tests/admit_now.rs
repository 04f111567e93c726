//! `Engine::admit_now` (the middleware's way, deciding in line for a store that decides in place)
//! decides as `Engine::admit` does: two engines on manual clocks, each over its own memory store,
//! are sent the same requests, one through each; every admission, the metrics and the measured
//! rates read the same. Also (from the adversarial review of issue 41): reloads that make a rule
//! plain and not plain again between requests decide as `admit` does, and a flood of distinct
//! keys from real threads keeps the measured rates within their bound, the busy key still measured.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tollgate_core::ManualClock;
use tollgate_engine::{Admission, Answer, Engine, Request};
use tollgate_rules::Rules;
use tollgate_store::MemoryStore;

const T0: u64 = 1_700_000_000_000_000_000;

struct Side {
    engine: Engine<MemoryStore>,
    clock: Arc<ManualClock>,
    registry: Registry,
}

fn side(rules: &str) -> Side {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap();
    let engine = Engine::builder(store, rules).clock(clock.clone()).build(&mut registry);
    Side { engine, clock, registry }
}

impl Side {
    /// The metrics' lines, sorted (a family lists its series in no set order).
    fn metrics(&self) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    }
}

/// An admission as the tests compare it: what the front end would act on.
fn shown(admission: &Admission, side: &Side) -> String {
    match admission {
        Admission::Proceed(proceed) => {
            let fields = proceed.fields(&side.engine.policy());
            let fields = fields.map(|f| (f.policy, f.decision));
            format!("proceed delay={:?} pending={} fields={fields:?}", proceed.delay, proceed.pending.is_empty())
        }
        Admission::Answer(Answer::TooMany(fields)) => format!("429 {fields:?}"),
        Admission::Answer(other) => format!("{other:?}"),
    }
}

/// Sends `requests` (client address, path) to both sides, every `step` of the clock, and
/// compares what each decided; then their metrics and the rates of `measured`. What was decided.
async fn compare(rules: &str, requests: &[(&str, &str)], step: Duration, measured: Option<&str>) -> Vec<String> {
    let (now, then) = (side(rules), side(rules));
    let mut decided = Vec::new();
    for (i, &(ip, path)) in requests.iter().enumerate() {
        let client_ip: IpAddr = ip.parse().unwrap();
        let request = Request {
            method: "GET",
            path,
            query: "",
            host: "",
            headers: &[],
            client_ip,
            key: None,
            ja3: None,
            ja4: None,
            from_trusted_proxy: false,
        };
        let in_line =
            now.engine.admit_now(&now.engine.current(), &request, None).expect("the memory store decides in place");
        let awaited = then.engine.admit(&then.engine.policy(), &request).await;
        assert_eq!(shown(&in_line, &now), shown(&awaited, &then), "request {i} ({ip} {path})");
        decided.push(shown(&in_line, &now));
        now.clock.advance(step);
        then.clock.advance(step);
    }
    assert_eq!(now.metrics(), then.metrics());
    if let Some(rule) = measured {
        assert_eq!(now.engine.top(rule, 10).unwrap(), then.engine.top(rule, 10).unwrap());
    }
    decided
}

fn burst(ips: &[&'static str], each: usize) -> Vec<(&'static str, &'static str)> {
    ips.iter().flat_map(|&ip| std::iter::repeat_n((ip, "/"), each)).collect()
}

#[tokio::test]
async fn a_plain_rule_admits_then_rejects_alike() {
    let rules = "[[rules]]\nname = \"api\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\n";
    compare(rules, &burst(&["192.0.2.1", "192.0.2.2"], 5), Duration::from_millis(10), None).await;
}

#[tokio::test]
async fn a_measured_rule_and_when_rate_above_alike() {
    let rules = "[[rules]]\nname = \"fast\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
                 rate_half_life = \"1s\"\nwhen_rate_above = \"5/s\"\n";
    compare(rules, &burst(&["192.0.2.1"], 30), Duration::from_millis(100), Some("fast")).await;
    let rules = "[[rules]]\nname = \"api\"\nlimit = \"5/1s\"\nkey = [\"client_ip\"]\nrate_half_life = \"2s\"\n";
    compare(rules, &burst(&["192.0.2.1", "192.0.2.2"], 12), Duration::from_millis(50), Some("api")).await;
}

#[tokio::test]
async fn holds_dry_runs_and_several_rules_alike() {
    // A timeout holds the key past its limit (the mitigation in force); a dry-run rule only reports.
    let rules = "[[rules]]\nname = \"held\"\nlimit = \"2/1s\"\nkey = [\"client_ip\"]\n\
                 [rules.mitigation]\ntimeout = \"3s\"\n\
                 [[rules]]\nname = \"trial\"\nlimit = \"1/1s\"\nkey = [\"global\"]\nmatch = { path = \"/trial\" }\n\
                 [rules.mitigation]\naction = \"dry-run\"\n";
    let mut requests = burst(&["192.0.2.1"], 6);
    requests.extend([("192.0.2.3", "/trial"), ("192.0.2.3", "/trial"), ("192.0.2.4", "/")]);
    // Past the limit's own wait, within the hold: answered by the mitigation in force.
    requests.extend(burst(&["192.0.2.1"], 10));
    let decided = compare(rules, &requests, Duration::from_millis(100), None).await;
    assert!(decided[2].starts_with("429") && decided[18].starts_with("429"), "{decided:#?}");

    // A dry-run rule's hold selects requests another, plain, rule alone counts (its mitigation
    // matches them all): each is reported under the hold, then decided by the plain rule.
    let rules = "[[rules]]\nname = \"watch\"\nlimit = \"1/1m\"\nkey = [\"client_ip\"]\nmatch = { path = \"/watch\" }\n\
                 [rules.mitigation]\naction = \"dry-run\"\nmatch = {}\ntimeout = \"3s\"\n\
                 [[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"client_ip\"]\nmatch = { path = \"/api\" }\n";
    let requests = [("192.0.2.1", "/watch"), ("192.0.2.1", "/watch"), ("192.0.2.1", "/api"), ("192.0.2.1", "/api")];
    compare(rules, &requests, Duration::from_millis(100), None).await;
}

/// A request from `client_ip` to `path`.
fn request<'a>(client_ip: IpAddr, path: &'a str) -> Request<'a> {
    Request {
        method: "GET",
        path,
        query: "",
        host: "",
        headers: &[],
        client_ip,
        key: None,
        ja3: None,
        ja4: None,
        from_trusted_proxy: false,
    }
}

const PLAIN: &str = "[[rules]]\nname = \"api\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\nrate_half_life = \"1s\"\n";
const DRY: &str = "[[rules]]\nname = \"api\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\nrate_half_life = \"1s\"\n\
                   [rules.mitigation]\naction = \"dry-run\"\ntimeout = \"2s\"\n";
const HELD: &str = "[[rules]]\nname = \"api\"\nlimit = \"3/1m\"\nkey = [\"client_ip\"]\nrate_half_life = \"1s\"\n\
                    [rules.mitigation]\ntimeout = \"5s\"\n";
const OVER: &str = "[[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"client_ip\"]\nrate_half_life = \"1s\"\n\
                    when_rate_above = \"3/s\"\n";

#[tokio::test]
async fn reloads_between_plain_and_not_plain_decide_as_admit_does() {
    let (now, then) = (side(PLAIN), side(PLAIN));
    let ips: [IpAddr; 2] = ["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()];
    let mut i = 0;
    // Each policy for a burst of both clients, then the next (a hold made under one policy is in
    // force when the next one, plain again, decides).
    for rules in [PLAIN, DRY, PLAIN, HELD, PLAIN, OVER, PLAIN, HELD, DRY, PLAIN] {
        for side in [&now, &then] {
            side.engine.reload(Rules::parse(rules, "test").unwrap());
        }
        for round in 0..6 {
            for &ip in &ips {
                let path = if round % 2 == 0 { "/" } else { "/x" };
                let in_line = now.engine.admit_now(&now.engine.current(), &request(ip, path), None).unwrap();
                let awaited = then.engine.admit(&then.engine.policy(), &request(ip, path)).await;
                assert_eq!(shown(&in_line, &now), shown(&awaited, &then), "request {i} ({ip}) under\n{rules}");
                i += 1;
                now.clock.advance(Duration::from_millis(150));
                then.clock.advance(Duration::from_millis(150));
            }
        }
        assert_eq!(now.engine.top("api", 10).unwrap(), then.engine.top("api", 10).unwrap(), "under\n{rules}");
    }
    assert_eq!(now.metrics(), then.metrics());
}

#[test]
fn a_flood_of_distinct_keys_from_threads_stays_within_the_bound_and_keeps_the_busy_key() {
    const BOUND: usize = 64;
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let mut registry = Registry::default();
    let rules = "[[rules]]\nname = \"api\"\nlimit = \"1000000/1s\"\nkey = [\"client_ip\"]\nrate_half_life = \"10s\"\n";
    let engine = Arc::new(
        Engine::builder(store, Rules::parse(rules, "test").unwrap())
            .clock(clock.clone())
            .max_rated_keys(BOUND)
            .build(&mut registry),
    );
    let busy: IpAddr = "198.51.100.7".parse().unwrap();
    std::thread::scope(|scope| {
        for thread in 0..4u32 {
            let (engine, clock) = (engine.clone(), clock.clone());
            scope.spawn(move || {
                for n in 0..20_000u32 {
                    // Distinct keys (10.t.x.y), one request each, and the busy key every fourth.
                    let [_, _, high, low] = n.to_be_bytes();
                    let ip = IpAddr::from([10, u8::try_from(thread).unwrap(), high, low]);
                    let ip = if n % 4 == 0 { busy } else { ip };
                    let admitted = engine.admit_now(&engine.current(), &request(ip, "/"), None).unwrap();
                    assert!(matches!(admitted, Admission::Proceed(_)), "thread {thread} request {n}");
                    if n % 64 == 0 {
                        clock.advance(Duration::from_micros(100));
                    }
                }
            });
        }
    });
    let top = engine.top("api", 100_000).unwrap();
    assert!(top.len() <= BOUND, "{} keys measured past the bound of {BOUND}", top.len());
    assert_eq!(top.first().map(|t| t.key.as_str()), Some("198.51.100.7"), "the busy key first: {:?}", &top[..3]);
}

/// `requests` requests from `ip` through `admit_now`, split over `threads` real threads; how many
/// were admitted, and the key's measured rate then (the clock does not move).
fn hammer(engine: &Arc<Engine<MemoryStore>>, ip: IpAddr, threads: u32, requests: u32) -> (u32, f64) {
    let admitted = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..requests / threads {
                    if let Some(Admission::Proceed(_)) = engine.admit_now(&engine.current(), &request(ip, "/"), None) {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let top = engine.top("api", 10).unwrap();
    (admitted.into_inner(), top.iter().find(|t| t.key == ip.to_string()).map_or(-1.0, |t| t.rate_per_s))
}

#[test]
fn a_plain_measured_rule_from_threads_admits_its_count_exactly_and_measures_every_request() {
    let rules = "[[rules]]\nname = \"api\"\nlimit = \"1000/1h\"\nkey = [\"client_ip\"]\nrate_half_life = \"10s\"\n";
    let build = || {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let mut registry = Registry::default();
        Arc::new(Engine::builder(store, Rules::parse(rules, "test").unwrap()).clock(clock).build(&mut registry))
    };
    let ip: IpAddr = "192.0.2.9".parse().unwrap();
    let (alone, alone_rate) = hammer(&build(), ip, 1, 8000);
    let (threaded, threaded_rate) = hammer(&build(), ip, 4, 8000);
    assert_eq!(alone, 1000, "one thread");
    assert_eq!(threaded, 1000, "four threads admitted another count than the limit's");
    assert!(
        (threaded_rate - alone_rate).abs() <= alone_rate * 1e-9,
        "every request measured: {threaded_rate} from four threads, {alone_rate} from one"
    );
}
