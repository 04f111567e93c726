//! The engine's measured rates, `when_rate_above` and `route`, on a manual clock shared with the
//! memory store: exact, whatever the machine's load.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tollgate_core::ManualClock;
use tollgate_engine::{Admission, Answer, Engine, Request};
use tollgate_rules::Rules;
use tollgate_store::{Check, MemoryStore, Store};

const T0: u64 = 1_700_000_000_000_000_000;

struct Setup {
    engine: Engine<MemoryStore>,
    clock: Arc<ManualClock>,
    registry: Registry,
}

fn engine(rules: &str, routes: bool) -> Setup {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let mut registry = Registry::with_prefix("tollgate");
    let rules = Rules::parse(rules, "test").unwrap();
    let engine = Engine::builder(store, rules).clock(clock.clone()).routes(routes).build(&mut registry);
    Setup { engine, clock, registry }
}

impl Setup {
    async fn admit(&self, ip: &str) -> Admission {
        let client_ip: IpAddr = ip.parse().unwrap();
        let request = Request {
            method: "GET",
            path: "/",
            query: "",
            host: "",
            headers: &[],
            client_ip,
            key: None,
            ja3: None,
            ja4: None,
            from_trusted_proxy: false,
        };
        self.engine.admit(&self.engine.policy(), &request).await
    }

    /// What the request got: "proceed", "route:RULE", "429:RULE" or "shadow".
    async fn outcome(&self, ip: &str) -> String {
        match self.admit(ip).await {
            Admission::Proceed(_) => "proceed".into(),
            Admission::Answer(Answer::Route { fields, .. }) => format!("route:{}", fields.policy),
            Admission::Answer(Answer::TooMany(fields)) => format!("429:{}", fields.policy),
            Admission::Answer(other) => format!("{other:?}"),
        }
    }

    /// What is left of `key`'s limit under `rule`.
    async fn remaining(&self, rule: &str, key: &str) -> u64 {
        let policy = self.engine.policy();
        let (_, rule) = policy.rules.named(rule).unwrap();
        let check = Check::new(key.as_bytes(), &rule.limit, 0).scoped(&rule.name);
        self.engine.store().check_one(check).await.unwrap().remaining
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }
}

const ROUTE_AND_REJECT: &str = "[[rules]]\nname = \"quarantine\"\nlimit = \"1/1m\"\nkey = [\"global\"]\n\
     [rules.mitigation]\naction = \"route\"\nupstream = \"http://127.0.0.1:3001\"\n\
     [[rules]]\nname = \"per-ip\"\nlimit = \"3/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n";

/// Before: the first rule over its limit acted, so a route rule listed first sent a request to
/// the quarantine uncharged by the others, and won over a rule that rejects.
#[tokio::test]
async fn a_quarantined_request_is_charged_to_the_other_rules_and_rejection_wins() {
    let setup = engine(ROUTE_AND_REJECT, true);
    assert_eq!(setup.outcome("192.0.2.1").await, "proceed");
    assert_eq!(setup.outcome("192.0.2.1").await, "route:quarantine");
    assert_eq!(setup.remaining("per-ip", "192.0.2.1").await, 1, "the quarantined request was charged");
    assert_eq!(setup.outcome("192.0.2.1").await, "route:quarantine");
    assert_eq!(setup.outcome("192.0.2.1").await, "429:per-ip", "over a rule that rejects: rejected");
    assert_eq!(setup.outcome("192.0.2.2").await, "route:quarantine");
    let metrics = setup.metrics();
    assert!(metrics.contains("tollgate_rule_decisions_total{rule=\"quarantine\",outcome=\"routed\"} 3"), "{metrics}");
    assert!(metrics.contains("tollgate_rule_decisions_total{rule=\"per-ip\",outcome=\"rejected\"} 1"), "{metrics}");
}

/// A front end that does not route gets a 429 for a route rule, counted as rejected.
#[tokio::test]
async fn without_routing_a_route_rule_rejects() {
    let setup = engine(ROUTE_AND_REJECT, false);
    assert_eq!(setup.outcome("192.0.2.1").await, "proceed");
    assert_eq!(setup.outcome("192.0.2.1").await, "429:quarantine");
    assert_eq!(setup.remaining("per-ip", "192.0.2.1").await, 2, "all or nothing: a rejection charges none");
    let metrics = setup.metrics();
    assert!(metrics.contains("rule=\"quarantine\",outcome=\"rejected\"} 1") && !metrics.contains("routed\"} 1"));
}

/// 10/s against `when_rate_above = "5/s"` is mitigated, its limit far from reached; a client that
/// waits exactly the Retry-After it was given is then admitted (the wait counts the retry's own
/// weight); a plain rule is not measured at all.
#[tokio::test]
async fn when_rate_above_mitigates_and_its_retry_after_is_enough() {
    let setup = engine(
        "[[rules]]\nname = \"fast\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         rate_half_life = \"1s\"\nwhen_rate_above = \"5/s\"\n\
         [[rules]]\nname = \"plain\"\nlimit = \"1000/1m\"\nkey = [\"global\"]\n",
        false,
    );
    let (mut first_denied, mut admitted) = (None, 0);
    for i in 0..30 {
        match setup.admit("192.0.2.1").await {
            Admission::Answer(Answer::TooMany(fields)) if first_denied.is_none() => {
                first_denied = Some((i, fields.decision.retry_after_ns, fields.rate_per_s.unwrap()));
            }
            Admission::Proceed(_) => admitted += 1,
            _ => {}
        }
        setup.clock.advance(Duration::from_millis(100));
    }
    let (i, _, rate) = first_denied.expect("10/s is over 5/s");
    assert!(i <= 10 && rate > 5.0, "denied from request {i}, at {rate}/s");
    let Admission::Answer(Answer::TooMany(fields)) = setup.admit("192.0.2.1").await else { panic!("still over") };
    let measured = fields.rate_per_s.unwrap();
    assert!((9.0..=11.0).contains(&measured), "10/s measured as {measured}/s");
    setup.clock.advance(Duration::from_nanos(fields.decision.retry_after_ns));
    assert_eq!(setup.outcome("192.0.2.1").await, "proceed", "after the Retry-After it was given");
    assert_eq!(admitted, i, "admitted until first denied, then mitigated while over");
    assert_eq!(setup.remaining("fast", "192.0.2.1").await, 1000 - admitted - 1, "rate mitigations take nothing");
    let top = setup.engine.top("fast", 10).unwrap();
    assert_eq!(top[0].key, "192.0.2.1");
    let plain = setup.engine.top("plain", 10).unwrap_err().to_string();
    assert!(plain.contains("does not measure"), "a plain rule is not measured: {plain}");
    assert!(setup.engine.top("nope", 10).is_err());
}

/// A dry-run rule over its `when_rate_above` logs and counts the request once, as dry_run.
#[tokio::test]
async fn a_dry_run_over_its_rate_is_counted_once() {
    let setup = engine(
        "[[rules]]\nname = \"trial\"\nlimit = \"1000/1m\"\nkey = [\"global\"]\n\
         rate_half_life = \"1s\"\nwhen_rate_above = \"2/s\"\n[rules.mitigation]\naction = \"dry-run\"\n",
        false,
    );
    for _ in 0..5 {
        assert_eq!(setup.outcome("192.0.2.1").await, "proceed");
    }
    let metrics = setup.metrics();
    // One request alone reads 2·ln 2 = 1.39/s; two at once 2.77/s: over from the second.
    assert!(metrics.contains("rule=\"trial\",outcome=\"allowed\"} 1\n"), "{metrics}");
    assert!(metrics.contains("rule=\"trial\",outcome=\"dry_run\"} 4\n"), "{metrics}");
    let top = setup.engine.top("trial", 1).unwrap();
    assert!(top[0].limited, "{top:?}");
}

const TRIAL_AND_PER_IP: &str = "[[rules]]\nname = \"trial\"\nlimit = \"10/1m\"\nkey = [\"global\"]\n\
     [rules.mitigation]\naction = \"dry-run\"\n\
     [[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n";

/// A dry-run rule counts what it would count enforced: a request another rule refuses consumes
/// nothing anywhere (all or nothing), so it consumes nothing of the rule on trial either. Before,
/// the dry-run rule was charged before the enforced ones and kept the charge of refused
/// requests, reading "would limit" for traffic that enforcement would never have let reach it.
/// Envoy's `shadow_mode` counts the same way (`asks.rs`).
#[tokio::test]
async fn a_dry_run_rule_counts_only_what_the_enforced_rules_let_through() {
    let setup = engine(TRIAL_AND_PER_IP, true);
    for _ in 0..2 {
        assert_eq!(setup.outcome("192.0.2.1").await, "proceed");
    }
    for _ in 0..5 {
        assert_eq!(setup.outcome("192.0.2.1").await, "429:per-ip");
    }
    assert_eq!(setup.remaining("trial", "").await, 8, "only the two admitted requests count");
    let metrics = setup.metrics();
    assert!(metrics.contains("rule=\"trial\",outcome=\"allowed\"} 2\n"), "{metrics}");
}
