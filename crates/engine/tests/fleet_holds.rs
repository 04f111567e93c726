//! Issue 36 item 6: a hold lives in the store, beside the counts, so that a fleet of engines
//! sharing one store holds a key as one engine does. Each test puts a client over the `login`
//! rule (one failed login a second per client IP, every request of that IP held 60 s once over)
//! on node A, then asks node B (another engine on the same store) and a restarted node (an
//! engine built afresh on it): both answer 429 with the rest of the hold as the retry, for the
//! rest of the timeout, with `login`'s own limit admitting again meanwhile.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Harness, Req, build, build_tuned, clock, get, memory, post, secs};
use tollgate_core::ManualClock;
use tollgate_engine::{Admission, Answer};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::testkit::redis_topology::RedisCluster;
use tollgate_store::{
    Check, FailurePolicy, Fallback, LeaseOptions, Leased, RedisOptions, RedisStore, Store, TimeSource,
};

/// `login`: failed logins (every POST /login here) per client IP, 1 a second; once over, every
/// request of that IP (`mitigation.match = {}`) held 60 s. `trial`: the same on `/trial`, in
/// dry-run.
const RULES: &str = "[[rules]]\nname = \"login\"\nlimit = \"1/1s\"\nalgorithm = \"fixed-window\"\n\
    key = [\"client_ip\"]\nmatch = { method = \"POST\", path = \"/login\" }\n\
    [rules.mitigation]\nmatch = {}\ntimeout = \"60s\"\n\
    [[rules]]\nname = \"trial\"\nlimit = \"1/1s\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
    match = { path = \"/trial\" }\n[rules.mitigation]\naction = \"dry-run\"\ntimeout = \"60s\"\n";

const IP: &str = "198.51.100.7";

/// What `req` got on `node`, and the retry it was told (0 when let through).
async fn answer<S: Store>(node: &Harness<S>, req: &Req) -> (String, Duration) {
    let admission = node.admit(req).await;
    let retry = match &admission {
        Admission::Answer(Answer::TooMany(fields)) => Duration::from_nanos(fields.decision.retry_after_ns),
        _ => Duration::ZERO,
    };
    (support::describe(&admission), retry)
}

/// Puts [`IP`] over `login` on `a` (held 60 s from then), then checks that `b` and `restarted()`
/// hold it too, for the rest of the 60 s, on every request of that IP; then that the hold ends.
async fn holds_across<S: Store>(a: &Harness<S>, b: &Harness<S>, restarted: impl Fn() -> Harness<S>) {
    let login = post("/login").from(IP);
    let home = get("/").from(IP);
    assert_eq!(a.outcomes(&login, 2).await, ["proceed", "429:login"], "node A puts the key over");
    // B never counted the IP: it knows of the hold from the store alone.
    assert_eq!(answer(b, &home).await, ("429:login".into(), secs(60)), "node B holds the IP at once");
    a.advance(secs(2));
    // `login`'s own window admits again: only the hold answers now.
    assert_eq!(answer(b, &login).await, ("429:login".into(), secs(58)), "node B, a login after the window");
    let c = restarted();
    assert_eq!(answer(&c, &home).await, ("429:login".into(), secs(58)), "a restarted node keeps the hold");
    a.advance(secs(57));
    assert_eq!(answer(&c, &login).await, ("429:login".into(), secs(1)), "held to the end of the timeout");
    a.advance(secs(1));
    assert_eq!(b.outcome(&home).await, "proceed", "the hold ended on B");
    assert_eq!(c.outcome(&login).await, "proceed", "and on the restarted node");
}

/// Two engines on one memory store (an application building an engine per listener, or one
/// rebuilt on the store it keeps).
#[tokio::test]
async fn engines_sharing_a_memory_store_hold_a_key_as_one() {
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = || build(store.clone(), clock.clone(), RULES, true);
    holds_across(&node(), &node(), node).await;
}

/// A node's Redis stack as `tollgate proxy` opens it (leases, failure policy, the store), on the
/// test's manual clock, on `url` with `prefix`.
fn redis_node(url: &str, prefix: &str, clock: &Arc<ManualClock>) -> Harness<Leased<Fallback<RedisStore>>> {
    redis_node_timed(url, prefix, clock, TimeSource::Clock(clock.clone()), RULES)
}

/// [`redis_node`] with `rules`, its decisions timed by `time`.
fn redis_node_timed(
    url: &str,
    prefix: &str,
    clock: &Arc<ManualClock>,
    time: TimeSource,
    rules: &str,
) -> Harness<Leased<Fallback<RedisStore>>> {
    let options =
        RedisOptions { prefix: prefix.into(), time, timeout: Duration::from_secs(2), ..RedisOptions::default() };
    let redis = RedisStore::open(url, options).unwrap();
    let fallback = Fallback::with_options(
        redis,
        FailurePolicy::Local,
        tollgate_store::fallback::FallbackOptions { clock: clock.clone(), ..Default::default() },
    );
    let store = Leased::new(fallback, LeaseOptions::default(), clock.clone());
    build(store, clock.clone(), rules, true)
}

/// Before: node B let the login through (`proceed`): the hold lived only in node A's process.
#[tokio::test]
async fn nodes_sharing_one_redis_hold_a_key_as_one() {
    let server = RedisServer::start();
    let clock = clock();
    let node = || redis_node(&server.url(), "fleet", &clock);
    holds_across(&node(), &node(), node).await;
}

/// The same on a 3-node Redis Cluster: the hold lives in its key's slot.
#[tokio::test]
async fn nodes_sharing_a_redis_cluster_hold_a_key_as_one() {
    let cluster = RedisCluster::start();
    let url = format!("redis+cluster://{}", cluster.urls().join(",").replace("redis://", ""));
    let clock = clock();
    let node = || redis_node(&url, "fleet", &clock);
    holds_across(&node(), &node(), node).await;
}

/// A `global` rule (one key: the empty one) and a rule keyed on a header whose value starts with
/// `}`, each with a `timeout`, on a 3-node Redis Cluster: both hold as one. Before: every decision
/// of theirs failed (the hold's Redis key in another slot than the state's: a cross-slot call),
/// answered 503 by `on_error`, a whole site down for a `global` rule that worked before holds.
#[tokio::test]
async fn keys_whose_braces_make_no_tag_hold_as_one_on_a_cluster() {
    let rules = "[[rules]]\nname = \"everyone\"\nlimit = \"1/1s\"\nalgorithm = \"fixed-window\"\n\
        key = [\"global\"]\nmatch = { path = \"/all\" }\n[rules.mitigation]\ntimeout = \"60s\"\n\
        [[rules]]\nname = \"tenant\"\nlimit = \"1/1s\"\nalgorithm = \"fixed-window\"\n\
        key = [\"header:x-tenant\"]\nmatch = { path = \"/t\" }\n[rules.mitigation]\ntimeout = \"60s\"\n";
    let cluster = RedisCluster::start();
    let url = format!("redis+cluster://{}", cluster.urls().join(",").replace("redis://", ""));
    let clock = clock();
    let node = || redis_node_timed(&url, "tagless", &clock, TimeSource::Clock(clock.clone()), rules);
    let (a, b) = (node(), node());
    let all = get("/all").from(IP);
    let tenant = get("/t").from(IP).header("x-tenant", "}acme");
    assert_eq!(a.outcomes(&all, 2).await, ["proceed", "429:everyone"], "the global key");
    assert_eq!(a.outcomes(&tenant, 2).await, ["proceed", "429:tenant"], "a key starting with }}");
    a.advance(secs(2));
    assert_eq!(answer(&b, &all).await, ("429:everyone".into(), secs(58)), "node B holds the global key");
    assert_eq!(answer(&b, &tenant).await, ("429:tenant".into(), secs(58)), "and the tenant");
}

/// A dry-run rule's hold denies nothing anywhere: node A reports it (`dry_run`), node B decides
/// the rule's requests by its limit, and an enforced rule's store never sees it.
#[tokio::test]
async fn a_dry_run_hold_denies_nothing_on_another_node() {
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = || build(store.clone(), clock.clone(), RULES, true);
    let (a, b) = (node(), node());
    let trial = post("/trial").from(IP);
    assert_eq!(a.outcomes(&trial, 2).await, ["proceed", "proceed"]);
    assert_eq!(a.counted("trial", "dry_run"), 1);
    a.advance(secs(2));
    assert_eq!(b.outcome(&trial).await, "proceed");
    assert_eq!(b.counted("trial", "allowed"), 1, "node B decides it by the limit, which admits");
    assert_eq!(b.outcome(&post("/login").from(IP)).await, "proceed", "no enforced rule holds the IP");
    // Node A's dry-run hold never reached the store.
    let limit = a.engine.policy().rules.named("trial").unwrap().1.limit.clone();
    let check = Check::new(IP.as_bytes(), &limit, 0).scoped("trial");
    assert_eq!(store.held(&[check]).await.unwrap(), [None], "the store holds the dry-run rule's key");
}

/// A store-held key's denial charges nothing: the rule's state on node B is untouched while it
/// answers from the hold, and a hold never admits what the limit denies.
#[tokio::test]
async fn a_hold_charges_nothing_and_admits_nothing_the_limit_denies() {
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = || build(store.clone(), clock.clone(), RULES, true);
    let (a, b) = (node(), node());
    let login = post("/login").from(IP);
    assert_eq!(a.outcomes(&login, 2).await, ["proceed", "429:login"]);
    for _ in 0..5 {
        assert_eq!(b.outcome(&login).await, "429:login");
    }
    // The window of the first login is over: nothing the held requests did is counted.
    a.advance(secs(61));
    let limit = tollgate_core::Limit::per_second(1).algorithm(tollgate_core::Algorithm::FixedWindow).build().unwrap();
    let left = store.check_one(Check::new(IP.as_bytes(), &limit, 0).scoped("login")).await.unwrap();
    assert_eq!(left.remaining, 1);
    assert_eq!(b.outcome(&login).await, "proceed");
    assert_eq!(b.outcome(&login).await, "429:login", "the limit still denies, and holds again");
    assert_eq!(answer(&a, &get("/").from(IP)).await.0, "429:login", "node A learns the new hold from the store");
}

/// A node holding at most 16 keys in its own table: 200 clients over `login` overflow it, and the
/// store still holds every one. Before holds were in the store, the table's evictions ended holds
/// early (`tests/holds.rs` keeps showing which ones, on a store that keeps none).
#[tokio::test]
async fn a_hold_the_table_dropped_is_still_in_force_from_the_store() {
    let clock = clock();
    let node = build_tuned(Arc::new(memory(&clock)), clock.clone(), RULES, |b| b.max_blocks(16));
    let ips: Vec<String> = (0..200).map(|i| format!("198.51.100.{i}")).collect();
    for ip in &ips {
        assert_eq!(node.outcomes(&post("/login").from(ip), 2).await, ["proceed", "429:login"]);
    }
    assert!(node.series("tollgate_blocks_dropped_total") > 100, "the table made room");
    node.advance(secs(2));
    for ip in &ips {
        assert_eq!(answer(&node, &get("/").from(ip)).await, ("429:login".into(), secs(58)), "{ip}");
    }
}

/// A reset of the key under the rule (`Engine::reset`) ends its hold in the store and in the
/// resetting engine's table; another engine keeps the hold it learnt until it ends (its table is
/// not told).
#[tokio::test]
async fn a_reset_ends_the_hold_in_the_store() {
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = || build(store.clone(), clock.clone(), RULES, true);
    let (a, b) = (node(), node());
    assert_eq!(a.outcomes(&post("/login").from(IP), 2).await, ["proceed", "429:login"]);
    assert_eq!(b.outcome(&get("/").from(IP)).await, "429:login");
    let limit = a.engine.policy().rules.named("login").unwrap().1.limit.clone();
    a.engine.reset("login", IP.as_bytes(), &limit).await.unwrap();
    assert_eq!(a.outcome(&get("/").from(IP)).await, "proceed", "the resetting node");
    assert_eq!(node().outcome(&get("/").from(IP)).await, "proceed", "a node that did not know the hold");
    assert_eq!(b.outcome(&get("/").from(IP)).await, "429:login", "a node that knew it, until it ends");
}

/// Without a `timeout`, a rule whose `mitigation.match` is wider than its `match` holds the key
/// while it is over: that hold is shared too, for the requests the rule only mitigates (those it
/// counts are decided by its limit).
#[tokio::test]
async fn a_hold_while_over_is_shared() {
    let rules = "[[rules]]\nname = \"login\"\nlimit = \"1/10s\"\nalgorithm = \"fixed-window\"\n\
        key = [\"client_ip\"]\nmatch = { method = \"POST\", path = \"/login\" }\n\
        [rules.mitigation]\nmatch = {}\n";
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = || build(store.clone(), clock.clone(), rules, true);
    let (a, b) = (node(), node());
    assert_eq!(a.outcomes(&post("/login").from(IP), 2).await, ["proceed", "429:login"]);
    a.advance(secs(4));
    assert_eq!(answer(&b, &get("/").from(IP)).await, ("429:login".into(), secs(6)), "held until the window ends");
    a.advance(secs(6));
    assert_eq!(b.outcome(&get("/").from(IP)).await, "proceed");
}

/// A memory store counting the holds written to it.
struct CountedHolds(Arc<tollgate_store::MemoryStore>, std::sync::atomic::AtomicU64);

impl Store for CountedHolds {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<tollgate_store::Reserved, tollgate_store::StoreError> {
        self.0.reserve(checks).await
    }

    async fn refund(&self, refunds: &[tollgate_store::Refund<'_>]) -> Result<(), tollgate_store::StoreError> {
        self.0.refund(refunds).await
    }

    async fn reset(
        &self,
        scope: &str,
        key: &[u8],
        limit: &tollgate_core::Limit,
    ) -> Result<(), tollgate_store::StoreError> {
        self.0.reset(scope, key, limit).await
    }

    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), tollgate_store::StoreError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.hold(scope, key, hold_ns).await
    }

    async fn held(&self, checks: &[Check<'_>]) -> Result<Vec<Option<u64>>, tollgate_store::StoreError> {
        self.0.held(checks).await
    }
}

/// A hold while over is written once per node, not once per denial: a client flooding the
/// logins its key is over for costs the store one call each (its decision), as before holds were
/// shared, and the other nodes still hold it. Before: every denial wrote the hold again, doubling
/// the store's calls under the flood (21 writes for 21 denials).
#[tokio::test]
async fn a_hold_while_over_is_written_once_not_per_denial() {
    let rules = "[[rules]]\nname = \"login\"\nlimit = \"1/10s\"\nalgorithm = \"fixed-window\"\n\
        key = [\"client_ip\"]\nmatch = { method = \"POST\", path = \"/login\" }\n\
        [rules.mitigation]\nmatch = {}\n";
    let clock = clock();
    let memory = Arc::new(memory(&clock));
    let a = build(CountedHolds(memory.clone(), 0.into()), clock.clone(), rules, true);
    let login = post("/login").from(IP);
    assert_eq!(a.outcome(&login).await, "proceed");
    for _ in 0..21 {
        assert_eq!(a.outcome(&login).await, "429:login");
        a.advance(Duration::from_millis(100));
    }
    let b = build(memory.clone(), clock.clone(), rules, true);
    assert_eq!(answer(&b, &get("/").from(IP)).await.0, "429:login", "the other nodes hold the key");
    let written = a.engine.store().1.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(written, 1, "holds written for 21 denials of one key over one window");
    a.advance(secs(10));
    assert_eq!(a.outcomes(&login, 2).await, ["proceed", "429:login"], "over again in the next window");
    assert_eq!(a.engine.store().1.load(std::sync::atomic::Ordering::Relaxed), 2, "its hold written anew");
}

/// On Redis's own time (the default), a hold ends when Redis's clock says: two nodes whose clocks
/// are a year apart, both wrong, hold the key as one for the timeout. A hold whose end a node
/// computed on its own clock would be over at once on the node behind, or last a year.
#[tokio::test]
async fn a_hold_on_redis_time_ends_by_redis_clock_whatever_the_nodes_clocks() {
    // GCRA, 1 per 10 s: a second login at once is over whatever instant Redis is at.
    let rules = RULES.replacen("limit = \"1/1s\"\nalgorithm = \"fixed-window\"", "limit = \"1/10s\"", 1);
    let server = RedisServer::start();
    let year = secs(365 * 86_400);
    let (behind, ahead) = (clock(), clock());
    ahead.advance(year);
    let node = |clock: &Arc<ManualClock>| redis_node_timed(&server.url(), "time", clock, TimeSource::Server, &rules);
    let (a, b) = (node(&behind), node(&ahead));
    assert_eq!(a.outcomes(&post("/login").from(IP), 2).await, ["proceed", "429:login"]);
    for (name, node) in [("node B, a year ahead", &b), ("a node a year behind", &node(&behind))] {
        let (outcome, retry) = answer(node, &get("/").from(IP)).await;
        assert_eq!(outcome, "429:login", "{name}");
        assert!(retry > Duration::ZERO && retry <= secs(60), "{name}: held {retry:?}, not the rest of 60 s");
    }
}

/// Redis failing while a node writes its hold: the node holds the key on its own (its table),
/// as before holds were shared, and answers without an error; the hold is not in Redis (a node
/// that did not see it go over decides by the limit).
#[tokio::test]
async fn a_hold_redis_cannot_take_still_holds_on_its_node() {
    let mut server = RedisServer::start();
    let clock = clock();
    let a = redis_node(&server.url(), "outage", &clock);
    server.kill();
    // Both decided by the failure policy on A's own counts; the hold's write fails.
    assert_eq!(a.outcomes(&post("/login").from(IP), 2).await, ["proceed", "429:login"]);
    a.advance(secs(2));
    assert_eq!(answer(&a, &get("/").from(IP)).await, ("429:login".into(), secs(58)), "A holds the IP");
    assert_eq!(answer(&a, &post("/login").from(IP)).await, ("429:login".into(), secs(58)), "past login's window");
    server.restart();
    let b = redis_node(&server.url(), "outage", &clock);
    assert_eq!(b.outcome(&get("/").from(IP)).await, "proceed", "Redis never took the hold");
    assert_eq!(answer(&a, &get("/").from(IP)).await.0, "429:login", "A still holds it");
}

/// A rule's holds live under its name, as its counts do: across a reload that keeps the name,
/// every node (one started after the reload too) still holds the key; a rule renamed or removed
/// holds nothing any more, on any node (its old holds, unread, expire).
#[tokio::test]
async fn a_reload_keeps_a_rules_holds_under_its_name_alone() {
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = |rules: &str| build(store.clone(), clock.clone(), rules, true);
    let (a, b) = (node(RULES), node(RULES));
    assert_eq!(a.outcomes(&post("/login").from(IP), 2).await, ["proceed", "429:login"]);
    assert_eq!(b.outcome(&get("/").from(IP)).await, "429:login");
    // The same name, another limit: still held everywhere.
    let wider = RULES.replacen("limit = \"1/1s\"", "limit = \"5/1s\"", 1);
    let parse = |text: &str| tollgate_rules::Rules::parse(text, "test").unwrap();
    a.engine.reload(parse(&wider));
    b.engine.reload(parse(&wider));
    a.advance(secs(2));
    for (name, node) in [("A", &a), ("B", &b), ("a node started after", &node(&wider))] {
        assert_eq!(answer(node, &get("/").from(IP)).await, ("429:login".into(), secs(58)), "{name}");
    }
    // Renamed: the hold stays with the old name, which nothing asks.
    let renamed = RULES.replacen("name = \"login\"", "name = \"signin\"", 1);
    a.engine.reload(parse(&renamed));
    b.engine.reload(parse(&renamed));
    for (name, node) in [("A", &a), ("B", &b), ("a node started after", &node(&renamed))] {
        assert_eq!(node.outcome(&get("/").from(IP)).await, "proceed", "{name}");
    }
    // Removed: nothing holds the IP.
    let removed = RULES.split("[[rules]]").nth(2).map(|trial| format!("[[rules]]{trial}")).unwrap();
    a.engine.reload(parse(&removed));
    assert_eq!(a.outcome(&get("/").from(IP)).await, "proceed");
}

/// A hold keeps the end it was given: a reload shortening the rule's `timeout` (an hour to a
/// minute) shortens the holds made from then on, not those in force, on any node (as a count
/// keeps what it counted); renaming the rule lifts them all at once.
#[tokio::test]
async fn a_reload_shortening_the_timeout_keeps_the_holds_in_force() {
    let hour = RULES.replacen("timeout = \"60s\"", "timeout = \"1h\"", 1);
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = |rules: &str| build(store.clone(), clock.clone(), rules, true);
    let a = node(&hour);
    assert_eq!(a.outcomes(&post("/login").from(IP), 2).await, ["proceed", "429:login"]);
    a.engine.reload(tollgate_rules::Rules::parse(RULES, "test").unwrap());
    a.advance(secs(120));
    for (name, node) in [("A", &a), ("a node started after", &node(RULES))] {
        assert_eq!(answer(node, &get("/").from(IP)).await, ("429:login".into(), secs(3_480)), "{name}");
    }
    let other = "198.51.100.8";
    assert_eq!(a.outcomes(&post("/login").from(other), 2).await, ["proceed", "429:login"]);
    assert_eq!(answer(&node(RULES), &get("/").from(other)).await, ("429:login".into(), secs(60)), "held anew: 60 s");
}

/// A rule on trial promoted by a reload (`dry-run` to `reject`): the holds it recorded on trial,
/// which never left their node, deny nothing there either, so the fleet still holds as one: every
/// node decides the key by the limit and the store's holds.
#[tokio::test]
async fn a_dry_run_hold_denies_nothing_once_its_rule_enforces() {
    let clock = clock();
    let store = Arc::new(memory(&clock));
    let node = || build(store.clone(), clock.clone(), RULES, true);
    let (a, b) = (node(), node());
    let trial = post("/trial").from(IP);
    assert_eq!(a.outcomes(&trial, 2).await, ["proceed", "proceed"]);
    assert_eq!(a.counted("trial", "dry_run"), 1, "node A would have held the IP 60 s");
    let enforced = tollgate_rules::Rules::parse(&RULES.replacen("action = \"dry-run\"\n", "", 1), "test").unwrap();
    a.engine.reload(enforced.clone());
    b.engine.reload(enforced);
    // A second on, in windows of their own: the limit admits, nothing holds the IP.
    for (name, node) in [("node A", &a), ("node B", &b)] {
        node.advance(secs(1));
        assert_eq!(node.outcome(&trial).await, "proceed", "{name}");
    }
    assert_eq!(a.outcome(&trial).await, "429:trial", "over again: held, enforced");
    assert_eq!(b.outcome(&get("/trial").from(IP)).await, "429:trial", "and on node B");
}
