//! `Engine::admit_now` (the middleware's way, deciding in line for a store that decides in place)
//! decides as `Engine::admit` does: two engines on manual clocks, each over its own memory store,
//! are sent the same requests, one through each; every admission, the metrics and the measured
//! rates read the same.

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
